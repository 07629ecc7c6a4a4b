package maps

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"golang.org/x/sys/unix"
)

// DefaultPinDir is where the agent pins its maps unless told otherwise.
const DefaultPinDir = "/sys/fs/bpf/sluice"

// NamePrefix starts the name of every Sluice map. The name ends in _vN, the
// layout version: any change to a map's key or value layout bumps N in
// bpf/include, so a pin of an older layout has another name and is never opened
// as if it were the new one. Same-named pins whose type, sizes, capacity or flags
// differ are refused by Open with an error naming the map and the mismatch.
const NamePrefix = "sl_"

// Def names one map of the catalogue together with its Go key and value types.
type Def[K comparable, V any] struct {
	Name string
}

// In returns the typed map of d in s.
func (d Def[K, V]) In(s *Set) (*Map[K, V], error) {
	m, ok := s.maps[d.Name]
	if !ok {
		return nil, fmt.Errorf("map %s is not open in %s", d.Name, s.dir)
	}
	return NewMap[K, V](m)
}

// PerCPUDef names one per-CPU map of the catalogue with its Go types.
type PerCPUDef[K comparable, V any] struct {
	Name string
}

// In returns the typed per-CPU map of d in s.
func (d PerCPUDef[K, V]) In(s *Set) (*PerCPUMap[K, V], error) {
	m, ok := s.maps[d.Name]
	if !ok {
		return nil, fmt.Errorf("map %s is not open in %s", d.Name, s.dir)
	}
	return NewPerCPUMap[K, V](m)
}

