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
	return enumNames[gen.SluiceCounter]("counter", "CNT_")
}

// XDPDecisionNames names the XDP acceleration's decisions (enum
// xdp_accel_decision in bpf/include/xdp_accel.h): XDP_ACCEL_PASS_NO_FLOW
// becomes "pass_no_flow".
func XDPDecisionNames() (map[gen.SluiceXdpAccelDecision]string, error) {
	return enumNames[gen.SluiceXdpAccelDecision]("xdp_accel_decision", "XDP_ACCEL_")
}

// enumNames reads an enum of the datapath's BTF, each value's name lower
// case without prefix, leaving out the <prefix>MAX bound.
func enumNames[K ~uint32](name, prefix string) (map[K]string, error) {
	spec, err := gen.Spec()
	if err != nil {
		return nil, err
	}
	var enum *btf.Enum
	if err := spec.Types.TypeByName(name, &enum); err != nil {
		return nil, fmt.Errorf("enum %s: %w", name, err)
	}
	names := map[K]string{}
	for _, v := range enum.Values {
		if v.Name == prefix+"MAX" {
			continue
		}
		names[K(v.Value)] = strings.ToLower(strings.TrimPrefix(v.Name, prefix))
	}
	return names, nil
}

// ReadCounters sums every datapath counter over the CPUs, by name. It reads
// one small per-CPU array (CNT_MAX entries): cheap enough for every scrape.
func ReadCounters(m *PerCPUMap[gen.SluiceCounter, uint64], names map[gen.SluiceCounter]string) (map[string]uint64, error) {
	return sumPerCPU(m, names)
}

// ReadXDPDecisions sums the XDP acceleration's decisions over the CPUs, by
// name (a per-CPU array of XDP_ACCEL_MAX entries).
func ReadXDPDecisions(m *PerCPUMap[gen.SluiceXdpAccelDecision, uint64], names map[gen.SluiceXdpAccelDecision]string) (map[string]uint64, error) {
	return sumPerCPU(m, names)
}

func sumPerCPU[K comparable](m *PerCPUMap[K, uint64], names map[K]string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(names))
	err := m.Iterate(func(k K, vs []uint64) bool {
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
