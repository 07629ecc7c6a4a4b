package bench

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
)

// BenchmarkSustainedConnRate dials without a pause, for far longer than the
// baselines' windows: a client that opens connections as fast as it can,
// closes each first, and reaches the same backends both through their
// Services and directly at their pod addresses, alternating every 5 s (a
// client of a Service and of its headless twin). Closed flows are held after
// their FINs (Sluice: 30 s; netfilter: 120 s in TIME_WAIT), so the conntrack
// table fills unless the proxy evicts flows that are over. It reports the
// rate, the dials that failed, and for Sluice the new flows its datapath
// refused because the table was full.
//
// Short mode (CI): 10 s. SLUICE_BENCH_FULL=1: 90 s.
func BenchmarkSustainedConnRate(b *testing.B) {
	bpftest.Require(b)
	if _, _, err := apiservertest.Binaries(); err != nil {
		b.Skip(err)
	}
	sluice, kubeProxy := proxyBinaries(b)
	d := 10 * time.Second
	if os.Getenv("SLUICE_BENCH_FULL") == "1" {
		d = 90 * time.Second
	}
	for _, proxy := range []string{"sluice", "nftables"} {
		b.Run(proxy, func(b *testing.B) {
			e := newBaselineEnv(b)
			e.startProxy(b, proxy, sluice, kubeProxy)
			ips := e.createServices(b, "s", connTargets, e.backendIPs[0])
			e.waitFor(b, ips[len(ips)-1]+":80", "b1", time.Minute)
			var services []string
			for _, ip := range ips {
				services = append(services, ip+":80")
			}
			for b.Loop() {
			}
			var all dials
			worst := 0.0
			for round := 0; all.elapsed < d; round++ {
				targets := services
				if round%2 == 1 {
					targets = e.directTargets()
				}
				var r dials
				e.dialFor(targets, 5*time.Second, &r)
				rate, _, _ := r.rate()
				if round == 0 || rate < worst {
					worst = rate
				}
				all.lat, all.errs, all.elapsed = append(all.lat, r.lat...), all.errs+r.errs, all.elapsed+r.elapsed
			}
			rate, _, p99 := all.rate()
			b.ReportMetric(rate, "conn/s")
			b.ReportMetric(worst, "worst-5s-conn/s")
			b.ReportMetric(p99, "p99-us")
			b.ReportMetric(float64(all.errs), "dial-errors")
			if proxy == "sluice" {
				b.ReportMetric(float64(counter(b, e.pinDir, gen.SluiceCounterCNT_DROP_CT_FULL)), "ct-full-drops")
			}
		})
	}
}

// counter sums one datapath counter of a Sluice agent's pins over the CPUs.
func counter(b testing.TB, pinDir string, c gen.SluiceCounter) uint64 {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, gen.SluiceMapSlCountersV7), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	sum, err := counterSum(m, c)
	if err != nil {
		b.Fatal(err)
	}
	return sum
}
