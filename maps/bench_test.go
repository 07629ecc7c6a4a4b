package maps_test

import (
	"testing"

	"github.com/cilium/ebpf"
)

const benchEntries = 100_000

func benchData() ([]uint32, []uint64) {
	keys, vals := make([]uint32, benchEntries), make([]uint64, benchEntries)
	for i := range keys {
		keys[i], vals[i] = uint32(i), uint64(i)
	}
	return keys, vals
}

// BenchmarkPut: one syscall per entry, 100,000 entries per op.
func BenchmarkPut(b *testing.B) {
	m := newTestMap(b, ebpf.Hash, benchEntries)
	keys, vals := benchData()
	b.ReportAllocs()
	for b.Loop() {
		for i := range keys {
			if err := m.Put(keys[i], vals[i], ebpf.UpdateAny); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchEntries), "ns/entry")
}

// BenchmarkBatchPut: BatchUpdate of all 100,000 entries per op.
func BenchmarkBatchPut(b *testing.B) {
	m := newTestMap(b, ebpf.Hash, benchEntries)
	keys, vals := benchData()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.BatchUpdate(keys, vals, ebpf.UpdateAny); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchEntries), "ns/entry")
}

// BenchmarkIterate: a full walk of 100,000 entries per op.
func BenchmarkIterate(b *testing.B) {
	m := newTestMap(b, ebpf.Hash, benchEntries)
	keys, vals := benchData()
	if _, err := m.BatchUpdate(keys, vals, ebpf.UpdateAny); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		if err := m.Iterate(func(uint32, uint64) bool { n++; return true }); err != nil {
			b.Fatal(err)
		}
		if n != benchEntries {
			b.Fatalf("iterated %d entries", n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchEntries), "ns/entry")
}
