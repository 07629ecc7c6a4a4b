package ifacemgr

import (
	"context"
	"errors"
	"fmt"
	"github.com/sluice-net/sluice/policy"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	slmaps "github.com/sluice-net/sluice/maps"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Programs are the programs each class of interface gets.
type Programs struct {
	FromWorkload, ToWorkload *ebpf.Program // workload ingress, egress
	FromHost, ToHost         *ebpf.Program // data and L3 ingress, egress (Ethernet devices)
	// FromHostL3 and ToHostL3 replace FromHost and ToHost on devices whose
	// packets have no Ethernet header (ipip, WireGuard, TUN: link type not
	// ARPHRD_ETHER), whatever their class. Nil: such devices are refused,
	// never given programs that would misparse them.
	FromHostL3, ToHostL3 *ebpf.Program
	XDP                  *ebpf.Program // data interfaces; nil: none
}

// PolicyProvider is how the policy module plugs in: given an interface and the
// endpoint bound to it (nil: none), it installs the endpoint's policy programs
// and returns their program-array slots (gen IFSTATE_NO_POLICY for none).
type PolicyProvider interface {
	Install(ifname string, ifindex int, ep *Endpoint) (ingress, egress uint32, err error)
	Remove(ifindex int) error
}

// NoPolicy is the slot value meaning "no policy program".
const NoPolicy = policy.NoPolicy

// Options configures a Manager.
type Options struct {
	// Netns is the path of the network namespace whose interfaces are
	// managed ("" for the current one).
	Netns string
	// PinDir holds the link pins (a bpffs directory, e.g. /sys/fs/bpf/sluice/links).
	PinDir     string
	Classifier Classifier
	Programs   Programs
	// IfState is the interface-state map kept in step with attachments.
	IfState *slmaps.Map[gen.SluiceIfstateKey, gen.SluiceIfstateValue]
	// LegacyTC attaches with clsact + cls_bpf instead of TCX links (kernels
	// before 6.6; chosen automatically when TCX is not supported).
	LegacyTC bool
	// Sysctls sets the per-interface settings the datapath needs.
	Sysctls  bool
	Policies PolicyProvider
	// RetryBase and RetryMax bound the backoff of a failing interface
	// (defaults 100 ms and 30 s).
	RetryBase, RetryMax time.Duration
	// ResyncInterval is how often Run lists every interface and checks every
	// attachment, re-attaching what was removed behind its back (default 10 s).
	ResyncInterval time.Duration
	// LocalTrafficPrefix marks managed interfaces whose name starts with it
	// IFS_LOCAL_TRAFFIC: traffic entering them is the cluster's own
	// (kube-proxy's --detect-local-mode=InterfaceNamePrefix).
	LocalTrafficPrefix string
	// OnRepair, if set, hears of every attachment found missing or running
	// another program (then repaired), for metrics and health.
	OnRepair func(iface string, hook Hook)
	Logger   *slog.Logger
}

// Status is one managed interface as last applied.
type Status struct {
	Name     string
	Index    int
	Class    Class
	Up       bool
	Ready    bool
	Endpoint string
	Hooks    []Hook
	Err      error
}

// ApplyResult reports what one Apply did.
type ApplyResult struct {
	Ready    []string         // interfaces whose programs are all in place
	Failed   map[string]error // interfaces that failed (retried with backoff)
	Attached int              // hooks attached or replaced
	Detached int              // hooks detached
	Removed  int              // vanished interfaces cleaned up
}

type ifaceState struct {
	index    int
	name     string
	up       bool
	addrs    []netip.Addr
	gone     bool
	noL2     bool // packets start with the IP header (link type not Ethernet)
	class    Class
	prevName string // the name it was attached under, if renamed
	hooks    map[Hook]bool
	replace  bool // SetPrograms: move links to the new program instances
	ready    bool
	endpoint string
	err      error
	failures int
	retryAt  time.Time
}

// Manager keeps the right programs on the right interfaces.
type Manager struct {
	opts Options
	log  *slog.Logger
	ns   nsExec
	nl   *netlink.Handle
	att  *attacher

	mu     sync.Mutex
	ifaces map[int]*ifaceState
	dirty  map[int]bool
	eps    endpoints
	now    func() time.Time
}

// New opens a netlink handle in the namespace and reads its interfaces. It
// does not attach anything until Apply.
func New(opts Options) (*Manager, error) {
	if opts.RetryBase == 0 {
		opts.RetryBase = 100 * time.Millisecond
	}
	if opts.RetryMax == 0 {
		opts.RetryMax = 30 * time.Second
	}
	if opts.ResyncInterval == 0 {
		opts.ResyncInterval = 10 * time.Second
	}
	m := &Manager{opts: opts, log: opts.Logger, ns: nsExec{path: opts.Netns},
		ifaces: map[int]*ifaceState{}, dirty: map[int]bool{}, now: time.Now,
		eps: endpoints{workloads: map[string]WorkloadEndpoint{}, hosts: map[string]HostEndpoint{}}}
	if m.log == nil {
		m.log = slog.Default()
	}
	var err error
	if opts.Netns != "" {
		h, err := netns.GetFromPath(opts.Netns)
		if err != nil {
			return nil, fmt.Errorf("ifacemgr: netns %s: %w", opts.Netns, err)
		}
		defer h.Close()
		m.nl, err = netlink.NewHandleAt(h)
		if err != nil {
			return nil, fmt.Errorf("ifacemgr: netlink in %s: %w", opts.Netns, err)
		}
	} else if m.nl, err = netlink.NewHandle(); err != nil {
		return nil, fmt.Errorf("ifacemgr: netlink: %w", err)
	}
	if m.opts.Classifier.DataIfaces == nil && m.opts.Classifier.DefaultRouteIfaces == nil {
		m.opts.Classifier.DefaultRouteIfaces = m.defaultRouteIfaces
	}
	m.att = &attacher{dir: opts.PinDir, legacy: opts.LegacyTC, nl: m.nl}
	if err := m.Resync(); err != nil {
		m.nl.Close()
		return nil, err
	}
	return m, nil
}

// Close releases the netlink handle; attachments stay (pinned).
func (m *Manager) Close() { m.nl.Close() }

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

// Resync lists every interface and address and marks what changed dirty:
// new, renamed, up/down, re-addressed and vanished interfaces.
func (m *Manager) Resync() error {
	links, err := m.nl.LinkList()
	if err != nil {
		return fmt.Errorf("ifacemgr: list links: %w", err)
	}
	addrs, err := m.nl.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("ifacemgr: list addresses: %w", err)
	}
	byIndex := map[int][]netip.Addr{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			byIndex[a.LinkIndex] = append(byIndex[a.LinkIndex], ip)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[int]bool{}
	for _, l := range links {
		a := l.Attrs()
		seen[a.Index] = true
		m.update(a.Index, a.Name, a.Flags&1 != 0 /* net.FlagUp */, noL2(a), byIndex[a.Index], false)
	}
	for idx, st := range m.ifaces {
		if !seen[idx] && !st.gone {
			m.update(idx, st.name, false, st.noL2, nil, true)
		}
	}
	return nil
}

// update records an interface's state; a change marks it dirty. Call with mu held.
func (m *Manager) update(index int, name string, up, l3 bool, addrs []netip.Addr, gone bool) {
	slices.SortFunc(addrs, func(a, b netip.Addr) int { return a.Compare(b) })
	st, ok := m.ifaces[index]
	if !ok {
		st = &ifaceState{index: index, hooks: map[Hook]bool{}}
		m.ifaces[index] = st
	} else if st.name == name && st.up == up && st.noL2 == l3 && st.gone == gone && slices.Equal(st.addrs, addrs) {
		return
	}
	if ok && st.name != name && len(st.hooks) > 0 && st.prevName == "" {
		st.prevName = st.name // its pins carry the old name
	}
	st.name, st.up, st.noL2, st.addrs, st.gone = name, up, l3, addrs, gone
	m.dirty[index] = true
}

// LinkChanged records a netlink link update (from a subscription).
func (m *Manager) LinkChanged(a *netlink.LinkAttrs, gone bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var addrs []netip.Addr
	if st, ok := m.ifaces[a.Index]; ok {
		addrs = st.addrs
	}
	m.update(a.Index, a.Name, a.Flags&1 != 0 /* net.FlagUp */, noL2(a), addrs, gone)
}

// noL2 tells whether a device's packets start with the IP header: its link
// type (ARPHRD_*) is not Ethernet, as for ipip, WireGuard and TUN devices.
func noL2(a *netlink.LinkAttrs) bool {
	return a.EncapType != "" && a.EncapType != "ether"
}

// SetPrograms swaps the programs (an upgrade): every managed interface is
// updated in place at the next Apply, without a moment without a program.
func (m *Manager) SetPrograms(p Programs) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.opts.Programs = p
	for idx, st := range m.ifaces {
		m.dirty[idx] = true
		st.replace = true
	}
}

