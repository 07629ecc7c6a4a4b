package maps_test

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// The iterator's counts are the maps' entries, for a hash map (1,000
// entries, then 400 after deletions), an LRU hash, an LPM trie and a map of
// maps; arrays report their capacity; and the same counts come from the
// walk `sluice maps` did before.
func TestFillCountsWithoutAWalk(t *testing.T) {
	set := openSet(t)
	f, err := maps.NewFiller()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	ct, err := maps.Conntrack.In(set)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]gen.SluiceCtKey, 1000)
	for i := range keys {
		keys[i] = gen.SluiceCtKey{Saddr: gen.NetAddr(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})), Sport: uint16(i), Proto: 6}
		if err := ct.Put(keys[i], gen.SluiceCtValue{Type: gen.SluiceCtTypeCT_FORWARD}, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	aff, err := maps.Affinity.In(set)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := aff.Put(gen.SluiceAffKey{SvcId: uint32(i + 1)}, gen.SluiceAffValue{}, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	src, err := maps.SrcRanges.In(set)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		k := gen.SluiceSrcrangeKey{Prefixlen: 56, SvcId: gen.NetUint32(7), Src: gen.NetAddr(netip.AddrFrom4([4]byte{192, 0, byte(i), 0}))}
		if err := src.Put(k, gen.SluiceSrcrangeValue{}, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}

	check := func(want map[string]int64) {
		t.Helper()
		got, err := f.Fill(set)
		if err != nil {
			t.Fatal(err)
		}
		for name, n := range want {
			if got[name] != n {
				t.Errorf("%s: %d entries, want %d", name, got[name], n)
			}
		}
		// The walk agrees on every map both count.
		usages, err := maps.Usages(set, nil) // walked
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range usages {
			if n, ok := got[u.Name]; ok && n != int64(u.Entries) {
				t.Errorf("%s: the iterator counts %d, a walk %d", u.Name, n, u.Entries)
			}
		}
	}
	check(map[string]int64{
		gen.SluiceMapSlCtV2:       1000,
		gen.SluiceMapSlAffV1:      5,
		gen.SluiceMapSlSrcrangeV1: 3,
		gen.SluiceMapSlCt6V1:      0,
		gen.SluiceMapSlConfigV1:   1,                               // an array: its capacity
		gen.SluiceMapSlCountersV6: int64(gen.SluiceCounterCNT_MAX), // a per-CPU array
		gen.SluiceMapSlSvcstatsV1: int64(set.Map(gen.SluiceMapSlSvcstatsV1).MaxEntries()),
	})
	for _, k := range keys[:600] {
		if err := ct.Delete(k); err != nil {
			t.Fatal(err)
		}
	}
	check(map[string]int64{gen.SluiceMapSlCtV2: 400})
}
