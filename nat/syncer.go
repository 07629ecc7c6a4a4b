package nat

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// Options configures a Syncer.
type Options struct {
	// Maps are the pinned maps to program (frontends, backends, source ranges,
	// affinity, host IPs).
	Maps *maps.Set
	// Routes enables the internalTrafficPolicy Local NodePort expansion; nil
	// disables it (the wildcard NodePort entry is programmed instead).
	Routes RouteLookup
	// Trigger is called (from RoutesChanged) when routes resolve endpoints an
	// earlier Apply could not place, so the caller schedules another Apply.
	Trigger func()
	// Clock returns the kernel's monotonic time, the clock the datapath stamps
	// affinity entries with. Nil: CLOCK_MONOTONIC.
	Clock  func() time.Duration
	Logger *slog.Logger
	// Maglev, when not nil, makes frontends pick backends by Maglev
	// consistent hashing (see MaglevOptions); nil picks at random.
	Maglev *MaglevOptions
}

// State is everything to program: every service port with its endpoints, and
// this node.
//
// Like objects from an informer cache, a *ServicePort and an endpoint slice are
// immutable once passed to Apply: a caller that changes a service or its
// endpoints passes a new pointer or slice. Apply skips a service whose pointers
// are the ones it saw last time without looking further, which is what keeps an
// Apply of 10,000 services with one change well under a millisecond; when the
// pointers differ it compares contents, so rebuilding the whole State each time
// is correct too, only slower.
type State struct {
	Node      Node
	Services  map[ServicePortName]*ServicePort
	Endpoints map[ServicePortName][]Endpoint
	// ServiceCIDRs are the cluster's service ranges (ServiceCIDR objects):
	// a new flow to one of their addresses that no Service holds is
	// dropped, as kube-proxy nftables drops it. Every ClusterIP is known
	// to the datapath besides, ranges or not: a flow to one of its ports
	// that no Service defines is rejected. Nil means not known yet (the
	// source has not listed them): the ranges the datapath holds stay as
	// they are, across a restart too, so that they are not deleted and
	// rewritten while a restarted agent waits for the list. Empty and
	// not nil means none.
	ServiceCIDRs []netip.Prefix
	// Changed, when not nil, names every service port added, removed or
	// changed (service or endpoints) since the previous Apply, as a change
	// tracker knows them; Apply then looks at nothing else, so its cost follows
	// the changes, not the number of services. Nil: Apply compares everything.
	// The first Apply and an Apply with a changed Node always compare
	// everything.
	Changed map[ServicePortName]bool
}

// StaleBackend is a UDP backend that left a service: conntrack entries of the
// service (ServiceID) that NAT to Backend should be flushed.
type StaleBackend struct {
	ServiceID uint32
	Backend   netip.AddrPort
}

// Stats reports what one Apply did.
type Stats struct {
	// Services programmed after this Apply.
	Services int
	// Writes and Deletes count map operations.
	Writes, Deletes int
	// AffinityDeleted counts stale session-affinity entries removed.
	AffinityDeleted int
	// Errors lists services that could not be programmed (each names the
	// service); the others were programmed.
	Errors []error
	// FullMaps names maps that refused an update because they are full.
	FullMaps []string
	// Degraded lists what works in a lesser way than asked, every packet
	// still served: a Maglev table that could not be written leaves its
	// service picking at random (or from its older table). Retried by each
	// Apply.
	Degraded []error
	// StaleUDP lists UDP backends removed from services, for conntrack flushing.
	StaleUDP []StaleBackend
	// NodePortIPs are the host IPs NodePorts are programmed on.
	NodePortIPs []netip.Addr
	// MaglevTablesBuilt counts the Maglev tables built by this Apply: the
	// Services whose cluster backends changed (an unchanged table is
	// reused).
	MaglevTablesBuilt int
}

