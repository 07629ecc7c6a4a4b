package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// PerCPUMap is a typed view of a per-CPU map: each key has one value per
// possible CPU. Lookups are not on any hot path (counters are read by people and
// metrics), so values go through cilium/ebpf's per-CPU marshalling.
type PerCPUMap[K comparable, V any] struct {
	m          *ebpf.Map
	name       string
	maxEntries uint32
	cpus       int
}

// NewPerCPUMap wraps a per-CPU map after checking the key and value sizes.
func NewPerCPUMap[K comparable, V any](m *ebpf.Map) (*PerCPUMap[K, V], error) {
	name := mapName(m)
	if !isPerCPU(m.Type()) {
		return nil, fmt.Errorf("map %s: %v is not a per-CPU map", name, m.Type())
	}
	if err := checkLayout[K](name, "key", m.KeySize()); err != nil {
		return nil, err
	}
	if err := checkLayout[V](name, "value", m.ValueSize()); err != nil {
		return nil, err
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", name, err)
	}
	return &PerCPUMap[K, V]{m: m, name: name, maxEntries: m.MaxEntries(), cpus: cpus}, nil
}

// Name is the kernel's name of the map.
func (m *PerCPUMap[K, V]) Name() string { return m.name }

// MaxEntries is the map's capacity.
func (m *PerCPUMap[K, V]) MaxEntries() uint32 { return m.maxEntries }

// Get returns the values of k, one per possible CPU.
func (m *PerCPUMap[K, V]) Get(k K) ([]V, error) {
	var vs []V
	if err := m.m.Lookup(ptr(&k), &vs); err != nil {
		return nil, fmt.Errorf("map %s: lookup: %w", m.name, err)
	}
	return vs, nil
}

// Put stores vs (one value per possible CPU) under k.
func (m *PerCPUMap[K, V]) Put(k K, vs []V, flags ebpf.MapUpdateFlags) error {
	if err := m.m.Update(ptr(&k), vs, flags); err != nil {
		return wrapUpdateError(m.name, m.m.Type(), m.maxEntries, err)
	}
	return nil
}

// Iterate calls fn with every key and its per-CPU values until fn returns
// false. It reads in batches where the kernel can (an array of 10,000
// counters is a handful of syscalls, not 10,000); vs is only valid during
// the call. An array's keys come in order, so a caller that needs the first
// ids only stops early.
func (m *PerCPUMap[K, V]) Iterate(fn func(k K, vs []V) bool) error {
	if batchSupported(m.m.Type()) {
		err := m.iterateBatch(fn)
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return err
		}
	}
	var k K
	var vs []V
	it := m.m.Iterate()
	for it.Next(ptr(&k), &vs) {
		if !fn(k, vs) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("map %s: iterate: %w", m.name, err)
	}
	return nil
}

// perCPUChunk is how many keys one batch lookup of a per-CPU map asks for:
// the values are cpus times as many, so fewer than a plain map's.
const perCPUChunk = 512

func (m *PerCPUMap[K, V]) iterateBatch(fn func(k K, vs []V) bool) error {
	keys := make([]K, perCPUChunk)
	vals := make([]V, perCPUChunk*m.cpus)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			if !fn(keys[i], vals[i*m.cpus:(i+1)*m.cpus:(i+1)*m.cpus]) {
				return nil
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("map %s: iterate: %w", m.name, err)
		}
	}
}

// Counter is a per-CPU counter value.
type Counter interface{ ~uint32 | ~uint64 }

// Sum adds the per-CPU values of k.
func Sum[K comparable, V Counter](m *PerCPUMap[K, V], k K) (uint64, error) {
	vs, err := m.Get(k)
	if err != nil {
		return 0, err
	}
	var total uint64
	for _, v := range vs {
		total += uint64(v)
	}
	return total, nil
}
