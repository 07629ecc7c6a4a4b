package ifacemgr

// Following the node's interfaces: netlink events, periodic listing, and
// verification that each attachment is still in place.

import (
	"context"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func (m *Manager) defaultRouteIfaces() map[string]bool {
	out := map[string]bool{}
	routes, err := m.nl.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return out
	}
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask) {
			if l, err := m.nl.LinkByIndex(r.LinkIndex); err == nil {
				out[l.Attrs().Name] = true
			}
		}
	}
	return out
}

func isZeroMask(mask []byte) bool {
	for _, b := range mask {
		if b != 0 {
			return false
		}
	}
	return true
}

// Resync lists every interface and marks what changed dirty: new, renamed,
// up/down and vanished interfaces.
func (m *Manager) Resync() error {
	links, err := m.nl.LinkList()
	if err != nil {
		return fmt.Errorf("ifacemgr: list links: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[int]bool{}
	for _, l := range links {
		a := l.Attrs()
		seen[a.Index] = true
		m.update(a.Index, a.Name, a.Flags&1 != 0 /* net.FlagUp */, noL2(a), false)
	}
	for idx, st := range m.ifaces {
		if !seen[idx] && !st.gone {
			m.update(idx, st.name, false, st.noL2, true)
		}
	}
	return nil
}

// update records an interface's state; a change marks it dirty. Call with mu held.
func (m *Manager) update(index int, name string, up, l3 bool, gone bool) {
	st, ok := m.ifaces[index]
	if !ok {
		st = &ifaceState{index: index, hooks: map[Hook]bool{}}
		m.ifaces[index] = st
	} else if st.name == name && st.up == up && st.noL2 == l3 && st.gone == gone {
		return
	}
	if ok && st.name != name && len(st.hooks) > 0 && st.prevName == "" {
		st.prevName = st.name // its pins carry the old name
	}
	st.name, st.up, st.noL2, st.gone = name, up, l3, gone
	m.dirty[index] = true
}

// LinkChanged records a netlink link update (from a subscription).
func (m *Manager) LinkChanged(a *netlink.LinkAttrs, gone bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.update(a.Index, a.Name, a.Flags&1 != 0 /* net.FlagUp */, noL2(a), gone)
}

// noL2 tells whether a device's packets start with the IP header: its link
// type (ARPHRD_*) is not Ethernet, as for ipip, WireGuard and TUN devices.
func noL2(a *netlink.LinkAttrs) bool {
	return a.EncapType != "" && a.EncapType != "ether"
}

// verifyAttachments marks dirty every ready interface whose attachment is
// gone or runs another program than the manager's (a link pin removed
// behind its back detaches the hook), so the next Apply repairs it.
func (m *Manager) verifyAttachments() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for idx, st := range m.ifaces {
		if !st.ready || st.gone {
			continue
		}
		want, err := m.hooksFor(st)
		if err != nil {
			continue
		}
		for hook := range st.hooks {
			if prog := want[hook]; prog != nil && !m.att.attached(st.name, st.index, hook, prog) {
				m.log.Warn("attachment missing or replaced; repairing", "iface", st.name, "hook", hook)
				if m.opts.OnRepair != nil {
					m.opts.OnRepair(st.name, hook)
				}
				m.dirty[idx] = true
				st.ready = false
				break
			}
		}
	}
}

// Run follows netlink link and route updates, resyncs periodically and
// applies until ctx ends.
func (m *Manager) Run(ctx context.Context) error {
	h, err := m.nsHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	linkCh := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	lost := func(err error) {
		m.routing.Add(1)
		m.log.Warn("netlink events lost; routing is taken to have changed", "err", err)
	}
	if err := netlink.LinkSubscribeWithOptions(linkCh, done, netlink.LinkSubscribeOptions{Namespace: &h, ErrorCallback: lost}); err != nil {
		return fmt.Errorf("ifacemgr: subscribe to links: %w", err)
	}
	// Routes only move the routing generation (RoutingGeneration): a
	// route that changes is where a pod's address may now lead.
	routeCh := make(chan netlink.RouteUpdate, 64)
	if err := netlink.RouteSubscribeWithOptions(routeCh, done, netlink.RouteSubscribeOptions{Namespace: &h, ErrorCallback: lost}); err != nil {
		return fmt.Errorf("ifacemgr: subscribe to routes: %w", err)
	}
	m.routing.Add(1) // followed from now on
	if _, err := m.CleanupStale(); err != nil {
		m.log.Warn("clean-up of stale pins failed", "err", err)
	}
	resync := time.NewTicker(m.opts.ResyncInterval)
	defer resync.Stop()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case u, ok := <-linkCh:
			m.routing.Add(1)
			if !ok { // the subscription ended (its error was reported): resyncs only
				m.log.Warn("link events ended; interfaces are followed by resyncs only")
				linkCh = nil
				continue
			}
			m.LinkChanged(u.Attrs(), u.Header.Type == 17 /* RTM_DELLINK */)
		case _, ok := <-routeCh:
			m.routing.Add(1)
			if !ok {
				m.log.Warn("route events ended; routing changes are noticed at resyncs only")
				routeCh = nil
			}
			continue // nothing to apply
		case <-resync.C:
			m.routing.Add(1)
			if err := m.Resync(); err != nil {
				m.log.Warn("resync failed", "err", err)
			}
			// Check every attachment, not only what netlink reported: a
			// removed link pin detaches its program without any event.
			m.verifyAttachments()
			if _, err := m.CleanupStale(); err != nil {
				m.log.Warn("clean-up of stale pins failed", "err", err)
			}
		case <-retry.C:
		}
		if res := m.Apply(); len(res.Failed) > 0 {
			retry.Reset(m.opts.RetryBase)
		}
	}
}

func (m *Manager) nsHandle() (netns.NsHandle, error) {
	if m.opts.Netns == "" {
		return netns.Get()
	}
	return netns.GetFromPath(m.opts.Netns)
}
