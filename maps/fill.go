package maps

import (
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/sluice-net/sluice/gen"
)

// Filler reads how many entries each map holds from the kernel's own counts
// (bpf/mapfill.c, an iterator over every map of the host), so a map of a
// million entries costs what an empty one does: no walk. Hash maps (also LRU
// and per-CPU ones, and maps of maps) and LPM tries are counted; an array
// always holds its capacity.
type Filler struct {
	objs gen.MapfillObjects
	iter *link.Iter
}

// NewFiller loads the iterator (kernel 6.6 or newer: the
// bpf_map_sum_elem_count kfunc).
func NewFiller() (*Filler, error) {
	f := &Filler{}
	if err := gen.LoadMapfillObjects(&f.objs, nil); err != nil {
		return nil, fmt.Errorf("map fill iterator: %w", err)
	}
	l, err := link.AttachIter(link.IterOptions{Program: f.objs.SlMapFill})
	if err != nil {
		f.objs.Close()
		return nil, fmt.Errorf("map fill iterator: %w", err)
	}
	f.iter = l
	return f, nil
}

// Close releases the iterator.
func (f *Filler) Close() error {
	f.iter.Close()
	return f.objs.Close()
}

// counts runs the iterator once: each map's entries by map id, -1 where
// the kernel keeps no count.
func (f *Filler) counts() (map[ebpf.MapID]int64, error) {
	rd, err := f.iter.Open()
	if err != nil {
		return nil, fmt.Errorf("map fill iterator: %w", err)
	}
	defer rd.Close()
	raw, err := io.ReadAll(rd)
	if err != nil {
		return nil, fmt.Errorf("map fill iterator: %w", err)
	}
	const recLen = 16 // struct map_fill
	out := make(map[ebpf.MapID]int64, len(raw)/recLen)
	for ; len(raw) >= recLen; raw = raw[recLen:] {
		out[ebpf.MapID(binary.NativeEndian.Uint32(raw))] = int64(binary.NativeEndian.Uint64(raw[8:]))
	}
	return out, nil
}

// Fill returns the entries of each map of s by name. Arrays report their
// capacity; a map the kernel does not count is left out.
func (f *Filler) Fill(s *Set) (map[string]int64, error) {
	counts, err := f.counts()
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(s.maps))
	for name, m := range s.maps {
		if isArray(m.Type()) {
			out[name] = int64(m.MaxEntries())
			continue
		}
		id, ok, err := s.mapID(name, m)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if n, ok := counts[id]; ok && n >= 0 {
			out[name] = n
		}
	}
	return out, nil
}

func isArray(t ebpf.MapType) bool {
	switch t {
	case ebpf.Array, ebpf.PerCPUArray, ebpf.ProgramArray:
		return true
	}
	return false
}

// Clone makes an unpinned map like m; withEntries copies m's entries into
// it. A dry run (package trace) writes to clones of the maps the datapath
// writes, so the live ones stay as they are.
func Clone(m *ebpf.Map, withEntries bool) (*ebpf.Map, error) {
	spec := &ebpf.MapSpec{Name: "sl_trace_copy", Type: m.Type(), KeySize: m.KeySize(), ValueSize: m.ValueSize(),
		MaxEntries: m.MaxEntries(), Flags: m.Flags()}
	c, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, err
	}
	if !withEntries {
		return c, nil
	}
	key := make([]byte, m.KeySize())
	var value []byte
	it := m.Iterate()
	for it.Next(&key, &value) {
		if err := c.Put(key, value); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := it.Err(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// MaglevTableSize is the slots of the set's Maglev tables, which the map's
// kernel name carries (sl_maglev<slots>, openMaglevTables).
func MaglevTableSize(s *Set) (uint32, error) {
	m := s.Map(gen.SluiceMapSlMaglevV1)
	if m == nil {
		return 0, nil
	}
	info, err := m.Info()
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimPrefix(info.Name, "sl_maglev"), 10, 32)
	if err != nil {
		return 0, nil // not named by its size: the object's default
	}
	return uint32(n), nil
}
