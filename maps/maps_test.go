package maps_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

func openSet(t *testing.T) *maps.Set {
	t.Helper()
	set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	return set
}

// randomize fills v with random bytes: a round trip must preserve every byte.
func randomize[T any](rng *rand.Rand, v *T) {
	b := unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

func roundTrip[K comparable, V comparable](d maps.Def[K, V]) func(t *testing.T, s *maps.Set) {
	return func(t *testing.T, s *maps.Set) {
		m, err := d.In(s)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		for range 20 {
			var k K
			var v V
			randomize(rng, &k)
			randomize(rng, &v)
			if err := m.Put(k, v, ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
			got, err := m.Get(k)
			if err != nil {
				t.Fatal(err)
			}
			if got != v {
				t.Fatalf("%s: got %+v, want %+v", d.Name, got, v)
			}
			if err := m.Delete(k); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Get(k); !errors.Is(err, maps.ErrKeyNotExist) {
				t.Fatalf("%s: after delete: %v, want ErrKeyNotExist", d.Name, err)
			}
		}
	}
}

// roundTrips must name every map of the catalogue: a map added to bpf/include
// without a typed Def and a round trip here fails TestCatalogueRoundTrips.
var roundTrips = map[string]func(*testing.T, *maps.Set){
	gen.SluiceMapSlMaglevV1:  roundTripMaglev,
	gen.SluiceMapSlCtprevV1:  roundTripBridge(gen.SluiceMapSlCtprevV1, maps.Conntrack.Name),
	gen.SluiceMapSlCtprev6V1: roundTripBridge(gen.SluiceMapSlCtprev6V1, maps.Conntrack6.Name),
	gen.SluiceMapSlEventsV1:  roundTripEvents,
	gen.SluiceMapSlEvcpuV1: roundTripPerCPU(maps.EventBudget, func(cpu int) gen.SluiceEvCpu {
		return gen.SluiceEvCpu{Window: uint64(cpu), Used: 3, LastDrop: 7}
	}),
	maps.PortCrowding.Name: roundTripPerCPU(maps.PortCrowding, func(cpu int) gen.SluicePortCrowded {
		return gen.SluicePortCrowded{RefusedAt: uint64(cpu + 1)}
	}),
	maps.SNATFull.Name:     roundTrip(maps.SNATFull),
	maps.SNATFull6.Name:    roundTrip(maps.SNATFull6),
	maps.XDPDecisions.Name: roundTripXDPDecisions,
	maps.XDPDevices.Name:   roundTripXDPDevices,
	maps.Frontends.Name:    roundTrip(maps.Frontends),
	maps.Backends.Name:     roundTrip(maps.Backends),
	maps.SrcRanges.Name:    roundTripLPM,
	maps.ServiceNets.Name:  roundTripServiceNets,
	maps.Affinity.Name:     roundTrip(maps.Affinity),
	maps.Conntrack.Name:    roundTrip(maps.Conntrack),
	maps.Fragments.Name:    roundTrip(maps.Fragments),
	maps.Config.Name:       roundTripConfig,
	maps.HostIPs.Name:      roundTrip(maps.HostIPs),
	maps.Counters.Name:     roundTripCounters,
	maps.Sockets.Name:      roundTrip(maps.Sockets),
	maps.Prefilter.Name:    roundTripPrefilter,
	maps.Failsafe.Name:     roundTrip(maps.Failsafe),
	maps.IfState.Name:      roundTrip(maps.IfState),
	maps.SvcNames.Name:     roundTrip(maps.SvcNames),
	maps.IPSets.Name:       roundTripIPSets,
	maps.RuleCtrs.Name:     roundTripRuleCounters,
	maps.SvcStats.Name:     roundTripSvcStats,
	maps.PolicyPrograms:    checkProgramArray(maps.PolicyPrograms),
	maps.SpanWriter:        checkProgramArray(maps.SpanWriter),

	maps.Frontends6.Name:      roundTrip(maps.Frontends6),
	maps.Backends6.Name:       roundTrip(maps.Backends6),
	maps.SrcRanges6.Name:      roundTripLPM6,
	maps.Affinity6.Name:       roundTrip(maps.Affinity6),
	maps.Conntrack6.Name:      roundTrip(maps.Conntrack6),
	maps.Fragments6.Name:      roundTrip(maps.Fragments6),
	maps.Config6.Name:         roundTripConfig6,
	maps.HostIPs6.Name:        roundTrip(maps.HostIPs6),
	maps.Sockets6.Name:        roundTrip(maps.Sockets6),
	maps.Prefilter6.Name:      roundTripPrefilter6,
	maps.IPSets6.Name:         roundTripIPSets6,
	gen.SluiceMapSlScratch6V1: checkScratch,
	gen.SluiceMapSlSpanV1:     checkSpan(gen.SluiceMapSlSpanV1, 28),
	gen.SluiceMapSlSpan6V1:    checkSpan(gen.SluiceMapSlSpan6V1, 50),
	maps.Routes.Name:          roundTrip(maps.Routes),
	maps.Routes6.Name:         roundTrip(maps.Routes6),
}

func roundTripIPSets6(t *testing.T, s *maps.Set) {
	m, err := maps.IPSets6.In(s)
	if err != nil {
		t.Fatal(err)
	}
	k := gen.SluiceIpset6Key{Prefixlen: 32 + 64, SetId: gen.NetUint32(3), Addr: gen.NetAddr6(netip.MustParseAddr("fd00:1::"))}
	if err := m.Put(k, gen.SluiceIpsetValue{Flags: 9}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Get(k); err != nil || got.Flags != 9 {
		t.Fatalf("got %+v %v", got, err)
	}
}

func roundTripPrefilter6(t *testing.T, s *maps.Set) {
	m, err := maps.Prefilter6.In(s)
	if err != nil {
		t.Fatal(err)
	}
	k := gen.SluicePrefilter6Key{Prefixlen: 48, Addr: gen.NetAddr6(netip.MustParseAddr("2001:db8:bad::"))}
	if err := m.Put(k, gen.SluicePrefilterValue{Flags: 1}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Get(k); err != nil || got.Flags != 1 {
		t.Fatalf("got %+v %v", got, err)
	}
}

func roundTripLPM6(t *testing.T, s *maps.Set) {
	m, err := maps.SrcRanges6.In(s)
	if err != nil {
		t.Fatal(err)
	}
	k := gen.SluiceSrcrange6Key{Prefixlen: 32 + 48, SvcId: gen.NetUint32(7), Src: gen.NetAddr6(netip.MustParseAddr("2001:db8:1::"))}
	v := gen.SluiceSrcrangeValue{Flags: 3}
	if err := m.Put(k, v, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Get(k); err != nil || got != v {
		t.Fatalf("got %+v %v", got, err)
	}
}

func roundTripConfig6(t *testing.T, s *maps.Set) {
	m, err := maps.Config6.In(s)
	if err != nil {
		t.Fatal(err)
	}
	v := gen.SluiceConfig6{NodeIp: gen.NetAddr6(netip.MustParseAddr("fd00::1")),
		ClusterNet: gen.NetAddr6(netip.MustParseAddr("fd00:10::")), ClusterMask: gen.NetAddr6(netip.MustParseAddr("ffff:ffff::"))}
	if err := m.Put(0, v, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Get(0); err != nil || got != v {
		t.Fatalf("got %+v %v", got, err)
	}
}

// The IPv6 scratch map is the datapath's own: one per-CPU slot of the size
// of what it builds there.
func checkScratch(t *testing.T, s *maps.Set) {
	m := s.Map(gen.SluiceMapSlScratch6V1)
	if m == nil {
		t.Fatal("not open")
	}
	var sc gen.SluiceCt6Key
	if m.Type() != ebpf.PerCPUArray || m.MaxEntries() != 1 || m.ValueSize() < uint32(binary.Size(sc)) {
		t.Fatalf("scratch map: %v, %d entries, value %d bytes", m.Type(), m.MaxEntries(), m.ValueSize())
	}
}

// The span maps are the datapath's own too: one per-CPU slot that holds a
// translation's bytes (a TCP one, the longest: 28 over IPv4, 50 over IPv6).
func checkSpan(name string, longest uint32) func(t *testing.T, s *maps.Set) {
	return func(t *testing.T, s *maps.Set) {
		m := s.Map(name)
		if m == nil {
			t.Fatal("not open")
		}
		if m.Type() != ebpf.PerCPUArray || m.MaxEntries() != 1 || m.ValueSize() < longest {
			t.Fatalf("span map %s: %v, %d entries, value %d bytes", name, m.Type(), m.MaxEntries(), m.ValueSize())
		}
	}
}

func roundTripIPSets(t *testing.T, s *maps.Set) {
	m, err := maps.IPSets.In(s)
	if err != nil {
		t.Fatal(err)
	}
	k := gen.SluiceIpsetKey{Prefixlen: 32 + 24, SetId: gen.NetUint32(3), Addr: gen.NetAddr(netip.MustParseAddr("10.1.2.0"))}
	if err := m.Put(k, gen.SluiceIpsetValue{Flags: 9}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Get(k); err != nil || got.Flags != 9 {
		t.Fatalf("got %+v %v", got, err)
	}
}

func roundTripRuleCounters(t *testing.T, s *maps.Set) {
	m, err := maps.RuleCtrs.In(s)
	if err != nil {
		t.Fatal(err)
	}
	vs := make([]uint64, ebpf.MustPossibleCPU())
	vs[0] = 41
	if err := m.Put(gen.SluiceRulectrKey{RuleId: 7}, vs, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if n, err := maps.Sum(m, gen.SluiceRulectrKey{RuleId: 7}); err != nil || n != 41 {
		t.Fatalf("sum %d %v", n, err)
	}
}

func roundTripSvcStats(t *testing.T, s *maps.Set) {
	m, err := maps.SvcStats.In(s)
	if err != nil {
		t.Fatal(err)
	}
	vs := make([]gen.SluiceSvcstatsValue, ebpf.MustPossibleCPU())
	vs[0].FwdPackets, vs[len(vs)-1].NewFlows = 3, 2
	if err := m.Put(42, vs, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	got, err := m.Get(42)
	if err != nil || got[0].FwdPackets != 3 || got[len(got)-1].NewFlows != 2 {
		t.Fatalf("got %+v %v", got, err)
	}
}

// A program array holds programs, not data: check its shape.
func checkProgramArray(name string) func(t *testing.T, s *maps.Set) {
	return func(t *testing.T, s *maps.Set) {
		m := s.Map(name)
		if m == nil || m.Type() != ebpf.ProgramArray || m.KeySize() != 4 || m.ValueSize() != 4 {
			t.Fatalf("program array %s: %v", name, m)
		}
	}
}

func roundTripPrefilter(t *testing.T, s *maps.Set) {
	m, err := maps.Prefilter.In(s)
	if err != nil {
		t.Fatal(err)
	}
	k := gen.SluicePrefilterKey{Prefixlen: 16, Addr: gen.NetAddr(netip.MustParseAddr("198.51.0.0"))}
	if err := m.Put(k, gen.SluicePrefilterValue{Flags: 1}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Get(k); err != nil || got.Flags != 1 {
		t.Fatalf("got %+v %v", got, err)
	}
}

// An LPM trie only holds keys whose prefix length is valid and whose bits past
// the prefix are zero, so its round trip uses well-formed keys.
func roundTripLPM(t *testing.T, s *maps.Set) {
	m, err := maps.SrcRanges.In(s)
	if err != nil {
		t.Fatal(err)
	}
	k := gen.SluiceSrcrangeKey{Prefixlen: 56, SvcId: gen.NetUint32(7), Src: gen.NetAddr(netip.MustParseAddr("192.0.2.0"))}
	v := gen.SluiceSrcrangeValue{Flags: 3}
	if err := m.Put(k, v, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Get(k); err != nil || got != v {
		t.Fatalf("got %+v %v", got, err)
	}
}

// The service networks are one LPM trie for both families (IPv4 mapped): a
// ClusterIP inside a ServiceCIDR is found as itself, another address of the
// range as the range.
func roundTripServiceNets(t *testing.T, s *maps.Set) {
	m, err := maps.ServiceNets.In(s)
	if err != nil {
		t.Fatal(err)
	}
	key := func(bits uint32, a string) gen.SluiceSvcnetKey {
		return gen.SluiceSvcnetKey{Prefixlen: bits, Addr: gen.NetAddr6(netip.MustParseAddr(a))}
	}
	rangeV := gen.SluiceSvcnetValue{Kind: gen.SluiceSvcnetKindSVCNET_RANGE}
	clusterIP := gen.SluiceSvcnetValue{Kind: gen.SluiceSvcnetKindSVCNET_CLUSTER_IP}
	for k, v := range map[gen.SluiceSvcnetKey]gen.SluiceSvcnetValue{key(96+12, "10.96.0.0"): rangeV, key(128, "10.96.0.10"): clusterIP} {
		if err := m.Put(k, v, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	for a, want := range map[string]gen.SluiceSvcnetValue{"10.96.0.10": clusterIP, "10.96.0.11": rangeV} {
		if got, err := m.Get(key(128, a)); err != nil || got != want {
			t.Fatalf("lookup of %s: %+v %v, want %+v", a, got, err, want)
		}
	}
}

// The config map is an array: its only key is 0.
func roundTripConfig(t *testing.T, s *maps.Set) {
	m, err := maps.Config.In(s)
	if err != nil {
		t.Fatal(err)
	}
	v := gen.SluiceConfig{NodeIp: gen.NetAddr(netip.MustParseAddr("10.0.0.1")), SnatPortMin: 61000, SnatPortMax: 62000}
	if err := m.Put(0, v, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Get(0); err != nil || got != v {
		t.Fatalf("got %+v %v", got, err)
	}
	if err := m.Put(1, v, ebpf.UpdateAny); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Fatalf("put at index 1 of a 1-entry array: %v", err)
	}
}

// The ring buffer is read, never written from userspace: a reader opens on
// it and, with nothing written, meets its deadline.
func roundTripEvents(t *testing.T, s *maps.Set) {
	r, err := maps.OpenEvents(s)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.SetDeadline(time.Now().Add(10 * time.Millisecond))
	if _, err := r.Read(); !errors.Is(err, maps.ErrNoEvent) {
		t.Fatalf("read on an empty ring buffer: %v, want ErrNoEvent", err)
	}
}

// roundTripPerCPU writes value(cpu) to every CPU's slot 0 of a per-CPU
// array and reads them back.
func roundTripPerCPU[V comparable](def maps.PerCPUDef[uint32, V], value func(cpu int) V) func(*testing.T, *maps.Set) {
	return func(t *testing.T, s *maps.Set) {
		m, err := def.In(s)
		if err != nil {
			t.Fatal(err)
		}
		vs := make([]V, ebpf.MustPossibleCPU())
		for i := range vs {
			vs[i] = value(i)
		}
		if err := m.Put(0, vs, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		got, err := m.Get(0)
		if err != nil || !slices.Equal(got, vs) {
			t.Fatalf("got %+v %v", got, err)
		}
	}
}

// roundTripXDPDecisions writes each CPU's count of one decision and reads
// them back.
func roundTripXDPDecisions(t *testing.T, s *maps.Set) {
	m, err := maps.XDPDecisions.In(s)
	if err != nil {
		t.Fatal(err)
	}
	vs := make([]uint64, ebpf.MustPossibleCPU())
	for i := range vs {
		vs[i] = uint64(i + 1)
	}
	d := gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_FIB
	if err := m.Put(d, vs, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Get(d); err != nil || !slices.Equal(got, vs) {
		t.Fatalf("got %+v %v", got, err)
	}
}

// roundTripXDPDevices writes the loopback interface (a devmap takes only
// interfaces that exist), reads it back and deletes it.
func roundTripXDPDevices(t *testing.T, s *maps.Set) {
	m, err := maps.XDPDevices.In(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Put(1, 1, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Get(1); err != nil || got != 1 {
		t.Fatalf("got %d %v", got, err)
	}
	if err := m.Delete(1); err != nil {
		t.Fatal(err)
	}
}

// roundTripBridge puts a conntrack table of another capacity than the
// pinned one (the old table of a resize) in a bridge's slot 0, reads its id
// back, and empties the slot.
func roundTripBridge(bridge, table string) func(*testing.T, *maps.Set) {
	return func(t *testing.T, s *maps.Set) {
		ct := s.Map(table)
		old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ct.Type(), KeySize: ct.KeySize(), ValueSize: ct.ValueSize(),
			MaxEntries: ct.MaxEntries() / 2, Flags: ct.Flags()})
		if err != nil {
			t.Fatal(err)
		}
		defer old.Close()
		b := s.Map(bridge)
		if err := b.Put(uint32(0), old); err != nil {
			t.Fatalf("%s: put a %s of %d entries: %v", bridge, table, old.MaxEntries(), err)
		}
		info, err := old.Info()
		if err != nil {
			t.Fatal(err)
		}
		want, _ := info.ID()
		var got uint32
		if err := b.Lookup(uint32(0), &got); err != nil || ebpf.MapID(got) != want {
			t.Fatalf("slot 0 holds map %d (%v), want %d", got, err, want)
		}
		if err := b.Delete(uint32(0)); err != nil {
			t.Fatal(err)
		}
	}
}

func roundTripCounters(t *testing.T, s *maps.Set) {
	m, err := maps.Counters.In(s)
	if err != nil {
		t.Fatal(err)
	}
	vs := make([]uint64, ebpf.MustPossibleCPU())
	for i := range vs {
		vs[i] = uint64(i + 1)
	}
	if err := m.Put(gen.SluiceCounterCNT_DROP_SRC_RANGE, vs, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	total, err := maps.Sum(m, gen.SluiceCounterCNT_DROP_SRC_RANGE)
	if want := uint64(len(vs) * (len(vs) + 1) / 2); err != nil || total != want {
		t.Fatalf("sum %d %v, want %d", total, err, want)
	}
}

func TestCatalogueRoundTrips(t *testing.T) {
	set := openSet(t)
	cat, err := maps.Catalogue()
	if err != nil {
		t.Fatal(err)
	}
	if len(cat) == 0 {
		t.Fatal("empty catalogue")
	}
	for _, info := range cat {
		t.Run(info.Name, func(t *testing.T) {
			if info.Doc == "" {
				t.Errorf("map %s has no doc line in the catalogue", info.Name)
			}
			if !strings.HasSuffix(info.Name[:len(info.Name)-1], "_v") {
				t.Errorf("map %s does not end in a layout version _vN", info.Name)
			}
			rt, ok := roundTrips[info.Name]
			if !ok {
				t.Fatalf("map %s has no typed round trip", info.Name)
			}
			rt(t, set)
		})
	}
}

func TestIterateVisitsEveryEntryOnce(t *testing.T) {
	bpftest.Require(t)
	const n = 100_000
	for _, typ := range []ebpf.MapType{ebpf.Hash, ebpf.LRUHash} {
		t.Run(typ.String(), func(t *testing.T) {
			// LRU maps evict from per-CPU free lists before they are nominally
			// full, so give them room: this test is about iteration, not eviction.
			m := newTestMap(t, typ, 4*n)
			keys, vals := make([]uint32, n), make([]uint64, n)
			for i := range keys {
				keys[i], vals[i] = uint32(i)*7+3, uint64(i)<<20
			}
			if w, err := m.BatchUpdate(keys, vals, ebpf.UpdateAny); err != nil || w != n {
				t.Fatalf("batch update: wrote %d: %v", w, err)
			}
			seen := make(map[uint32]int, n)
			err := m.Iterate(func(k uint32, v uint64) bool {
				seen[k]++
				if want := uint64((k-3)/7) << 20; v != want {
					t.Errorf("key %d: value %d, want %d", k, v, want)
				}
				return true
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(seen) != n {
				t.Fatalf("iterate saw %d distinct keys, want %d", len(seen), n)
			}
			for k, c := range seen {
				if c != 1 {
					t.Fatalf("key %d seen %d times", k, c)
				}
			}
		})
	}
}

// LPM tries have no batch lookup: Iterate walks them key by key.
func TestIterateFallsBackForLPMTrie(t *testing.T) {
	bpftest.Require(t)
	type lpmKey struct {
		Prefix uint32
		Addr   [4]byte
	}
	raw, err := ebpf.NewMap(&ebpf.MapSpec{Name: "sl_test_lpm", Type: ebpf.LPMTrie, KeySize: 8, ValueSize: 4, MaxEntries: 100, Flags: 1 /* BPF_F_NO_PREALLOC */})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	m, err := maps.NewMap[lpmKey, uint32](raw)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if err := m.Put(lpmKey{Prefix: 24, Addr: [4]byte{10, byte(i), 0, 0}}, uint32(i), ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	count := 0
	if err := m.Iterate(func(k lpmKey, v uint32) bool { count++; return k.Addr[1] == byte(v) }); err != nil {
		t.Fatal(err)
	}
	if count != 50 {
		t.Fatalf("iterated %d entries, want 50", count)
	}
}

func newTestMap(tb testing.TB, typ ebpf.MapType, capacity uint32) *maps.Map[uint32, uint64] {
	tb.Helper()
	raw, err := ebpf.NewMap(&ebpf.MapSpec{Name: "sl_test", Type: typ, KeySize: 4, ValueSize: 8, MaxEntries: capacity})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { raw.Close() })
	m, err := maps.NewMap[uint32, uint64](raw)
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

func TestNewMapRejectsWrongSizes(t *testing.T) {
	bpftest.Require(t)
	raw, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := maps.NewMap[uint64, uint64](raw); err == nil || !strings.Contains(err.Error(), "key type uint64 is 8 bytes") {
		t.Fatalf("wrong key size: %v", err)
	}
	if _, err := maps.NewMap[uint32, *uint64](raw); err == nil || !strings.Contains(err.Error(), "pointers") {
		t.Fatalf("pointer value: %v", err)
	}
}

func TestFullMapError(t *testing.T) {
	bpftest.Require(t)
	m := newTestMap(t, ebpf.Hash, 4)
	for i := range uint32(4) {
		if err := m.Put(i, 1, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	err := m.Put(99, 1, ebpf.UpdateAny)
	if !errors.Is(err, maps.ErrFull) {
		t.Fatalf("put into full map: %v, want ErrFull", err)
	}
	if !strings.Contains(err.Error(), "map sl_test is full (4 entries)") {
		t.Fatalf("error %q does not say which map is full", err)
	}
	// Overwriting an existing key of a full map still works.
	if err := m.Put(2, 5, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	_, err = m.BatchUpdate([]uint32{100, 101}, []uint64{1, 1}, ebpf.UpdateAny)
	if !errors.Is(err, maps.ErrFull) || !strings.Contains(err.Error(), "is full (4 entries)") {
		t.Fatalf("batch update into full map: %v", err)
	}
}

func TestCachingMapWritesOnlyTheDifference(t *testing.T) {
	bpftest.Require(t)
	const n = 10_000
	m := newTestMap(t, ebpf.Hash, 2*n)
	c := maps.NewCachingMap(m)
	if err := c.LoadDataplaneState(); err != nil {
		t.Fatal(err)
	}
	for i := range uint32(n) {
		c.SetDesired(i, uint64(i))
	}
	st, err := c.ApplyAll()
	if err != nil || st != (maps.ApplyStats{Writes: n}) {
		t.Fatalf("first apply: %+v %v", st, err)
	}
	c.SetDesired(1234, 42)
	st, err = c.ApplyAll()
	if err != nil || st != (maps.ApplyStats{Writes: 1}) {
		t.Fatalf("one change: %+v %v, want exactly one write", st, err)
	}
	if v, _ := m.Get(1234); v != 42 {
		t.Fatalf("map holds %d, want 42", v)
	}
	st, err = c.ApplyAll()
	if err != nil || st != (maps.ApplyStats{}) {
		t.Fatalf("no change: %+v %v", st, err)
	}

	// A fresh cache over the same map adopts the dataplane and writes nothing.
	c2 := maps.NewCachingMap(m)
	if err := c2.LoadDataplaneState(); err != nil {
		t.Fatal(err)
	}
	for i := range uint32(n) {
		c2.SetDesired(i, uint64(i))
	}
	c2.SetDesired(1234, 42)
	if st, err := c2.ApplyAll(); err != nil || st != (maps.ApplyStats{}) {
		t.Fatalf("adopted state: %+v %v, want no writes", st, err)
	}

	// Deletions: keys removed behind the cache's back count as deleted.
	for i := range uint32(10) {
		c2.DeleteDesired(i)
	}
	for i := range uint32(5) {
		if err := m.Delete(i * 2); err != nil {
			t.Fatal(err)
		}
	}
	st, err = c2.ApplyDeletionsOnly()
	if err != nil {
		t.Fatal(err)
	}
	if st.Writes != 0 || st.Deletes != 5 {
		t.Fatalf("deletions: %+v, want 5 deletes (5 were already gone)", st)
	}
	for i := range uint32(10) {
		if _, err := m.Get(i); !errors.Is(err, maps.ErrKeyNotExist) {
			t.Fatalf("key %d still present: %v", i, err)
		}
	}
	if _, ok := c2.GetDataplane(3); ok {
		t.Fatal("cache still lists deleted key 3")
	}
}

// The desired contents are the dataplane cache with pending changes over
// it: reloading the dataplane (after entries were changed, removed or added
// behind the cache's back) keeps them, pending changes included, and one
// ApplyAll then makes the map exactly the desired contents.
func TestCachingMapKeepsDesiredAcrossReload(t *testing.T) {
	bpftest.Require(t)
	m := newTestMap(t, ebpf.Hash, 64)
	c := maps.NewCachingMap(m)
	if err := c.LoadDataplaneState(); err != nil {
		t.Fatal(err)
	}
	want := map[uint32]uint64{}
	for i := range uint32(10) {
		c.SetDesired(i, uint64(100+i))
		want[i] = uint64(100 + i)
	}
	if _, err := c.ApplyAll(); err != nil {
		t.Fatal(err)
	}
	// Pending: a change, a deletion, an addition, and a change back to
	// what the map holds.
	c.SetDesired(1, 1)
	c.DeleteDesired(2)
	c.SetDesired(20, 20)
	c.SetDesired(3, 7)
	c.SetDesired(3, 103)
	want[1], want[20] = 1, 20
	delete(want, 2)
	if c.DesiredLen() != len(want) {
		t.Fatalf("desired length %d, want %d", c.DesiredLen(), len(want))
	}
	// Behind the cache's back: one changed, one removed, one added, and the
	// pending addition already there.
	for k, v := range map[uint32]uint64{4: 9, 30: 30, 20: 20} {
		if err := m.Put(k, v, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Delete(5); err != nil {
		t.Fatal(err)
	}
	if err := c.LoadDataplaneState(); err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		if got, ok := c.GetDesired(k); !ok || got != v {
			t.Fatalf("after the reload, desired %d = %d %v, want %d", k, got, ok, v)
		}
	}
	if _, ok := c.GetDesired(30); ok {
		t.Fatal("an entry added behind the cache's back became desired")
	}
	// Writes: 1 (changed), 4 (restored), 5 (restored); deletes: 2, 30.
	if st := c.Pending(); st != (maps.ApplyStats{Writes: 3, Deletes: 2}) {
		t.Fatalf("pending %+v, want 3 writes and 2 deletes", st)
	}
	if st, err := c.ApplyAll(); err != nil || st != (maps.ApplyStats{Writes: 3, Deletes: 2}) {
		t.Fatalf("apply: %+v %v", st, err)
	}
	got := map[uint32]uint64{}
	if err := m.Iterate(func(k uint32, v uint64) bool { got[k] = v; return true }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the map holds %v, want %v", got, want)
	}
	if c.DesiredLen() != len(want) {
		t.Fatalf("desired length %d, want %d", c.DesiredLen(), len(want))
	}
	c.ClearDesired()
	if st, err := c.ApplyAll(); err != nil || st.Deletes != len(want) || c.DesiredLen() != 0 {
		t.Fatalf("clear: %+v %v, %d desired", st, err, c.DesiredLen())
	}
}

func TestPinnedMapSurvivesReopen(t *testing.T) {
	dir := bpftest.PinDir(t)
	set, err := maps.Open(maps.OpenOptions{PinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	m, err := maps.HostIPs.In(set)
	if err != nil {
		t.Fatal(err)
	}
	key, val := gen.SluiceHostipKey{Addr: 7}, gen.SluiceHostipValue{Flags: 99}
	if err := m.Put(key, val, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	set.Close()

	set2, err := maps.Open(maps.OpenOptions{PinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer set2.Close()
	m2, err := maps.HostIPs.In(set2)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m2.Get(key)
	if err != nil || got != val {
		t.Fatalf("after reopen: %+v %v, want %+v", got, err, val)
	}
}

func TestPinnedMapWithOtherLayoutIsRefused(t *testing.T) {
	dir := bpftest.PinDir(t)
	cat, err := maps.Catalogue()
	if err != nil {
		t.Fatal(err)
	}
	info := cat[0]
	old, err := ebpf.NewMap(&ebpf.MapSpec{Type: info.Type, KeySize: info.KeySize, ValueSize: info.ValueSize + 8, MaxEntries: info.Capacity, Flags: info.Flags})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.Pin(filepath.Join(dir, info.Name)); err != nil {
		t.Fatal(err)
	}
	_, err = maps.Open(maps.OpenOptions{PinDir: dir})
	var le *maps.LayoutError
	if !errors.As(err, &le) {
		t.Fatalf("open over a mismatched pin: %v, want LayoutError", err)
	}
	if le.Map != info.Name || !strings.Contains(err.Error(), info.Name) || !strings.Contains(err.Error(), "value size") {
		t.Fatalf("error does not name the map and mismatch: %v", err)
	}
	// The foreign pin is left alone.
	if _, err := os.Stat(filepath.Join(dir, info.Name)); err != nil {
		t.Fatal(err)
	}
}

func TestStalePinsListsOlderLayouts(t *testing.T) {
	dir := bpftest.PinDir(t)
	old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.Pin(filepath.Join(dir, "sl_hostip_v0")); err != nil {
		t.Fatal(err)
	}
	set, err := maps.Open(maps.OpenOptions{PinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	stale, err := maps.StalePins(dir)
	if err != nil || len(stale) != 1 || stale[0] != "sl_hostip_v0" {
		t.Fatalf("stale pins: %v %v", stale, err)
	}
}

// Counters of an older layout are removed on their own; state is not.
func TestRemoveStaleDisposableKeepsState(t *testing.T) {
	dir := bpftest.PinDir(t)
	for _, name := range []string{"sl_counters_v1", "sl_fe_v0"} {
		old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer old.Close()
		if err := old.Pin(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := maps.RemoveStaleDisposable(dir)
	if err != nil || !slices.Equal(removed, []string{"sl_counters_v1"}) {
		t.Fatalf("removed %v (%v), want the old counters only", removed, err)
	}
	if stale, err := maps.StalePins(dir); err != nil || !slices.Equal(stale, []string{"sl_fe_v0"}) {
		t.Fatalf("stale pins left: %v %v", stale, err)
	}
}

func TestNoCreateOpensOnlyExistingPins(t *testing.T) {
	dir := bpftest.PinDir(t)
	if _, err := maps.Open(maps.OpenOptions{PinDir: dir, NoCreate: true}); err == nil || !strings.Contains(err.Error(), "is not pinned") {
		t.Fatalf("NoCreate on an empty directory: %v", err)
	}
	set, err := maps.Open(maps.OpenOptions{PinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	set.Close()
	set, err = maps.Open(maps.OpenOptions{PinDir: dir, NoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	set.Close()
}

// A pin removed while the agent runs is pinned again from the map the
// programs use, not left for the next start to replace with an empty map.
func TestRepairPinsRestoresRemovedPins(t *testing.T) {
	dir := bpftest.PinDir(t)
	set, err := maps.Open(maps.OpenOptions{PinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	fe, err := maps.Frontends.In(set)
	if err != nil {
		t.Fatal(err)
	}
	k := gen.SluiceFeKey{Addr: gen.NetAddr(netip.MustParseAddr("10.96.0.1")), Port: gen.NetPort(80), Proto: 6}
	if err := fe.Put(k, gen.SluiceFeValue{SvcId: 7}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if repaired, err := set.RepairPins(); err != nil || len(repaired) != 0 {
		t.Fatalf("nothing to repair: %v %v", repaired, err)
	}
	if err := os.Remove(filepath.Join(dir, gen.SluiceMapSlFeV1)); err != nil {
		t.Fatal(err)
	}
	repaired, err := set.RepairPins()
	if err != nil || !slices.Equal(repaired, []string{gen.SluiceMapSlFeV1}) {
		t.Fatalf("repaired %v (%v), want the frontends map", repaired, err)
	}
	again, err := maps.Open(maps.OpenOptions{PinDir: dir, NoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	fe2, err := maps.Frontends.In(again)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := fe2.Get(k); err != nil || v.SvcId != 7 {
		t.Fatalf("the repaired pin is not the live map: %+v %v", v, err)
	}
}

// Every counter of the C enum has a name, read from the object's BTF.
func TestCounterNamesComeFromTheHeader(t *testing.T) {
	names, err := maps.CounterNames()
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != int(gen.SluiceCounterCNT_MAX) {
		t.Fatalf("%d names for %d counters", len(names), gen.SluiceCounterCNT_MAX)
	}
	if names[gen.SluiceCounterCNT_DROP_CT_FULL] != "drop_ct_full" || names[gen.SluiceCounterCNT_DROP_MALFORMED] != "drop_malformed" {
		t.Fatalf("names %v", names)
	}
}

// roundTripMaglev puts a table (an inner map) under a service id and reads
// it back through the outer map.
func roundTripMaglev(t *testing.T, set *maps.Set) {
	outer := set.Map(gen.SluiceMapSlMaglevV1)
	table := make([]uint32, gen.MaglevDefaultTableSize)
	for i := range table {
		table[i] = uint32(i % 7)
	}
	inner, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: uint32(len(table)) * 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	if err := inner.Put(uint32(0), table); err != nil {
		t.Fatal(err)
	}
	if err := outer.Put(uint32(42), inner); err != nil {
		t.Fatal(err)
	}
	var got *ebpf.Map
	if err := outer.Lookup(uint32(42), &got); err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	back := make([]uint32, len(table))
	if err := got.Lookup(uint32(0), back); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, table) {
		t.Fatal("the table read back differs")
	}
	if err := outer.Delete(uint32(42)); err != nil {
		t.Fatal(err)
	}
}

func TestEventStringAndRuleNames(t *testing.T) {
	e := maps.Event{Type: maps.EventDrop, Reason: "drop_policy", Proto: "tcp",
		Src: netip.MustParseAddrPort("198.51.100.9:50000"), Dst: netip.MustParseAddrPort("10.1.2.2:8080"),
		RuleID: 0xffff0001, Hook: "to_wl"}
	if got, want := e.String(), "drop drop_policy tcp 198.51.100.9:50000 -> 10.1.2.2:8080 rule tier-1-default at to_wl"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	for id, want := range map[uint32]string{7: "7", 0xffffffff: "end-of-policy", 0xffff0000: "tier-0-default"} {
		if got := maps.RuleName(id); got != want {
			t.Errorf("rule %#x: %q, want %q", id, got, want)
		}
	}
	raw := make([]byte, 88)
	raw[63] = 9 // the type byte (struct event): unknown
	if _, err := maps.DecodeEvent(raw, nil); err == nil || !strings.Contains(err.Error(), "unknown type 9") {
		t.Errorf("unknown event type: %v", err)
	}
	if _, err := maps.DecodeEvent(raw[:10], nil); err == nil || !strings.Contains(err.Error(), "10 bytes") {
		t.Errorf("short event: %v", err)
	}
}