// The catalogue's typed entries. Layouts and byte orders are documented in
// bpf/include, next to each field.
var (
	Frontends = Def[gen.SluiceFeKey, gen.SluiceFeValue]{Name: gen.SluiceMapSlFeV1}
	Backends  = Def[gen.SluiceBeKey, gen.SluiceBeValue]{Name: gen.SluiceMapSlBeV1}
	SrcRanges = Def[gen.SluiceSrcrangeKey, gen.SluiceSrcrangeValue]{Name: gen.SluiceMapSlSrcrangeV1}
	Affinity  = Def[gen.SluiceAffKey, gen.SluiceAffValue]{Name: gen.SluiceMapSlAffV1}
	Conntrack = Def[gen.SluiceCtKey, gen.SluiceCtValue]{Name: gen.SluiceMapSlCtV2}
	Fragments = Def[gen.SluiceFragKey, gen.SluiceFragValue]{Name: gen.SluiceMapSlFragV1}
	Config    = Def[uint32, gen.SluiceConfig]{Name: gen.SluiceMapSlConfigV1}
	HostIPs   = Def[gen.SluiceHostipKey, gen.SluiceHostipValue]{Name: gen.SluiceMapSlHostipV1}
	Counters  = PerCPUDef[gen.SluiceCounter, uint64]{Name: gen.SluiceMapSlCountersV7}
	Sockets   = Def[gen.SluiceSockKey, gen.SluiceSockValue]{Name: gen.SluiceMapSlSockV1}
	Prefilter = Def[gen.SluicePrefilterKey, gen.SluicePrefilterValue]{Name: gen.SluiceMapSlPrefilterV1}
	Failsafe  = Def[gen.SluiceFailsafeKey, gen.SluiceFailsafeValue]{Name: gen.SluiceMapSlFailsafeV1}
	IfState   = Def[gen.SluiceIfstateKey, gen.SluiceIfstateValue]{Name: gen.SluiceMapSlIfstateV1}
	SvcNames  = Def[gen.SluiceSvcnameKey, gen.SluiceSvcnameValue]{Name: gen.SluiceMapSlSvcnameV1}
	IPSets    = Def[gen.SluiceIpsetKey, gen.SluiceIpsetValue]{Name: gen.SluiceMapSlIpsetV1}
	RuleCtrs  = PerCPUDef[gen.SluiceRulectrKey, uint64]{Name: gen.SluiceMapSlRulectrV1}
	SvcStats  = PerCPUDef[uint32, gen.SluiceSvcstatsValue]{Name: gen.SluiceMapSlSvcstatsV1}
	// ServiceNets: the ServiceCIDRs and allocated ClusterIPs of both
	// families, IPv4 as ::ffff:a.b.c.d (bpf/include/svcnet.h).
	ServiceNets = Def[gen.SluiceSvcnetKey, gen.SluiceSvcnetValue]{Name: gen.SluiceMapSlSvcnetV1}
	// PortCrowding: when each CPU's last source-port search found every
	// port taken (bpf/include/ct_new.h, port_tries).
	PortCrowding = PerCPUDef[uint32, gen.SluicePortCrowded]{Name: gen.SluiceMapSlPortcrowdV1}
	// SNATFull: destinations whose source ports a full search found all
	// taken, {backend, the flow's source address after translation, backend
	// port, protocol} as a reverse conntrack key with port 0 -> when
	// (bpf/include/ct_new.h): new flows to them that would search for a port
	// are refused without one for a tenth of a second.
	SNATFull  = Def[gen.SluiceCtKey, gen.SluiceSnatFull]{Name: gen.SluiceMapSlSnatfullV1}
	SNATFull6 = Def[gen.SluiceCt6Key, gen.SluiceSnatFull]{Name: gen.SluiceMapSlSnatfull6V1}
	// XDPDecisions: per-CPU counts of the XDP acceleration's decisions
	// (bpf/include/xdp_accel.h), by enum xdp_accel_decision.
	XDPDecisions = PerCPUDef[gen.SluiceXdpAccelDecision, uint64]{Name: gen.SluiceMapSlXdpstatsV2}
	// XDPDevices: the interfaces the XDP acceleration may redirect a frame
	// to, ifindex -> ifindex, each in the writer's network namespace (a
	// devmap resolves the interface when it is written).
	XDPDevices = Def[uint32, uint32]{Name: gen.SluiceMapSlXdpdevV1}
	// Routes: local delivery's FIB answers (bpf/include/deliver.h), kept a
	// second each; deleting one makes the next packet ask again.
	Routes  = Def[gen.SluiceRouteKey, gen.SluiceRouteValue]{Name: gen.SluiceMapSlRouteV1}
	Routes6 = Def[gen.SluiceRoute6Key, gen.SluiceRouteValue]{Name: gen.SluiceMapSlRoute6V1}

	// The IPv6 twins: one map set per family, so the IPv4 maps keep their
	// small keys (bpf/include/ipv6.h).
	Frontends6 = Def[gen.SluiceFe6Key, gen.SluiceFeValue]{Name: gen.SluiceMapSlFe6V1}
	Backends6  = Def[gen.SluiceBeKey, gen.SluiceBe6Value]{Name: gen.SluiceMapSlBe6V1}
	SrcRanges6 = Def[gen.SluiceSrcrange6Key, gen.SluiceSrcrangeValue]{Name: gen.SluiceMapSlSrcrange6V1}
	Affinity6  = Def[gen.SluiceAff6Key, gen.SluiceAff6Value]{Name: gen.SluiceMapSlAff6V1}
	Conntrack6 = Def[gen.SluiceCt6Key, gen.SluiceCt6Value]{Name: gen.SluiceMapSlCt6V1}
	Fragments6 = Def[gen.SluiceFrag6Key, gen.SluiceFragValue]{Name: gen.SluiceMapSlFrag6V1}
	Config6    = Def[uint32, gen.SluiceConfig6]{Name: gen.SluiceMapSlConfig6V1}
	HostIPs6   = Def[gen.SluiceHostip6Key, gen.SluiceHostipValue]{Name: gen.SluiceMapSlHostip6V1}
	Sockets6   = Def[gen.SluiceSock6Key, gen.SluiceSock6Value]{Name: gen.SluiceMapSlSock6V1}
	Prefilter6 = Def[gen.SluicePrefilter6Key, gen.SluicePrefilterValue]{Name: gen.SluiceMapSlPrefilter6V1}
	IPSets6    = Def[gen.SluiceIpset6Key, gen.SluiceIpsetValue]{Name: gen.SluiceMapSlIpset6V1}
	// PolicyPrograms is a program array: use Set.Map(PolicyPrograms) with
	// the policy runtime.
	PolicyPrograms = gen.SluiceMapSlPolprogV1
	// SpanWriter is a program array whose slot 0 gen.Load fills with the
	// datapath's established-packet writer (sl_write_span).
	SpanWriter = gen.SluiceMapSlSpanwriterV1
)

