package metrics_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy/metrics"
	"github.com/sluice-net/sluice/nat"
)

// BenchmarkServiceScrape: one scrape of the per-service collector, encoded
// as Prometheus' text format, at N service ports of which `active` carried
// traffic (the rest idle), for each --service-metrics mode. Reports the
// bytes a scrape serves (scrape-KB) and its time: the read of the counters
// array, the bookkeeping and the encoding.
func BenchmarkServiceScrape(b *testing.B) {
	bpftest.Require(b)
	_, stats := openSvcStats(b)
	cpus := ebpf.MustPossibleCPU()
	for _, n := range []int{1_000, 10_000, 100_000} {
		ids := make(map[nat.ServicePortName][]uint32, n)
		for i := range n {
			ids[nat.ServicePortName{Namespace: fmt.Sprintf("team-%d", i%50), Name: fmt.Sprintf("service-%d", i), Port: "http"}] = []uint32{uint32(i + 1)}
		}
		for _, active := range []int{10, n} {
			// Traffic on the first `active` ids, none on the others.
			for id := uint32(1); id <= min(uint32(n), stats.MaxEntries()-1); id++ {
				vs := make([]gen.SluiceSvcstatsValue, cpus)
				if int(id) <= active {
					vs[0] = gen.SluiceSvcstatsValue{FwdPackets: 10, FwdBytes: 1000, RevPackets: 10, RevBytes: 5000, NewFlows: 2}
				}
				if err := stats.Put(id, vs, ebpf.UpdateAny); err != nil {
					b.Fatal(err)
				}
			}
			for _, mode := range []metrics.ServiceSeries{metrics.ServiceSeriesActive, metrics.ServiceSeriesAll, metrics.ServiceSeriesNone} {
				b.Run(fmt.Sprintf("services=%d/active=%d/%s", n, active, mode), func(b *testing.B) {
					c, err := metrics.NewServiceCollector(metrics.ServiceCollectorOptions{
						IDs: fromMap(ids), Stats: stats, Series: mode})
					if err != nil {
						b.Fatal(err)
					}
					reg := prometheus.NewRegistry()
					reg.MustRegister(c)
					var out bytes.Buffer
					for b.Loop() {
						out.Reset()
						families, err := reg.Gather()
						if err != nil {
							b.Fatal(err)
						}
						enc := expfmt.NewEncoder(&out, expfmt.NewFormat(expfmt.TypeTextPlain))
						for _, f := range families {
							if err := enc.Encode(f); err != nil {
								b.Fatal(err)
							}
						}
					}
					b.ReportMetric(float64(out.Len())/1000, "scrape-KB")
				})
			}
		}
	}
}