// SetWorkloadEndpoint adds or replaces a workload endpoint.
func (m *Manager) SetWorkloadEndpoint(ep WorkloadEndpoint) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.eps.workloads[ep.ID]; ok {
		m.markByName(old.Iface)
	}
	m.eps.workloads[ep.ID] = ep
	m.markByName(ep.Iface)
}

// RemoveWorkloadEndpoint removes one; a shadowed endpoint of the same
// interface takes over.
func (m *Manager) RemoveWorkloadEndpoint(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.eps.workloads[id]; ok {
		delete(m.eps.workloads, id)
		m.markByName(old.Iface)
	}
}

// SetHostEndpoint adds or replaces a host endpoint.
func (m *Manager) SetHostEndpoint(ep HostEndpoint) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.eps.hosts[ep.ID] = ep
	m.markAll()
}

// RemoveHostEndpoint removes one.
func (m *Manager) RemoveHostEndpoint(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.eps.hosts, id)
	m.markAll()
}

func (m *Manager) markByName(name string) {
	for idx, st := range m.ifaces {
		if st.name == name {
			m.dirty[idx] = true
		}
	}
}

// PoliciesChanged marks every interface dirty, so the next Apply asks the
// PolicyProvider again for each: a provider that kept interfaces' slots as
// they were until it knew the policies (after a restart) calls it then.
func (m *Manager) PoliciesChanged() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.markAll()
}