// docs says what each map is for; every map of the object must have a line
// (a test checks), which keeps the catalogue complete.
var docs = map[string]string{
	gen.SluiceMapSlFeV1:         "service frontends: {IP, port, protocol} -> service id, backend counts, affinity, flags",
	gen.SluiceMapSlBeV1:         "service backends: {service id, ordinal} -> backend IP:port, local flag",
	gen.SluiceMapSlSrcrangeV1:   "loadBalancerSourceRanges: LPM {service id, source CIDR}",
	gen.SluiceMapSlSvcnetV1:     "service networks: LPM of ServiceCIDRs and allocated ClusterIPs (both families), for refusing unserved service addresses",
	gen.SluiceMapSlAffV1:        "session affinity: {service id, client IP} -> backend, time chosen (LRU)",
	gen.SluiceMapSlCtV2:         "conntrack: forward and reverse entry per tracked flow, translated or not (full: new flows refused)",
	gen.SluiceMapSlFragV1:       "IPv4 fragments: {source, destination, IP id, protocol} -> the first fragment's ports (LRU)",
	gen.SluiceMapSlConfigV1:     "node-wide settings: node IP for SNAT, SNAT port range",
	gen.SluiceMapSlHostipV1:     "this node's IPv4 addresses (NodePort wildcard matching)",
	gen.SluiceMapSlCountersV7:   "per-CPU counters of drops and other verdicts, by reason",
	gen.SluiceMapSlSockV1:       "socket LB: {socket cookie, backend} -> service address to give back (LRU)",
	gen.SluiceMapSlPrefilterV1:  "XDP prefilter: LPM deny list of source CIDRs",
	gen.SluiceMapSlFailsafeV1:   "XDP prefilter: {protocol, port} inbound ports never dropped",
	gen.SluiceMapSlIfstateV1:    "managed interfaces: ifindex -> flags, name, policy slots",
	gen.SluiceMapSlSvcnameV1:    "service id -> namespace/name:port, for inspection tools",
	gen.SluiceMapSlIpsetV1:      "policy IP sets: LPM {set id, address}",
	gen.SluiceMapSlRulectrV1:    "per-CPU hit counters of policy rules, by rule id",
	gen.SluiceMapSlSvcstatsV1:   "per-CPU packets, bytes and new flows of each service, by service id",
	gen.SluiceMapSlPolprogV1:    "policy programs by slot (0: the verdict program)",
	gen.SluiceMapSlFe6V1:        "IPv6 service frontends: {IP, port, protocol} -> service id, backend counts, affinity, flags",
	gen.SluiceMapSlBe6V1:        "IPv6 service backends: {service id, ordinal} -> backend IP:port, local flag",
	gen.SluiceMapSlSrcrange6V1:  "IPv6 loadBalancerSourceRanges: LPM {service id, source CIDR}",
	gen.SluiceMapSlAff6V1:       "IPv6 session affinity: {service id, client IP} -> backend, time chosen (LRU)",
	gen.SluiceMapSlCtprevV1:     "slot 0: the conntrack table a resize replaces, while the agent moves its last entries; the datapath takes a flow's pair from it on a miss",
	gen.SluiceMapSlCtprev6V1:    "slot 0: the IPv6 conntrack table a resize replaces, as sl_ctprev_v1",
	gen.SluiceMapSlCt6V1:        "IPv6 conntrack: forward and reverse entry per tracked flow (full: new flows refused)",
	gen.SluiceMapSlFrag6V1:      "IPv6 fragments: {source, destination, fragment id, protocol} -> the first fragment's ports (LRU)",
	gen.SluiceMapSlConfig6V1:    "node-wide IPv6 settings: node IPv6 address for SNAT, IPv6 pod CIDR",
	gen.SluiceMapSlHostip6V1:    "this node's IPv6 addresses (NodePort wildcard matching)",
	gen.SluiceMapSlPrefilter6V1: "XDP prefilter: LPM deny list of IPv6 source CIDRs",
	gen.SluiceMapSlSock6V1:      "socket LB of IPv6 sockets: {socket cookie, backend} -> service address to give back (LRU)",
	gen.SluiceMapSlScratch6V1:   "per-CPU scratch space where the datapath builds IPv6 conntrack entries and hands an IPv6 tuple to the policy programs; holds nothing between packets",
	gen.SluiceMapSlSpanV1:       "per-CPU scratch space where the datapath builds the translated bytes of an established IPv4 packet before one store writes them; holds nothing between packets",
	gen.SluiceMapSlSpan6V1:      "per-CPU scratch space where the datapath leaves the translated bytes of an established IPv6 packet for sl_write_span; holds nothing between packets",
	gen.SluiceMapSlSpanwriterV1: "slot 0: sl_write_span, which writes an established packet's translation from sl_span_v1 or sl_span6_v1 with direct writes (every load puts its own)",
	gen.SluiceMapSlIpset6V1:     "policy IP sets, IPv6 members: LPM {set id, address}",
	gen.SluiceMapSlMaglevV1:     "Maglev tables: service id -> inner array map holding the table (slot -> backend ordinal); replaced whole",
	gen.SluiceMapSlEventsV1:     "flow events ring buffer: drops, and service flows starting and ending (read by sluice monitor)",
	gen.SluiceMapSlEvcpuV1:      "per-CPU flow-event budget of the current second and the reason of the CPU's last drop",
	gen.SluiceMapSlRouteV1:      "local delivery: {destination, ingress interface} -> the destination workload's interface, MACs and MTU, or none (the stack routes it); a FIB answer kept a second (LRU)",
	gen.SluiceMapSlRoute6V1:     "local delivery of IPv6: {destination, ingress interface} -> as sl_route_v1 (LRU)",
	gen.SluiceMapSlXdpstatsV2:   "per-CPU counts of the XDP acceleration's decisions: translated and sent, or passed to TC and why",
	gen.SluiceMapSlXdpdevV1:     "XDP acceleration: the interfaces a translated frame may be redirected to (ifindex -> ifindex, a devmap)",
	gen.SluiceMapSlSnatfullV1:   "destinations whose SNAT ports a full search found all taken: {backend, source address, port 0} -> when; new flows needing a port refused without a search for 100 ms (LRU)",
	gen.SluiceMapSlSnatfull6V1:  "IPv6 destinations whose SNAT ports a full search found all taken, as sl_snatfull_v1 (LRU)",
	gen.SluiceMapSlPortcrowdV1:  "per-CPU time of the CPU's last source-port search that found every port taken (searches try fewer ports for a second after)",
}