// Syncer programs the NAT maps from a State. Not safe for concurrent Apply;
// RoutesChanged may be called from any goroutine.
type Syncer struct {
	opts Options
	log  *slog.Logger

	// Both families' maps, in the planning layout (family.go).
	fe      *splitMap[gen.SluiceFe6Key, gen.SluiceFeValue, gen.SluiceFeKey, gen.SluiceFeValue]
	be      *splitMap[gen.SluiceBeKey, gen.SluiceBe6Value, gen.SluiceBeKey, gen.SluiceBeValue]
	src     *splitMap[gen.SluiceSrcrange6Key, gen.SluiceSrcrangeValue, gen.SluiceSrcrangeKey, gen.SluiceSrcrangeValue]
	hostIPs *splitMap[gen.SluiceHostip6Key, gen.SluiceHostipValue, gen.SluiceHostipKey, gen.SluiceHostipValue]
	names   *maps.CachingMap[gen.SluiceSvcnameKey, gen.SluiceSvcnameValue]
	svcnet  *maps.CachingMap[gen.SluiceSvcnetKey, gen.SluiceSvcnetValue]
	aff     *maps.Map[gen.SluiceAffKey, gen.SluiceAffValue]
	aff6    *maps.Map[gen.SluiceAff6Key, gen.SluiceAff6Value]

	mu          sync.Mutex
	loaded      bool
	generation  uint64 // counts full scans; marks the plans a State still names
	nodeChanged bool   // during an Apply: the node's addresses changed
	node        Node
	services    map[ServicePortName]*plan
	replan      map[ServicePortName]bool // forced by routes arriving
	ids         *idAllocator
	feOwner     map[gen.SluiceFe6Key]ServicePortName
	// feWaiting: services that claim a frontend another one has; they are
	// planned again when it lets go.
	feWaiting map[gen.SluiceFe6Key]map[ServicePortName]bool
	ipRefs    map[netip.Addr]int
	// clusterIPRefs counts the service ports of each ClusterIP, and
	// serviceCIDRs are State.ServiceCIDRs: sl_svcnet_v1's contents (svcnet.go).
	clusterIPRefs map[netip.Addr]int
	serviceCIDRs  map[netip.Prefix]bool
	// affinityDirty: service ids whose backends changed while they use affinity.
	affinityDirty map[uint32]bool
	maglev        *maglevWriter // nil without Options.Maglev
}