func (m *Manager) markAll() {
	for idx := range m.ifaces {
		m.dirty[idx] = true
	}
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
	err = m.ns.do(func() error {
		for hook, prog := range want {
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
		if m.opts.Sysctls {
			return setSysctls(st.name, st.class)
		}
		return nil
	})
	if err != nil {
		st.ready = false
		return fmt.Errorf("interface %s: %w", st.name, err)
	}
	st.replace = false
	ingress, egress := uint32(NoPolicy), uint32(NoPolicy)
	ep, bound := m.eps.endpointFor(st.name, st.addrs, st.class)
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
	return m.ns.do(func() error {
		var errs []error
		for hook := range st.hooks {
			if err := m.att.detach(name, st.index, hook); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(st.hooks, hook)
			res.Detached++
		}
		return errors.Join(errs...)
	})
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
	if p := m.opts.LocalTrafficPrefix; p != "" && strings.HasPrefix(st.name, p) {
		v.Flags |= gen.SluiceIfstateFlagsIFS_LOCAL_TRAFFIC
	}
	for i := 0; i < len(st.name) && i < len(v.Name)-1; i++ {
		v.Name[i] = int8(st.name[i])
	}
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

// CleanupStale removes what belongs to interfaces that no longer exist:
// pins whose interface (by index and name) is gone, and interface-state
// entries of vanished ifindexes. It runs at start and periodically.
func (m *Manager) CleanupStale() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	pins, err := m.att.listPins()
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, p := range pins {
		st, ok := m.ifaces[p.ifindex]
		if ok && !st.gone && st.name == p.ifname {
			continue
		}
		if err := unpinLink(p.path); err != nil {
			return removed, err
		}
		removed++
	}
	if m.opts.IfState != nil {
		var stale []gen.SluiceIfstateKey
		err := m.opts.IfState.Iterate(func(k gen.SluiceIfstateKey, _ gen.SluiceIfstateValue) bool {
			if st, ok := m.ifaces[int(k.Ifindex)]; !ok || st.gone {
				stale = append(stale, k)
			}
			return true
		})
		if err != nil {
			return removed, err
		}
		for _, k := range stale {
			if err := m.opts.IfState.Delete(k); err != nil && !errors.Is(err, slmaps.ErrKeyNotExist) {
				return removed, err
			}
			removed++
		}
	}
	return removed, nil
}

// Cleanup removes everything the manager put on the machine: every attached
// program (its own only), every pin, every interface-state entry.
func (m *Manager) Cleanup() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	res := &ApplyResult{}
	for _, st := range m.ifaces {
		errs = append(errs, m.detachAll(st, st.name, res))
		if st.class != Ignored {
			errs = append(errs, m.forget(st))
		}
		st.ready = false
	}
	pins, err := m.att.listPins()
	errs = append(errs, err)
	for _, p := range pins {
		errs = append(errs, unpinLink(p.path))
	}
	if m.opts.IfState != nil {
		// Entries a previous run wrote, whatever this manager knows.
		var keys []gen.SluiceIfstateKey
		errs = append(errs, m.opts.IfState.Iterate(func(k gen.SluiceIfstateKey, _ gen.SluiceIfstateValue) bool {
			keys = append(keys, k)
			return true
		}))
		for _, k := range keys {
			if err := m.opts.IfState.Delete(k); err != nil && !errors.Is(err, slmaps.ErrKeyNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Statuses lists the managed interfaces.
func (m *Manager) Statuses() []Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Status
	for _, st := range m.ifaces {
		if st.class == Ignored || st.gone {
			continue
		}
		out = append(out, Status{Name: st.name, Index: st.index, Class: st.class, Up: st.up, Ready: st.ready,
			Endpoint: st.endpoint, Hooks: slices.Sorted(maps.Keys(st.hooks)), Err: st.err})
	}
	slices.SortFunc(out, func(a, b Status) int { return a.Index - b.Index })
	return out
}

// Run follows netlink link and address updates, resyncs periodically and
// applies until ctx ends.
func (m *Manager) Run(ctx context.Context) error {
	h, err := m.nsHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	linkCh := make(chan netlink.LinkUpdate, 64)
	addrCh := make(chan netlink.AddrUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.LinkSubscribeWithOptions(linkCh, done, netlink.LinkSubscribeOptions{Namespace: &h}); err != nil {
		return fmt.Errorf("ifacemgr: subscribe to links: %w", err)
	}
	if err := netlink.AddrSubscribeWithOptions(addrCh, done, netlink.AddrSubscribeOptions{Namespace: &h}); err != nil {
		return fmt.Errorf("ifacemgr: subscribe to addresses: %w", err)
	}
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
		case u := <-linkCh:
			a := u.Attrs()
			m.LinkChanged(a, u.Header.Type == 17 /* RTM_DELLINK */)
		case <-addrCh:
			if err := m.Resync(); err != nil {
				m.log.Warn("resync failed", "err", err)
			}
		case <-resync.C:
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
