package maps

import (
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
	return &PerCPUMap[K, V]{m: m, name: name, maxEntries: m.MaxEntries()}, nil
}

// Name is the kernel's name of the map.
func (m *PerCPUMap[K, V]) Name() string { return m.name }

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

// Iterate calls fn with every key and its per-CPU values until fn returns false.
func (m *PerCPUMap[K, V]) Iterate(fn func(k K, vs []V) bool) error {
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