// Info describes one map of the catalogue.
type Info struct {
	Name      string
	Type      ebpf.MapType
	KeySize   uint32
	ValueSize uint32
	// Capacity is the default number of entries; OpenOptions.Capacity overrides it.
	Capacity uint32
	Flags    uint32
	Doc      string
}

// Catalogue lists every Sluice map, sorted by name, as the BPF object defines it.
func Catalogue() ([]Info, error) {
	specs, err := mapSpecs()
	if err != nil {
		return nil, err
	}
	infos := make([]Info, 0, len(specs))
	for _, s := range specs {
		infos = append(infos, Info{
			Name: s.Name, Type: s.Type, KeySize: s.KeySize, ValueSize: s.ValueSize,
			Capacity: s.MaxEntries, Flags: s.Flags, Doc: docs[s.Name],
		})
	}
	return infos, nil
}

// mapSpecs returns the specs of the object's sl_ maps, sorted by name.
func mapSpecs() ([]*ebpf.MapSpec, error) {
	spec, err := gen.Spec()
	if err != nil {
		return nil, err
	}
	var specs []*ebpf.MapSpec
	for name, ms := range spec.Maps {
		if strings.HasPrefix(name, NamePrefix) {
			specs = append(specs, ms)
		}
	}
	slices.SortFunc(specs, func(a, b *ebpf.MapSpec) int { return strings.Compare(a.Name, b.Name) })
	return specs, nil
}

