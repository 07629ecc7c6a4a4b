package conntrack_test

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

// BenchmarkScan1M: a full scan of 1,000,000 entries (500,000 flows), 10% of them
// expired. Each op restores the expired flows, so every scan deletes 100,000
// entries. Reports ns per entry; B/op is the garbage per scan.
func BenchmarkScan1M(b *testing.B) {
	bpftest.Require(b)
	const flows = 500_000
	spec, err := gen.Spec()
	if err != nil {
		b.Fatal(err)
	}
	ms := spec.Maps[maps.Conntrack.Name].Copy()
	ms.Type = ebpf.Hash // no LRU eviction while the benchmark fills it
	ms.MaxEntries = 2*flows + 1024
	raw, err := ebpf.NewMap(ms)
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	ct, err := maps.NewMap[gen.SluiceCtKey, gen.SluiceCtValue](raw)
	if err != nil {
		b.Fatal(err)
	}
	now := conntrack.Monotonic()
	old := now - 2*time.Hour
	keys := make([]gen.SluiceCtKey, 0, 2*flows)
	vals := make([]gen.SluiceCtValue, 0, 2*flows)
	var expiredKeys []gen.SluiceCtKey
	var expiredVals []gen.SluiceCtValue
	for i := range flows {
		fwd := gen.SluiceCtKey{Saddr: uint32(i), Daddr: 0x0a60000a, Sport: 1000, Dport: 80, Proto: 6}
		rev := gen.SluiceCtKey{Saddr: 0x0a02000a, Daddr: uint32(i), Sport: 8080, Dport: 1000, Proto: 6}
		seen := uint64(now)
		if i%10 == 0 {
			seen = uint64(old)
		}
		fv := gen.SluiceCtValue{Created: uint64(old), LastSeen: seen, Peer: rev, Type: gen.SluiceCtTypeCT_FORWARD, TcpSeen: 0x12}
		rv := gen.SluiceCtValue{Created: uint64(old), LastSeen: seen, Peer: fwd, Type: gen.SluiceCtTypeCT_REVERSE, TcpSeen: 0x12}
		keys, vals = append(keys, fwd, rev), append(vals, fv, rv)
		if i%10 == 0 {
			expiredKeys, expiredVals = append(expiredKeys, fwd, rev), append(expiredVals, fv, rv)
		}
	}
	if _, err := ct.BatchUpdate(keys, vals, ebpf.UpdateAny); err != nil {
		b.Fatal(err)
	}
	sc, err := conntrack.NewScanner(conntrack.Options{Conntrack: ct, Clock: func() time.Duration { return now }})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	entries := 0
	for b.Loop() {
		st, err := sc.Scan()
		if err != nil {
			b.Fatal(err)
		}
		if st.Entries != 2*flows || st.Deleted[conntrack.ReasonExpired] != flows/10 {
			b.Fatalf("scan saw %d entries, expired %v", st.Entries, st.Deleted)
		}
		entries += st.Entries
		b.StopTimer()
		if _, err := ct.BatchUpdate(expiredKeys, expiredVals, ebpf.UpdateAny); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(entries), "ns/entry")
}
