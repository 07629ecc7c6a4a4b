package maps

import (
	"errors"
	"fmt"
	"reflect"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ErrKeyNotExist is returned by Get and Delete for a missing key.
var ErrKeyNotExist = ebpf.ErrKeyNotExist

// ErrFull matches (errors.Is) every FullError.
var ErrFull = errors.New("map is full")

// FullError reports an update refused because the map holds MaxEntries entries.
// The kernel says "argument list too long" (E2BIG) or "no space left" (ENOSPC);
// this says which map is full and how big it is.
type FullError struct {
	Map        string
	MaxEntries uint32
}

func (e *FullError) Error() string {
	return fmt.Sprintf("map %s is full (%d entries)", e.Map, e.MaxEntries)
}

func (e *FullError) Is(target error) bool { return target == ErrFull }

// Map is a typed view of a BPF map with key type K and value type V.
//
// K and V must be fixed-size types without pointers whose size equals the map's
// key and value size (the bpf2go-generated structs are). Single-entry operations
// convert keys and values by reinterpreting their memory, with no reflection and
// no allocation; batch operations hand whole slices to the kernel.
//
// Per-CPU maps have one value per CPU; use PerCPUMap for them.
type Map[K comparable, V any] struct {
	m          *ebpf.Map
	name       string
	typ        ebpf.MapType
	maxEntries uint32
}

// NewMap wraps m. It fails when K or V does not match the map's key or value size,
// or when they contain pointers.
func NewMap[K comparable, V any](m *ebpf.Map) (*Map[K, V], error) {
	name := mapName(m)
	if isPerCPU(m.Type()) {
		return nil, fmt.Errorf("map %s: per-CPU map needs maps.PerCPUMap", name)
	}
	if err := checkLayout[K](name, "key", m.KeySize()); err != nil {
		return nil, err
	}
	if err := checkLayout[V](name, "value", m.ValueSize()); err != nil {
		return nil, err
	}
	return &Map[K, V]{m: m, name: name, typ: m.Type(), maxEntries: m.MaxEntries()}, nil
}

func isPerCPU(t ebpf.MapType) bool {
	switch t {
	case ebpf.PerCPUHash, ebpf.PerCPUArray, ebpf.LRUCPUHash, ebpf.PerCPUCGroupStorage:
		return true
	}
	return false
}

func mapName(m *ebpf.Map) string {
	if info, err := m.Info(); err == nil && info.Name != "" {
		return info.Name
	}
	return m.String()
}

// checkLayout is the one place reflection is used: once, when a map is wrapped.
func checkLayout[T any](mapName, what string, size uint32) error {
	var zero T
	typ := reflect.TypeOf(zero)
	if got := typ.Size(); got != uintptr(size) {
		return fmt.Errorf("map %s: %s type %v is %d bytes, the map's %s is %d bytes", mapName, what, typ, got, what, size)
	}
	if hasPointers(typ) {
		return fmt.Errorf("map %s: %s type %v contains pointers", mapName, what, typ)
	}
	return nil
}

func hasPointers(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Map, reflect.String, reflect.Interface,
		reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return true
	case reflect.Array:
		return hasPointers(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if hasPointers(t.Field(i).Type) {
				return true
			}
		}
	}
	return false
}

// ptr hands a key or value to the kernel as a raw pointer: cilium/ebpf passes an
// unsafe.Pointer straight to the syscall, with no reflection and no copy. NewMap
// has checked that the type's size equals the map's.
func ptr[T any](v *T) unsafe.Pointer { return unsafe.Pointer(v) }

// Name is the kernel's name of the map.
func (m *Map[K, V]) Name() string { return m.name }

// MaxEntries is the map's capacity.
func (m *Map[K, V]) MaxEntries() uint32 { return m.maxEntries }

// Unwrap returns the underlying map.
func (m *Map[K, V]) Unwrap() *ebpf.Map { return m.m }

// Get returns the value stored under k, or an error matching ErrKeyNotExist.
func (m *Map[K, V]) Get(k K) (V, error) {
	var v V
	if err := m.m.Lookup(ptr(&k), ptr(&v)); err != nil {
		return v, fmt.Errorf("map %s: lookup: %w", m.name, err)
	}
	return v, nil
}

// Lookup reads the value of *k into *v. With k and v pointing at memory the
// caller reuses, a lookup allocates nothing (scanners do millions of them).
func (m *Map[K, V]) Lookup(k *K, v *V) error {
	if err := m.m.Lookup(ptr(k), ptr(v)); err != nil {
		return fmt.Errorf("map %s: lookup: %w", m.name, err)
	}
	return nil
}

