package maps

import (
	"fmt"
	"strings"

	"github.com/cilium/ebpf/btf"
	"github.com/sluice-net/sluice/gen"
)

// CounterNames names every datapath counter (enum counter in
// bpf/include/counters.h, read from the object's BTF, so the C header stays
// the one source of truth): CNT_DROP_MALFORMED becomes "drop_malformed".
func CounterNames() (map[gen.SluiceCounter]string, error) {
	spec, err := gen.Spec()
	if err != nil {
		return nil, err
	}
	var enum *btf.Enum
	if err := spec.Types.TypeByName("counter", &enum); err != nil {
		return nil, fmt.Errorf("datapath counters: %w", err)
	}
	names := map[gen.SluiceCounter]string{}
	for _, v := range enum.Values {
		if v.Name == "CNT_MAX" {
			continue
		}
		names[gen.SluiceCounter(v.Value)] = strings.ToLower(strings.TrimPrefix(v.Name, "CNT_"))
	}
	return names, nil
}

// ReadCounters sums every datapath counter over the CPUs, by name. It reads
// one small per-CPU array (CNT_MAX entries): cheap enough for every scrape.
func ReadCounters(m *PerCPUMap[gen.SluiceCounter, uint64], names map[gen.SluiceCounter]string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(names))
	err := m.Iterate(func(k gen.SluiceCounter, vs []uint64) bool {
		if name, ok := names[k]; ok {
			var sum uint64
			for _, v := range vs {
				sum += v
			}
			out[name] = sum
		}
		return true
	})
	return out, err
}