// OpenOptions configures Open.
type OpenOptions struct {
	// PinDir is the bpffs directory holding the pins; DefaultPinDir when empty.
	PinDir string
	// Capacity overrides the default capacity of maps by name.
	Capacity map[string]uint32
	// NoCreate opens only maps already pinned (inspection tools): a missing
	// pin is an error rather than a new, empty map, and a map of any
	// capacity is taken.
	NoCreate bool
	// Migrate moves the entries of a pin of another capacity, or of an
	// older layout listed in Upgrades, into a new map instead of refusing
	// it (see Migration). The caller calls FinishMigrations once its
	// programs use the new maps.
	Migrate bool
	// MaglevTableSize is the slots of the Maglev tables the NAT syncer
	// writes (gen.LoadOptions.MaglevTableSize must be the same); 0: Maglev
	// is off, and sl_maglev_v1 is emptied.
	MaglevTableSize uint32
}

// Set is the catalogue's maps, open and pinned.
type Set struct {
	dir        string
	maps       map[string]*ebpf.Map
	migrations []*Migration

	// infoMu guards what a scrape learns once of a map that never
	// changes: its id, and the kernel memory of a preallocated one.
	infoMu     sync.Mutex
	ids        map[string]ebpf.MapID
	fixedBytes map[string]uint64
}

