package metrics_test

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-net/sluice/kubeproxy/metrics"
)

// The datapath's counters are read at each scrape, not copied into the
// registry: the collector calls its read function (the agent's sums the
// per-CPU counters map, maps.ReadCounters) and exports one family.
func ExampleNewCounterCollector() {
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCounterCollector(func() (map[string]uint64, error) {
		return map[string]uint64{"drop_ct_full": 0, "nat_new_flow": 42}, nil
	}))
	families, err := reg.Gather()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			fmt.Println(f.GetName(), m.GetLabel()[0].GetValue(), m.GetCounter().GetValue())
		}
	}
	// Output:
	// sluice_datapath_events_total drop_ct_full 0
	// sluice_datapath_events_total nat_new_flow 42
}
