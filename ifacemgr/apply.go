package ifacemgr

// Bringing each dirty interface to its wanted state: programs attached,
// policy slots asked for, interface state written.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	slmaps "github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/netlab"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
)

// hooksFor returns the programs an interface gets, by its class and link
// layer. A device without an Ethernet header gets the L3 builds of the host
// programs and no XDP (the prefilter parses Ethernet); a workload interface
// without one is refused.
func (m *Manager) hooksFor(st *ifaceState) (map[Hook]*ebpf.Program, error) {
	p := m.opts.Programs
	if st.noL2 {
		switch {
		case st.class == Workload:
			return nil, fmt.Errorf("workload interface without an Ethernet header is not supported")
		case p.FromHostL3 == nil || p.ToHostL3 == nil:
			return nil, fmt.Errorf("no programs for devices without an Ethernet header")
		}
		return map[Hook]*ebpf.Program{Ingress: p.FromHostL3, Egress: p.ToHostL3}, nil
	}
	switch st.class {
	case Workload:
		return map[Hook]*ebpf.Program{Ingress: p.FromWorkload, Egress: p.ToWorkload}, nil
	case Data:
		h := map[Hook]*ebpf.Program{Ingress: p.FromHost, Egress: p.ToHost}
		if p.XDP != nil {
			h[XDP] = p.XDP
		}
		return h, nil
	case L3:
		return map[Hook]*ebpf.Program{Ingress: p.FromHost, Egress: p.ToHost}, nil
	}
	return nil, nil
}

// Apply reconciles the dirty interfaces whose retry time has come. An
// interface that fails stays dirty and is retried with exponential backoff.
func (m *Manager) Apply() ApplyResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	res := ApplyResult{Failed: map[string]error{}}
	now := m.now()
	for idx := range m.dirty {
		st := m.ifaces[idx]
		if now.Before(st.retryAt) {
			res.Failed[st.name] = st.err
			continue
		}
		err := m.apply(st, &res)
		if err == nil {
			delete(m.dirty, idx)
			st.err, st.failures, st.retryAt = nil, 0, time.Time{}
			if st.gone {
				delete(m.ifaces, idx)
			}
			continue
		}
		st.err = err
		st.failures++
		st.retryAt = now.Add(min(m.opts.RetryBase<<min(st.failures-1, 20), m.opts.RetryMax))
		res.Failed[st.name] = err
		m.log.Warn("interface not ready; will retry", "iface", st.name, "err", err, "retry", st.retryAt.Sub(now))
	}
	for _, st := range m.ifaces {
		if st.ready {
			res.Ready = append(res.Ready, st.name)
		}
	}
	slices.Sort(res.Ready)
	return res
}

// apply brings one interface to its wanted state. Call with mu held.
func (m *Manager) apply(st *ifaceState, res *ApplyResult) error {
	if st.prevName != "" {
		// Renamed: its pins carry the old name; detach under it first.
		if err := m.detachAll(st, st.prevName, res); err != nil {
			return err
		}
		st.prevName = ""
	}
	st.class = Ignored
	if !st.gone {
		st.class = m.opts.Classifier.Classify(st.name)
	}
	if st.class == Ignored {
		if err := m.detachAll(st, st.name, res); err != nil {
			return err
		}
		if st.gone {
			res.Removed++
		}
		st.ready = false
		return m.forget(st)
	}
	want, err := m.hooksFor(st)
	if err != nil {
		st.ready = false
		return fmt.Errorf("interface %s: %w", st.name, err)
	}
	err = netlab.Enter(m.opts.Netns, func() error {
		// TC first: an XDP program the driver refuses (driver mode only)
		// leaves the interface not ready, but translated.
		for _, hook := range []Hook{Ingress, Egress, XDP} {
			prog, ok := want[hook]
			if !ok {
				continue
			}
			if prog == nil {
				return fmt.Errorf("no program for %s hook of %s interfaces", hook, st.class)
			}
			changed, err := m.att.ensure(st.name, st.index, hook, prog, st.replace)
			if err != nil {
				return err
			}
			st.hooks[hook] = true
			if changed {
				res.Attached++
			}
		}
		for hook := range st.hooks {
			if want[hook] == nil {
				if err := m.att.detach(st.name, st.index, hook); err != nil {
					return err
				}
				delete(st.hooks, hook)
				res.Detached++
			}
		}
		st.xdpMode = ""
		if st.hooks[XDP] {
			st.xdpMode = xdpModeOf(m.nl, st.index)
		}
		m.warnVethAcceleration(st)
		// In the namespace: a devmap resolves the ifindex when written.
		if err := m.writeXDPDevice(st); err != nil {
			return err
		}
		if m.opts.Sysctls {
			return setSysctls(m.opts.ProcSysNet, st.name, st.class)
		}
		return nil
	})
	if err != nil {
		st.ready = false
		return fmt.Errorf("interface %s: %w", st.name, err)
	}
	st.replace = false
	ingress, egress := uint32(NoPolicy), uint32(NoPolicy)
	ep, bound := m.eps.endpointFor(st.name, st.class)
	st.endpoint = ep.ID
	if m.opts.Policies != nil {
		var epp *Endpoint
		if bound {
			epp = &ep
		}
		if ingress, egress, err = m.opts.Policies.Install(st.name, st.index, epp); err != nil {
			return fmt.Errorf("interface %s: policy: %w", st.name, err)
		}
	}
	st.ready = true
	return m.writeIfState(st, ingress, egress)
}

