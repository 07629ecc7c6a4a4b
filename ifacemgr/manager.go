package ifacemgr

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
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
const NoPolicy = gen.IfstateNoPolicy

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
	Sysctls bool
	// ProcSysNet is where the managed namespace's net sysctls are read and
	// written (default /proc/sys/net). A container's own /proc/sys is
	// read-only; a DaemonSet mounts the node's /proc/sys/net elsewhere, as
	// Cilium's does at /host/proc/sys/net.
	ProcSysNet string
	Policies   PolicyProvider
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
	// XDPDriverOnly refuses generic-mode XDP: a data interface whose driver
	// cannot run the XDP program fails (and is retried) rather than running
	// it in the stack, where it gains nothing (--xdp-acceleration=native).
	XDPDriverOnly bool
	// XDPDevices, if set, holds every data interface whose XDP program runs
	// in driver mode (ifindex -> ifindex, maps.XDPDevices): the interfaces
	// the XDP acceleration may redirect a frame to. Generic-mode ones stay
	// out: a driver-mode redirect to a device without XDP support drops the
	// frame, so such a frame goes on through TC instead.
	XDPDevices *slmaps.Map[uint32, uint32]
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
	XDPMode  XDPMode // how its XDP program runs; "" for none
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
	gone     bool
	noL2     bool // packets start with the IP header (link type not Ethernet)
	class    Class
	prevName string // the name it was attached under, if renamed
	hooks    map[Hook]bool
	xdpMode  XDPMode
	// vethWarned: the warning about accelerating a veth was logged.
	vethWarned bool
	replace    bool // SetPrograms: move links to the new program instances
	ready      bool
	endpoint   string
	err        error
	failures   int
	retryAt    time.Time
}

// Manager keeps the right programs on the right interfaces.
type Manager struct {
	opts Options
	log  *slog.Logger
	nl   *netlink.Handle
	att  *attacher

	mu     sync.Mutex
	ifaces map[int]*ifaceState
	dirty  map[int]bool
	eps    endpoints
	now    func() time.Time

	// routing counts what may have moved a pod's address to another
	// interface: link and route events, lost events, resyncs (Run).
	routing atomic.Uint64
}

// RoutingGeneration changes whenever the node's links or routes may have
// changed: at each link or route event Run follows, when events may have
// been lost, and at every resync (so at least every ResyncInterval). It is
// 0 until Run follows them: then nothing can be known to stand. What a
// caller derived from the routes (which interface a pod's address is
// routed through) holds while it returns the same.
func (m *Manager) RoutingGeneration() uint64 { return m.routing.Load() }

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
	m := &Manager{opts: opts, log: opts.Logger,
		ifaces: map[int]*ifaceState{}, dirty: map[int]bool{}, now: time.Now,
		eps: endpoints{workloads: map[string]WorkloadEndpoint{}}}
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
	m.att = &attacher{dir: opts.PinDir, legacy: opts.LegacyTC, nl: m.nl, xdpDriverOnly: opts.XDPDriverOnly}
	if err := m.Resync(); err != nil {
		m.nl.Close()
		return nil, err
	}
	return m, nil
}

// Close releases the netlink handle; attachments stay (pinned).
func (m *Manager) Close() { m.nl.Close() }

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
			Endpoint: st.endpoint, Hooks: slices.Sorted(maps.Keys(st.hooks)), XDPMode: st.xdpMode, Err: st.err})
	}
	slices.SortFunc(out, func(a, b Status) int { return a.Index - b.Index })
	return out
}
