package maps

import (
	"github.com/cilium/ebpf"
)

// Usage is one map's fill level.
type Usage struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	Entries  int    `json:"entries"`
	Capacity uint32 `json:"capacity"`
	// KernelBytes is the memory the kernel holds for the map (0 where it
	// does not say).
	KernelBytes uint64 `json:"kernel_bytes"`
	Doc         string `json:"doc"`
}

// Usages counts the entries of every map of the set (arrays count their
// capacity; a ring buffer's capacity is bytes, and it has no entries to
// count). With a Filler the kernel's counts are read (no walk); without, or
// for a map the kernel does not count, the map is walked.
func Usages(s *Set, f *Filler) ([]Usage, error) {
	cat, err := Catalogue()
	if err != nil {
		return nil, err
	}
	var counted map[string]int64
	if f != nil {
		if counted, err = f.Fill(s); err != nil {
			return nil, err
		}
	}
	kernel, err := s.KernelBytes()
	if err != nil {
		return nil, err
	}
	var out []Usage
	for _, info := range cat {
		m := s.Map(info.Name)
		if m == nil {
			continue
		}
		u := Usage{Name: info.Name, Type: m.Type().String(), Capacity: m.MaxEntries(), KernelBytes: kernel[info.Name], Doc: info.Doc}
		if n, ok := counted[info.Name]; ok {
			u.Entries = int(n)
		} else if u.Entries, err = walkCount(m); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// walkCount counts a map's entries by iterating over them.
func walkCount(m *ebpf.Map) (int, error) {
	switch m.Type() {
	case ebpf.Array, ebpf.PerCPUArray, ebpf.ProgramArray:
		return int(m.MaxEntries()), nil
	case ebpf.RingBuf:
		return 0, nil
	}
	n := 0
	key := make([]byte, m.KeySize())
	it := m.Iterate()
	if isPerCPU(m.Type()) {
		var vs [][]byte
		for it.Next(&key, &vs) {
			n++
		}
	} else {
		var discard []byte
		for it.Next(&key, &discard) {
			n++
		}
	}
	return n, it.Err()
}