// Put stores v under k. flags is ebpf.UpdateAny, UpdateNoExist or UpdateExist.
func (m *Map[K, V]) Put(k K, v V, flags ebpf.MapUpdateFlags) error {
	if err := m.m.Update(ptr(&k), ptr(&v), flags); err != nil {
		return m.updateError(err)
	}
	return nil
}

// Delete removes k; a missing key is an error matching ErrKeyNotExist.
func (m *Map[K, V]) Delete(k K) error {
	if err := m.m.Delete(ptr(&k)); err != nil {
		return fmt.Errorf("map %s: delete: %w", m.name, err)
	}
	return nil
}

// updateError names the map and turns the kernel's "full" errnos into FullError.
func (m *Map[K, V]) updateError(err error) error {
	return wrapUpdateError(m.name, m.typ, m.maxEntries, err)
}

// UpdateError is what a typed map returns for a failed update of m (named
// name): a *FullError when the kernel refused it for want of room. For code
// that writes a map the typed maps cannot express (a map of maps).
func UpdateError(name string, m *ebpf.Map, err error) error {
	return wrapUpdateError(name, m.Type(), m.MaxEntries(), err)
}

func wrapUpdateError(name string, typ ebpf.MapType, maxEntries uint32, err error) error {
	switch {
	case errors.Is(err, unix.E2BIG) && (typ == ebpf.Array || typ == ebpf.PerCPUArray || typ == ebpf.ProgramArray):
		return fmt.Errorf("map %s: update: index out of range (%d entries): %w", name, maxEntries, err)
	case errors.Is(err, unix.E2BIG), errors.Is(err, unix.ENOSPC):
		return fmt.Errorf("%w: %w", &FullError{Map: name, MaxEntries: maxEntries}, err)
	}
	return fmt.Errorf("map %s: update: %w", name, err)
}

// batchSupported tells whether the kernel implements BPF_MAP_*_BATCH for a map
// type; the others (LPM tries among them) are walked key by key.
func batchSupported(t ebpf.MapType) bool {
	switch t {
	case ebpf.Hash, ebpf.LRUHash, ebpf.PerCPUHash, ebpf.LRUCPUHash, ebpf.Array, ebpf.PerCPUArray:
		return true
	}
	return false
}

// iterateChunk is how many entries one batch lookup asks for. Hash maps need room
// for a whole bucket; thousands is far above any bucket's length.
const iterateChunk = 4096

// Iterate calls fn for every entry until fn returns false. It uses batch lookups
// when the map type supports them and falls back to walking keys one by one.
//
// Like any walk of a live map, entries added or removed meanwhile may or may not
// be seen; every entry present throughout is seen exactly once (for hash maps with
// batch lookup, which walks bucket by bucket).
func (m *Map[K, V]) Iterate(fn func(k K, v V) bool) error {
	if batchSupported(m.typ) {
		err := m.iterateBatch(fn)
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return err
		}
	}
	return m.iterateKeys(fn)
}

func (m *Map[K, V]) iterateBatch(fn func(k K, v V) bool) error {
	keys := make([]K, iterateChunk)
	vals := make([]V, iterateChunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			if !fn(keys[i], vals[i]) {
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

func (m *Map[K, V]) iterateKeys(fn func(k K, v V) bool) error {
	var k K
	var v V
	it := m.m.Iterate()
	for it.Next(ptr(&k), ptr(&v)) {
		if !fn(k, v) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("map %s: iterate: %w", m.name, err)
	}
	return nil
}

// BatchUpdate stores vals[i] under keys[i] for every i, in batches where the map
// type supports it. It returns how many entries were written before an error.
func (m *Map[K, V]) BatchUpdate(keys []K, vals []V, flags ebpf.MapUpdateFlags) (int, error) {
	if len(keys) != len(vals) {
		return 0, fmt.Errorf("map %s: batch update: %d keys but %d values", m.name, len(keys), len(vals))
	}
	if len(keys) == 0 {
		return 0, nil
	}
	if !batchSupported(m.typ) {
		for i := range keys {
			if err := m.Put(keys[i], vals[i], flags); err != nil {
				return i, err
			}
		}
		return len(keys), nil
	}
	n, err := m.m.BatchUpdate(keys, vals, &ebpf.BatchOptions{ElemFlags: uint64(flags)})
	if err != nil {
		return n, m.updateError(err)
	}
	return n, nil
}

// BatchDelete removes keys. It stops at the first error, including a missing key
// (ErrKeyNotExist), and returns how many were deleted before it.
func (m *Map[K, V]) BatchDelete(keys []K) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	if !batchSupported(m.typ) {
		for i := range keys {
			if err := m.Delete(keys[i]); err != nil {
				return i, err
			}
		}
		return len(keys), nil
	}
	n, err := m.m.BatchDelete(keys, nil)
	if err != nil {
		return n, fmt.Errorf("map %s: batch delete: %w", m.name, err)
	}
	return n, nil
}
