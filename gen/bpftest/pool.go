package bpftest

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/sluice-net/sluice/gen"
)

// The verifier takes about six seconds to load every Sluice program on a
// two-core machine, and most tests need a datapath with nothing in its maps
// rather than a new load. So a test binary keeps the datapaths its tests are
// done with, their maps emptied, and hands them to the next tests. A test gets
// maps exactly as a fresh load leaves them: everything a test writes lives in
// maps. The one exception is the programs' clock cache (.bss, sl_clock),
// which only ever holds the kernel's time of the current tick.
var idle struct {
	sync.Mutex
	objs []*gen.SluiceObjects
}

// acquire returns an idle datapath or loads a new one.
func acquire() (*gen.SluiceObjects, error) {
	idle.Lock()
	if n := len(idle.objs); n > 0 {
		objs := idle.objs[n-1]
		idle.objs = idle.objs[:n-1]
		idle.Unlock()
		return objs, nil
	}
	idle.Unlock()
	return gen.Load(gen.LoadOptions{})
}

// release empties objs' maps and keeps them for the next test. A datapath
// whose program array holds programs is closed instead; one that cannot be
// emptied is closed too, and the error says which map.
func release(objs *gen.SluiceObjects) error {
	// sl_spanwriter_v1 holds sl_write_span from the load on (Empty leaves
	// it): a test may have replaced or removed it.
	if err := objs.SlSpanwriterV1.Put(uint32(0), objs.SlWriteSpan); err != nil {
		objs.Close()
		return fmt.Errorf("restore %s: %w", gen.SluiceMapSlSpanwriterV1, err)
	}
	if err := Empty(&objs.SluiceMaps); err != nil {
		objs.Close()
		if errors.Is(err, errNotReusable) {
			return nil
		}
		return err
	}
	idle.Lock()
	idle.objs = append(idle.objs, objs)
	idle.Unlock()
	return nil
}

// Empty returns every map of a loaded datapath to the state a load leaves it
// in: hash, LRU, LPM and map-in-map maps with no entry or map, arrays all zeros and
// the event ring buffer read to its end. A program array must hold no program
// (requireNoProgram); the error says so otherwise. sl_spanwriter_v1, which
// the load fills with sl_write_span, is left as it is.
func Empty(maps *gen.SluiceMaps) error {
	v := reflect.ValueOf(maps).Elem()
	for i := range v.NumField() {
		m, ok := v.Field(i).Interface().(*ebpf.Map)
		if !ok || m == nil || m == maps.SlSpanwriterV1 {
			continue
		}
		if err := emptyMap(m); err != nil {
			return fmt.Errorf("empty map %s: %w", v.Type().Field(i).Tag.Get("ebpf"), err)
		}
	}
	return nil
}

func emptyMap(m *ebpf.Map) error {
	switch m.Type() {
	case ebpf.Array, ebpf.PerCPUArray:
		return zeroArray(m)
	case ebpf.ProgramArray:
		return requireNoProgram(m)
	case ebpf.RingBuf:
		return drainRing(m)
	case ebpf.ArrayOfMaps:
		return emptySlots(m)
	default:
		return deleteEveryKey(m)
	}
}

// emptySlots clears every slot of an array of maps: its indices always
// exist, so walking its keys would never end with none.
func emptySlots(m *ebpf.Map) error {
	for i := range m.MaxEntries() {
		if err := m.Delete(i); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("slot %d: %w", i, err)
		}
	}
	return nil
}

// errNotReusable: the datapath is closed rather than emptied.
var errNotReusable = errors.New("not reusable")

// requireNoProgram refuses a program array that holds a program. Deleting
// them one at a time would re-patch, for each one, every direct tail call of
// every program still in the array: with the hundreds of programs of a
// rule-by-rule policy that takes minutes, while closing the datapath
// releases them at once.
func requireNoProgram(m *ebpf.Map) error {
	var id uint32
	for i := range m.MaxEntries() {
		err := m.Lookup(i, &id)
		if err == nil {
			return fmt.Errorf("%w: index %d holds program %d", errNotReusable, i, id)
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// zeroArray writes a zero value at every index in one batch.
func zeroArray(m *ebpf.Map) error {
	n := int(m.MaxEntries())
	values := n
	if m.Type() == ebpf.PerCPUArray {
		cpus, err := ebpf.PossibleCPU()
		if err != nil {
			return err
		}
		values *= cpus
	}
	keys := make([]uint32, n)
	for i := range keys {
		keys[i] = uint32(i)
	}
	zero := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(int(m.ValueSize()), reflect.TypeFor[byte]())), values, values)
	_, err := m.BatchUpdate(keys, zero.Interface(), nil)
	return err
}

// deleteEveryKey collects the keys first (deleting while walking a hash map
// can restart the walk), then deletes them in one batch where the map type
// has batch operations (LPM tries have not).
func deleteEveryKey(m *ebpf.Map) error {
	var keys [][]byte
	var key any // nil asks for the first key
	for {
		next, err := m.NextKeyBytes(key)
		if err != nil {
			return err
		}
		if next == nil {
			break
		}
		keys = append(keys, next)
		key = next
	}
	if len(keys) == 0 {
		return nil
	}
	batch := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(int(m.KeySize()), reflect.TypeFor[byte]())), len(keys), len(keys))
	for i, k := range keys {
		reflect.Copy(batch.Index(i), reflect.ValueOf(k))
	}
	if _, err := m.BatchDelete(batch.Interface(), nil); err == nil {
		return nil
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// drainRing reads the ring buffer to its end, so the next reader starts after
// the records a previous test left.
func drainRing(m *ebpf.Map) error {
	r, err := ringbuf.NewReader(m)
	if err != nil {
		return err
	}
	defer r.Close()
	r.SetDeadline(time.Now())
	var rec ringbuf.Record
	for {
		err := r.ReadInto(&rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
