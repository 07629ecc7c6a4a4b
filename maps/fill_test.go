package maps_test

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
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
		gen.SluiceMapSlCountersV7: int64(gen.SluiceCounterCNT_MAX), // a per-CPU array
		gen.SluiceMapSlSvcstatsV1: int64(set.Map(gen.SluiceMapSlSvcstatsV1).MaxEntries()),
	})
	for _, k := range keys[:600] {
		if err := ct.Delete(k); err != nil {
			t.Fatal(err)
		}
	}
	check(map[string]int64{gen.SluiceMapSlCtV2: 400})
}

// Each map's kernel memory is what the kernel charges for it: a
// preallocated conntrack table at least its capacity times an entry, a
// per-CPU array at least that times the CPUs, an empty LPM trie nothing;
// `sluice maps` (Usages) reports the same figures.
func TestKernelBytes(t *testing.T) {
	set := openSet(t)
	kernel, err := set.KernelBytes()
	if err != nil {
		t.Fatal(err)
	}
	ct := set.Map(gen.SluiceMapSlCtV2)
	if least := uint64(ct.MaxEntries()) * uint64(ct.KeySize()+ct.ValueSize()); kernel[gen.SluiceMapSlCtV2] < least {
		t.Errorf("%s: %d bytes, less than its %d entries of %d bytes", gen.SluiceMapSlCtV2, kernel[gen.SluiceMapSlCtV2], ct.MaxEntries(), ct.KeySize()+ct.ValueSize())
	}
	stats := set.Map(gen.SluiceMapSlSvcstatsV1)
	if least := uint64(stats.MaxEntries()) * uint64(stats.ValueSize()) * uint64(ebpf.MustPossibleCPU()); kernel[gen.SluiceMapSlSvcstatsV1] < least {
		t.Errorf("%s: %d bytes, less than %d", gen.SluiceMapSlSvcstatsV1, kernel[gen.SluiceMapSlSvcstatsV1], least)
	}
	usages, err := maps.Usages(set, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range usages {
		// An LPM trie allocates per entry: empty, it holds nothing.
		if (u.KernelBytes == 0 && u.Type != ebpf.LPMTrie.String()) || u.KernelBytes != kernel[u.Name] {
			t.Errorf("%s (%s): Usages says %d kernel bytes, KernelBytes %d", u.Name, u.Type, u.KernelBytes, kernel[u.Name])
		}
	}
}

// A node without IPv6 opens its IPv6 tables at IPv6MinimalCapacity: the
// kernel holds at least 130 MiB less for the set, and a conntrack flag's
// size does not undo it (MergeCapacity keeps the smaller).
func TestIPv6MinimalCapacitySavesKernelMemory(t *testing.T) {
	total := func(set *maps.Set) uint64 {
		kernel, err := set.KernelBytes()
		if err != nil {
			t.Fatal(err)
		}
		var sum uint64
		for _, n := range kernel {
			sum += n
		}
		return sum
	}
	full := openSet(t)
	capacity := maps.ConntrackCapacity(65536, 131072, 4)
	maps.MergeCapacity(capacity, maps.IPv6MinimalCapacity())
	if capacity[gen.SluiceMapSlCt6V1] != 8192 || capacity[gen.SluiceMapSlCtV2] != 2*262144 {
		t.Fatalf("merged capacities %v", capacity)
	}
	minimal, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(t), Capacity: maps.IPv6MinimalCapacity()})
	if err != nil {
		t.Fatal(err)
	}
	defer minimal.Close()
	if got := minimal.Map(gen.SluiceMapSlCt6V1).MaxEntries(); got != 8192 {
		t.Fatalf("%s: capacity %d", gen.SluiceMapSlCt6V1, got)
	}
	f, m := total(full), total(minimal)
	t.Logf("kernel memory of the maps: %.1f MiB with full IPv6 tables, %.1f MiB minimal", float64(f)/(1<<20), float64(m)/(1<<20))
	if f < m+130<<20 {
		t.Fatalf("minimal IPv6 tables save %.1f MiB, want at least 130", float64(f-m)/(1<<20))
	}
}