func (m *Manager) detachAll(st *ifaceState, name string, res *ApplyResult) error {
	return netlab.Enter(m.opts.Netns, func() error {
		var errs []error
		for hook := range st.hooks {
			if err := m.att.detach(name, st.index, hook); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(st.hooks, hook)
			res.Detached++
		}
		if !st.hooks[XDP] {
			st.xdpMode = ""
			errs = append(errs, m.writeXDPDevice(st))
		}
		return errors.Join(errs...)
	})
}

// warnVethAcceleration says, once per interface, what a veth data interface
// needs when frames are sent from its XDP program (XDPDevices set: the
// acceleration runs): its peer drops them unless it runs an XDP program.
func (m *Manager) warnVethAcceleration(st *ifaceState) {
	if m.opts.XDPDevices == nil || st.xdpMode != XDPDriver || st.vethWarned {
		return
	}
	if l, err := m.nl.LinkByIndex(st.index); err == nil && l.Type() == "veth" {
		st.vethWarned = true
		m.log.Warn("a veth data interface runs the XDP acceleration in driver mode: its peer must run an XDP program "+
			"(any, XDP_PASS will do), or it drops the frames sent from XDP, and senders on this machine must not leave "+
			"checksums partial (transmit checksum offload off on the peer)", "iface", st.name)
	}
}

// writeXDPDevice adds the interface to XDPDevices while its XDP program runs
// in driver mode, and removes it otherwise. Call in the managed namespace.
func (m *Manager) writeXDPDevice(st *ifaceState) error {
	if m.opts.XDPDevices == nil {
		return nil
	}
	idx := uint32(st.index)
	if st.xdpMode == XDPDriver && !st.gone {
		if err := m.opts.XDPDevices.Put(idx, idx, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("add to the XDP redirect devices: %w", err)
		}
		return nil
	}
	if err := m.opts.XDPDevices.Delete(idx); err != nil && !errors.Is(err, slmaps.ErrKeyNotExist) {
		return fmt.Errorf("remove from the XDP redirect devices: %w", err)
	}
	return nil
}

func (m *Manager) writeIfState(st *ifaceState, ingress, egress uint32) error {
	if m.opts.IfState == nil {
		return nil
	}
	v := gen.SluiceIfstateValue{IngressPolicy: ingress, EgressPolicy: egress}
	switch st.class {
	case Workload:
		v.Flags = gen.SluiceIfstateFlagsIFS_WORKLOAD
	case Data:
		v.Flags = gen.SluiceIfstateFlagsIFS_DATA
	case L3:
		v.Flags = gen.SluiceIfstateFlagsIFS_L3
	}
	if st.ready {
		v.Flags |= gen.SluiceIfstateFlagsIFS_READY
	}
	switch st.xdpMode {
	case XDPDriver:
		v.Flags |= gen.SluiceIfstateFlagsIFS_XDP_DRIVER
	case XDPGeneric:
		v.Flags |= gen.SluiceIfstateFlagsIFS_XDP_GENERIC
	}
	if p := m.opts.LocalTrafficPrefix; p != "" && strings.HasPrefix(st.name, p) {
		v.Flags |= gen.SluiceIfstateFlagsIFS_LOCAL_TRAFFIC
	}
	gen.PutCString(v.Name[:], st.name)
	return m.opts.IfState.Put(gen.SluiceIfstateKey{Ifindex: uint32(st.index)}, v, ebpf.UpdateAny)
}

// forget removes an interface's state entry and policy. Call with mu held.
func (m *Manager) forget(st *ifaceState) error {
	if m.opts.Policies != nil {
		if err := m.opts.Policies.Remove(st.index); err != nil {
			return err
		}
	}
	if m.opts.IfState == nil {
		return nil
	}
	err := m.opts.IfState.Delete(gen.SluiceIfstateKey{Ifindex: uint32(st.index)})
	if err != nil && !errors.Is(err, slmaps.ErrKeyNotExist) {
		return err
	}
	return nil
}