// Open creates or reuses every catalogue map pinned under opts.PinDir.
func Open(opts OpenOptions) (*Set, error) {
	dir := cmpOr(opts.PinDir, DefaultPinDir)
	specs, err := mapSpecs()
	if err != nil {
		return nil, err
	}
	for name := range opts.Capacity {
		if !slices.ContainsFunc(specs, func(s *ebpf.MapSpec) bool { return s.Name == name }) {
			return nil, fmt.Errorf("capacity for unknown map %q", name)
		}
	}
	s := &Set{dir: dir, maps: map[string]*ebpf.Map{}}
	for _, spec := range specs {
		if c, ok := opts.Capacity[spec.Name]; ok {
			spec.MaxEntries = c
		}
		var m *ebpf.Map
		var err error
		switch {
		case spec.Type == ebpf.HashOfMaps && !opts.NoCreate:
			m, err = openMaglevTables(dir, spec, opts.MaglevTableSize)
		case opts.NoCreate:
			m, err = openExisting(dir, spec)
		case opts.Migrate:
			var mig *Migration
			if m, mig, err = openMigrating(dir, spec); mig != nil {
				s.migrations = append(s.migrations, mig)
			}
		default:
			m, err = OpenPinned(dir, spec)
		}
		if err != nil {
			s.Close()
			return nil, err
		}
		s.maps[spec.Name] = m
	}
	// Only the agent's Open (Migrate) manages the bridges: an inspection
	// tool's must leave a running migration's alone.
	if !opts.Migrate {
		return s, nil
	}
	if err := s.servePrevious(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// openMaglevTables opens sl_maglev_v1, the Maglev tables (a hash of maps).
// The kernel does not tell a map of maps' inner size, so the map's kernel
// name carries it (sl_maglev<slots>): a pin of the size wanted is kept, so a
// restarted agent's programs pick as before from the first packet (and the
// programs attached stay, their maps unchanged), and its NAT syncer replaces
// the tables one by one. A pin of another size is replaced by an empty map:
// nothing is lost that the syncer does not write again. With Maglev off
// (size 0) the map keeps the default size and is emptied.
func openMaglevTables(dir string, spec *ebpf.MapSpec, size uint32) (*ebpf.Map, error) {
	spec = spec.Copy()
	slots := size
	if slots == 0 {
		slots = spec.InnerMap.ValueSize / 4 // the object's default
	}
	spec.InnerMap.ValueSize = slots * 4
	spec.Name = fmt.Sprintf("sl_maglev%d", slots)
	path := filepath.Join(dir, gen.SluiceMapSlMaglevV1)
	pinned, err := ebpf.LoadPinnedMap(path, nil)
	if err == nil {
		info, ierr := pinned.Info()
		if ierr == nil && info.Name == spec.Name && checkPinned(pinned, spec, path) == nil {
			if size == 0 {
				if err := emptyMap(pinned); err != nil {
					pinned.Close()
					return nil, fmt.Errorf("map %s: empty the tables of a Maglev run: %w", gen.SluiceMapSlMaglevV1, err)
				}
			}
			return pinned, nil
		}
		pinned.Close()
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("map %s: replace pin %s: %w", gen.SluiceMapSlMaglevV1, path, err)
		}
	}
	return openPinnedAt(dir, gen.SluiceMapSlMaglevV1, spec)
}

// emptyMap deletes every entry of m.
func emptyMap(m *ebpf.Map) error {
	var keys [][]byte
	var k []byte
	it := m.Iterate()
	for it.Next(&k, new([]byte)) {
		keys = append(keys, slices.Clone(k))
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Dir is the pin directory of the set.
func (s *Set) Dir() string { return s.dir }

// Map returns the named map, or nil.
func (s *Set) Map(name string) *ebpf.Map { return s.maps[name] }

// All returns the maps by name, as gen.LoadOptions.Maps wants them.
func (s *Set) All() map[string]*ebpf.Map { return s.maps }

// Capacities is each map's capacity (entries; a ring buffer's, bytes).
func (s *Set) Capacities() map[string]uint32 {
	out := make(map[string]uint32, len(s.maps))
	for name, m := range s.maps {
		out[name] = m.MaxEntries()
	}
	return out
}

// KernelBytes is the memory the kernel holds for each map of the set, as it
// charges it (fdinfo's memlock): what a map costs the node whether it is
// full or empty, since most are preallocated. A preallocated map's is read
// once; an LPM trie's, which grows with its entries, at every call.
func (s *Set) KernelBytes() (map[string]uint64, error) {
	s.infoMu.Lock()
	defer s.infoMu.Unlock()
	out := make(map[string]uint64, len(s.maps))
	for name, m := range s.maps {
		if n, ok := s.fixedBytes[name]; ok {
			out[name] = n
			continue
		}
		info, err := m.Info()
		if err != nil {
			return nil, fmt.Errorf("map %s: %w", name, err)
		}
		n, _ := info.Memlock()
		out[name] = n
		if preallocated(m) {
			if s.fixedBytes == nil {
				s.fixedBytes = map[string]uint64{}
			}
			s.fixedBytes[name] = n
		}
	}
	return out, nil
}

// preallocated tells whether the kernel allocates all of a map's memory
// when it creates it: its memory never changes.
func preallocated(m *ebpf.Map) bool {
	switch m.Type() {
	case ebpf.Array, ebpf.PerCPUArray, ebpf.ProgramArray, ebpf.RingBuf:
		return true
	case ebpf.Hash, ebpf.PerCPUHash, ebpf.LRUHash, ebpf.LRUCPUHash:
		return m.Flags()&unix.BPF_F_NO_PREALLOC == 0
	}
	return false
}

// mapID is the kernel's id of the set's map name, read once.
func (s *Set) mapID(name string, m *ebpf.Map) (ebpf.MapID, bool, error) {
	s.infoMu.Lock()
	defer s.infoMu.Unlock()
	if id, ok := s.ids[name]; ok {
		return id, true, nil
	}
	info, err := m.Info()
	if err != nil {
		return 0, false, fmt.Errorf("map %s: %w", name, err)
	}
	id, ok := info.ID()
	if ok {
		if s.ids == nil {
			s.ids = map[string]ebpf.MapID{}
		}
		s.ids[name] = id
	}
	return id, ok, nil
}

// Close closes the handles; the pins, and so the maps, stay.
func (s *Set) Close() error {
	var errs []error
	for _, m := range s.maps {
		errs = append(errs, m.Close())
	}
	for _, mig := range s.migrations {
		if mig.old != nil {
			errs = append(errs, mig.old.Close())
			mig.old = nil
		}
	}
	return errors.Join(errs...)
}

// RepairPins pins again every map of the set whose pin is missing or names
// another map (removed or replaced behind the set's back), and returns their
// names. Programs keep using the set's maps; without the pins, the next start
// would create new, empty maps that the running programs do not read.
func (s *Set) RepairPins() ([]string, error) {
	var repaired []string
	var errs []error
	for name, m := range s.maps {
		path := filepath.Join(s.dir, name)
		if pinned, err := ebpf.LoadPinnedMap(path, nil); err == nil {
			same := sameMap(pinned, m)
			pinned.Close()
			if same {
				continue
			}
			if err := os.Remove(path); err != nil {
				errs = append(errs, fmt.Errorf("replace pin %s: %w", path, err))
				continue
			}
		}
		// A map pinned once keeps its pin path: clear it, then pin anew.
		if err := pinAgain(m, path); err != nil {
			errs = append(errs, fmt.Errorf("repin %s: %w", name, err))
			continue
		}
		repaired = append(repaired, name)
	}
	slices.Sort(repaired)
	return repaired, errors.Join(errs...)
}

func sameMap(a, b *ebpf.Map) bool {
	ia, errA := a.Info()
	ib, errB := b.Info()
	if errA != nil || errB != nil {
		return false
	}
	idA, okA := ia.ID()
	idB, okB := ib.ID()
	return okA && okB && idA == idB
}

// pinAgain pins m at path. cilium/ebpf remembers a map's pin path and treats
// pinning it there again as done, so the remembered pin is dropped first.
func pinAgain(m *ebpf.Map, path string) error {
	if err := m.Unpin(); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return m.Pin(path)
}

// Unpin removes the pins of every map of the set, so the maps disappear once no
// program or handle uses them.
func (s *Set) Unpin() error {
	var errs []error
	for name, m := range s.maps {
		if err := m.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// OpenPinned returns the map pinned at dir/spec.Name after checking it matches
// spec, or creates and pins it when there is no pin.
func OpenPinned(dir string, spec *ebpf.MapSpec) (*ebpf.Map, error) {
	return openPinnedAt(dir, spec.Name, spec)
}

// openPinnedAt is OpenPinned with a pin name other than the kernel name.
func openPinnedAt(dir, pinName string, spec *ebpf.MapSpec) (*ebpf.Map, error) {
	path := filepath.Join(dir, pinName)
	for range 2 {
		m, err := ebpf.LoadPinnedMap(path, nil)
		if err == nil {
			if err := checkPinned(m, spec, path); err != nil {
				m.Close()
				return nil, err
			}
			return m, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("map %s: open pin %s: %w", spec.Name, path, err)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("map %s: pin directory: %w", spec.Name, err)
		}
		fresh := spec.Copy()
		fresh.Pinning = ebpf.PinNone
		m, err = ebpf.NewMap(fresh)
		if err != nil {
			return nil, fmt.Errorf("map %s: create: %w", spec.Name, err)
		}
		err = m.Pin(path)
		if err == nil {
			return m, nil
		}
		m.Close()
		if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("map %s: pin at %s: %w", spec.Name, path, err)
		}
		// Another process pinned it first: go round and reuse theirs.
	}
	return nil, fmt.Errorf("map %s: pin at %s keeps changing", spec.Name, path)
}

func openExisting(dir string, spec *ebpf.MapSpec) (*ebpf.Map, error) {
	path := filepath.Join(dir, spec.Name)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("map %s is not pinned in %s (is the agent running, or was it run with another --bpf-pin-dir?)", spec.Name, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("map %s: open pin %s: %w", spec.Name, path, err)
	}
	// A tool reads the map whatever its capacity (the agent may have sized
	// it with its flags).
	sized := spec.Copy()
	sized.MaxEntries = m.MaxEntries()
	if err := checkPinned(m, sized, path); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// LayoutError reports a pinned map that does not match the layout this build
// expects. It is never used silently.
type LayoutError struct {
	Map, Path string
	Mismatch  string
}

func (e *LayoutError) Error() string {
	return fmt.Sprintf("map %s pinned at %s has another layout (%s); remove the pin (sluice cleanup) to recreate it", e.Map, e.Path, e.Mismatch)
}

// ownFlags are a map's flags without those the kernel adds itself: every
// devmap is made read-only to programs (BPF_F_RDONLY_PROG), a flag its
// creation refuses when asked for.
func ownFlags(m *ebpf.Map) uint32 {
	if m.Type() == ebpf.DevMap || m.Type() == ebpf.DevMapHash {
		return m.Flags() &^ unix.BPF_F_RDONLY_PROG
	}
	return m.Flags()
}

func checkPinned(m *ebpf.Map, spec *ebpf.MapSpec, path string) error {
	var diffs []string
	cmp := func(what string, got, want uint32) {
		if got != want {
			diffs = append(diffs, fmt.Sprintf("%s %d, want %d", what, got, want))
		}
	}
	if m.Type() != spec.Type {
		diffs = append(diffs, fmt.Sprintf("type %v, want %v", m.Type(), spec.Type))
	}
	cmp("key size", m.KeySize(), spec.KeySize)
	cmp("value size", m.ValueSize(), spec.ValueSize)
	cmp("capacity", m.MaxEntries(), spec.MaxEntries)
	cmp("flags", ownFlags(m), spec.Flags)
	if len(diffs) > 0 {
		return &LayoutError{Map: spec.Name, Path: path, Mismatch: strings.Join(diffs, ", ")}
	}
	return nil
}

// StalePins lists pins in dir that look like Sluice maps (sl_ prefix) but are not
// in this build's catalogue: maps of an older layout version, left by an older
// agent. The agent reports them; cleanup removes them.
func StalePins(dir string) ([]string, error) {
	specs, err := mapSpecs()
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(cmpOr(dir, DefaultPinDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var stale []string
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, NamePrefix) || e.IsDir() {
			continue
		}
		if !slices.ContainsFunc(specs, func(s *ebpf.MapSpec) bool { return s.Name == name }) {
			stale = append(stale, name)
		}
	}
	return stale, nil
}

// disposable names (without the _vN layout version) the maps whose contents
// only count or live for seconds: statistics, in-flight fragments, local
// delivery's FIB answers. A pin of an older layout of one of them can be
// removed without losing a connection.
// sl_ifstats_v1 (the per-interface counters of the retired sl_count program)
// has no current layout: its pin is removed as stale.
var disposable = []string{"sl_counters_v", "sl_ifstats_v", "sl_rulectr_v", "sl_svcstats_v", "sl_frag_v", "sl_events_v", "sl_evcpu_v", "sl_portcrowd_v", "sl_snatfull_v", "sl_snatfull6_v", "sl_route_v", "sl_route6_v", "sl_xdpstats_v"}

// RemoveStaleDisposable removes the stale pins (StalePins) of maps whose
// contents are disposable — counters and in-flight fragments — and returns
// their names, so an upgrade that only changes such a layout needs no
// cleanup. Stale pins of maps holding state (conntrack, services, affinity)
// are left for the caller to report.
func RemoveStaleDisposable(dir string) ([]string, error) {
	stale, err := StalePins(dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, name := range stale {
		if !slices.ContainsFunc(disposable, func(prefix string) bool { return strings.HasPrefix(name, prefix) }) {
			continue
		}
		if err := os.Remove(filepath.Join(cmpOr(dir, DefaultPinDir), name)); err != nil {
			return removed, fmt.Errorf("remove stale pin %s: %w", name, err)
		}
		removed = append(removed, name)
	}
	return removed, nil
}

// ConntrackCapacity sizes both families' conntrack tables for kube-proxy's
// flags (--conntrack-max-per-core, --conntrack-min), for
// OpenOptions.Capacity: room for max(minFlows, maxPerCore × cpus) flows, two
// entries each (a netfilter conntrack holds both directions in one entry;
// Sluice has a forward and a reverse entry), at most 2^30. A maxPerCore of 0
// gives nil: the built-in size.
func ConntrackCapacity(maxPerCore, minFlows, cpus int) map[string]uint32 {
	if maxPerCore <= 0 {
		return nil
	}
	n := uint32(min(2*max(minFlows, maxPerCore*cpus), 1<<30))
	return map[string]uint32{Conntrack.Name: n, Conntrack6.Name: n}
}

// IPv6MinimalCapacity are the capacities, for OpenOptions.Capacity, of the
// IPv6 tables on a node without IPv6: its link-local flows tracked, no
// IPv6 Service. It saves about 140 MiB of kernel memory over the built-in
// sizes (`sluice maps`, KERNEL), nearly all of it the conntrack table's.
// A node that gains IPv6 has them sized anew, and migrated, when the agent
// restarts.
func IPv6MinimalCapacity() map[string]uint32 {
	return map[string]uint32{
		Conntrack6.Name: 8192,
		Backends6.Name:  1024, Frontends6.Name: 1024, Affinity6.Name: 1024, Sockets6.Name: 1024,
		Fragments6.Name: 256,
	}
}

// MergeCapacity sets into's capacity of each map in from to the smaller of
// the two (from's where into has none): a minimal table is not made bigger
// by a flag meant for a family the node has.
func MergeCapacity(into, from map[string]uint32) {
	for name, c := range from {
		if have, ok := into[name]; !ok || c < have {
			into[name] = c
		}
	}
}