// NewSyncer opens the typed maps of opts.Maps.
func NewSyncer(opts Options) (*Syncer, error) {
	if opts.Maps == nil {
		return nil, errors.New("nat syncer: no maps")
	}
	s := &Syncer{
		opts: opts, log: opts.Logger,
		services: map[ServicePortName]*plan{}, replan: map[ServicePortName]bool{},
		ids: newIDAllocator(), feOwner: map[gen.SluiceFe6Key]ServicePortName{},
		feWaiting: map[gen.SluiceFe6Key]map[ServicePortName]bool{},
		ipRefs:    map[netip.Addr]int{}, affinityDirty: map[uint32]bool{},
		clusterIPRefs: map[netip.Addr]int{}, serviceCIDRs: map[netip.Prefix]bool{},
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.opts.Clock == nil {
		s.opts.Clock = gen.Monotonic
	}
	fe, err := maps.Frontends.In(opts.Maps)
	if err != nil {
		return nil, err
	}
	fe6, err := maps.Frontends6.In(opts.Maps)
	if err != nil {
		return nil, err
	}
	be, err := maps.Backends.In(opts.Maps)
	if err != nil {
		return nil, err
	}
	be6, err := maps.Backends6.In(opts.Maps)
	if err != nil {
		return nil, err
	}
	src, err := maps.SrcRanges.In(opts.Maps)
	if err != nil {
		return nil, err
	}
	src6, err := maps.SrcRanges6.In(opts.Maps)
	if err != nil {
		return nil, err
	}
	hip, err := maps.HostIPs.In(opts.Maps)
	if err != nil {
		return nil, err
	}
	hip6, err := maps.HostIPs6.In(opts.Maps)
	if err != nil {
		return nil, err
	}
	if s.aff, err = maps.Affinity.In(opts.Maps); err != nil {
		return nil, err
	}
	if s.aff6, err = maps.Affinity6.In(opts.Maps); err != nil {
		return nil, err
	}
	names, err := maps.SvcNames.In(opts.Maps)
	if err != nil {
		return nil, err
	}
	s.names = maps.NewCachingMap(names)
	svcnet, err := maps.ServiceNets.In(opts.Maps)
	if err != nil {
		return nil, err
	}
	s.svcnet = maps.NewCachingMap(svcnet)
	s.fe, s.be = newFrontendMap(fe, fe6), newBackendMap(be, be6)
	s.src, s.hostIPs = newSrcRangeMap(src, src6), newHostIPMap(hip, hip6)
	if opts.Maglev != nil {
		if s.maglev, err = newMaglevWriter(opts.Maglev); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Apply programs the maps for st. Services whose inputs did not change since the
// last Apply are not looked at again and cost no map operation; after a restart
// the first Apply reads the maps back and reuses the ids of services it finds,
// so an unchanged state writes nothing.
//
// A service that cannot be programmed is reported in Stats.Errors and keeps
// what it had; the others are programmed. A full map fails the Apply with an
// error naming the map; frontends are then not updated, so every service that
// was programmed keeps working.
func (s *Syncer) Apply(st State) (Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var stats Stats
	first := !s.loaded
	if first {
		if err := s.load(); err != nil {
			return stats, err
		}
	}
	nodeChanged := !s.node.equal(&st.Node)
	topologyChanged := s.node.Name != st.Node.Name || s.node.Zone != st.Node.Zone
	s.nodeChanged = nodeChanged
	s.node = st.Node
	s.node.NodePortIPs = slices.Clone(st.Node.NodePortIPs)
	pl := &planner{node: &s.node, routes: s.opts.Routes, idFor: s.idFor, prev: s.currentBackends, maglev: s.opts.Maglev}
	if s.maglev != nil {
		pl.maglevTable = s.maglev.table
	}

	if first {
		s.adoptIDs(st.Services)
	}
	if st.Changed != nil && !first && !nodeChanged {
		// The caller's change tracker says what changed: look at nothing else.
		for name := range st.Changed {
			s.syncOne(pl, name, st, true, &stats)
		}
	} else {
		s.generation++
		for name := range st.Services {
			s.syncOne(pl, name, st, topologyChanged, &stats)
		}
		for name, old := range s.services {
			if old.generation != s.generation {
				s.install(name, old, nil, &stats)
			}
		}
	}
	// Services planned again because a frontend they claim changed hands
	// (a few rounds: each round settles the claims the previous one moved).
	for round := 0; round < 3 && len(s.replan) > 0; round++ {
		names := make([]ServicePortName, 0, len(s.replan))
		for name := range s.replan {
			names = append(names, name)
		}
		for _, name := range names {
			if _, present := st.Services[name]; present || s.services[name] != nil {
				s.syncOne(pl, name, st, true, &stats)
			}
			delete(s.replan, name)
		}
	}
	s.setHostIPs(st.Node.NodePortIPs)
	s.setServiceCIDRs(st.ServiceCIDRs)
	stats.NodePortIPs = slices.Clone(st.Node.NodePortIPs)
	if s.maglev != nil {
		stats.MaglevTablesBuilt = s.maglev.builds
		s.maglev.builds = 0
	}

	err := s.write(&stats)
	stats.Services = len(s.services)
	if err == nil && len(s.affinityDirty) > 0 {
		n, aerr := s.cleanAffinity(false)
		stats.AffinityDeleted += n
		stats.Deletes += n
		err = aerr
	}
	s.ids.releasePending()
	return stats, err
}

// syncOne brings one service port's desired entries up to date with st.
// force skips the unchanged check (the caller knows it changed).
func (s *Syncer) syncOne(pl *planner, name ServicePortName, st State, force bool, stats *Stats) {
	svc, present := st.Services[name]
	old := s.services[name]
	if !present {
		if old != nil {
			s.install(name, old, nil, stats)
		}
		return
	}
	eps := st.Endpoints[name]
	if old != nil {
		old.generation = s.generation
		// Any service depends on the node's addresses (a ClusterIP may not
		// be one of them); NodePorts and source ranges on more of the node.
		if !force && !s.replan[name] && !s.nodeChanged && old.unchanged(svc, eps) {
			return
		}
	}
	p, err := s.planValid(pl, name, svc, eps)
	if err != nil {
		stats.Errors = append(stats.Errors, err) // keeps what it had, if anything
		return
	}
	if err := s.fits(name, p); err != nil {
		var full *maps.FullError
		if errors.As(err, &full) {
			stats.FullMaps = append(stats.FullMaps, full.Map)
		}
		stats.Errors = append(stats.Errors, err) // keeps what it had, if anything
		return
	}
	p.svcIn, p.epsIn, p.generation = svc, eps, s.generation
	stats.Errors = append(stats.Errors, s.install(name, old, p, stats)...)
	delete(s.replan, name)
}

// fits tells whether a plan's new entries fit in the maps beside everything
// else desired. A service that does not fit is refused on its own, with an
// error naming it and the map, and keeps what it had: one oversized Service
// (20,000 loadBalancerSourceRanges, say) must never stop every other sync at
// the map's first refused write.
func (s *Syncer) fits(name ServicePortName, p *plan) error {
	var newFE, newBE, newSrc [2]int // by family: IPv4, IPv6
	fam := func(b [16]uint8) int {
		if _, v4 := unmapped(b); v4 {
			return 0
		}
		return 1
	}
	for _, f := range p.frontends {
		if _, ok := s.fe.GetDesired(f.key); !ok {
			newFE[fam(f.key.Addr)]++
		}
	}
	for _, set := range p.sets {
		if list := set.list; len(list) > 0 {
			newBE[fam(list[0].Addr)] += max(0, len(list)-len(s.currentBackends(set.id)))
		}
	}
	for _, k := range p.srcRanges {
		if _, ok := s.src.GetDesired(k); !ok {
			newSrc[fam(k.Src)]++
		}
	}
	return errors.Join(s.fe.fits(name, newFE[0], newFE[1]), s.be.fits(name, newBE[0], newBE[1]),
		s.src.fits(name, newSrc[0], newSrc[1]))
}

// planValid validates a service and its endpoints, then plans it.
func (s *Syncer) planValid(pl *planner, name ServicePortName, svc *ServicePort, eps []Endpoint) (*plan, error) {
	if err := svc.Validate(); err != nil {
		return nil, err
	}
	for i := range eps {
		if _, err := NewEndpoint(eps[i]); err != nil {
			return nil, fmt.Errorf("service %s: %w", name, err)
		}
		if eps[i].Addr.Addr().Is6() != svc.ClusterIP.Is6() {
			return nil, fmt.Errorf("service %s: endpoint %v: not an %s address", name, eps[i].Addr, familyName(svc.ClusterIP.Is6()))
		}
	}
	p, err := pl.plan(name, svc, eps)
	if err != nil {
		return nil, err
	}
	// No copies: State's service ports and endpoint slices are immutable
	// once passed (see State), and at 10,000 services a copy of every
	// endpoint was the syncer's largest allocation.
	p.svc, p.eps = svc, eps
	return p, nil
}

// unchanged reports whether svc and eps program what p programs: the same
// pointers as last time (see State), or equal contents.
func (p *plan) unchanged(svc *ServicePort, eps []Endpoint) bool {
	if p.svcIn == svc && sameSlice(p.epsIn, eps) {
		return true
	}
	return p.svc.Equal(svc) && sameEndpoints(p.eps, eps)
}

func sameSlice(a, b []Endpoint) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

func sameEndpoints(a, b []Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(&b[i]) {
			return false
		}
	}
	return true
}

// load reads the maps back, so the first Apply after a restart reuses ids and
// writes nothing for unchanged services.
func (s *Syncer) load() error {
	for _, m := range []interface{ LoadDataplaneState() error }{s.fe, s.be, s.src, s.hostIPs, s.names} {
		if err := m.LoadDataplaneState(); err != nil {
			return fmt.Errorf("nat syncer: read maps: %w", err)
		}
	}
	if err := s.loadSvcnet(); err != nil {
		return fmt.Errorf("nat syncer: read maps: %w", err)
	}
	s.loaded = true
	// Affinity entries of services that no longer exist are dropped by the
	// first clean-up.
	s.affinityDirty[0] = true
	return nil
}

// currentBackends returns the desired backends of a service id, by ordinal
// (after a restart: what the maps hold).
func (s *Syncer) currentBackends(id uint32) []gen.SluiceBe6Value {
	var list []gen.SluiceBe6Value
	for i := uint32(0); ; i++ {
		v, ok := s.be.GetDesired(gen.SluiceBeKey{SvcId: id, Ordinal: i})
		if !ok {
			v, ok = s.be.GetDataplane(gen.SluiceBeKey{SvcId: id, Ordinal: i})
		}
		if !ok {
			return list
		}
		list = append(list, v)
	}
}
