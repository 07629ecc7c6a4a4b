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
	Doc      string `json:"doc"`
}

// Usages counts the entries of every map of the set (arrays count their
// capacity).
func Usages(s *Set) ([]Usage, error) {
	cat, err := Catalogue()
	if err != nil {
		return nil, err
	}
	var out []Usage
	for _, info := range cat {
		m := s.Map(info.Name)
		if m == nil {
			continue
		}
		u := Usage{Name: info.Name, Type: m.Type().String(), Capacity: m.MaxEntries(), Doc: info.Doc}
		switch m.Type() {
		case ebpf.Array, ebpf.PerCPUArray:
			u.Entries = int(m.MaxEntries())
		default:
			key := make([]byte, m.KeySize())
			it := m.Iterate()
			var discard []byte
			if isPerCPU(m.Type()) {
				var vs [][]byte
				for it.Next(&key, &vs) {
					u.Entries++
				}
			} else {
				for it.Next(&key, &discard) {
					u.Entries++
				}
			}
			if err := it.Err(); err != nil {
				return nil, err
			}
		}
		out = append(out, u)
	}
	return out, nil
}
