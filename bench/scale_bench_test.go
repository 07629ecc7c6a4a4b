package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
)

// scaleServiceCIDR holds 100,000 ClusterIPs and more (the test API server's
// default /16 holds 65,534), apart from the pods' 10.20x and the endpoint
// addresses' 10.10x.
const scaleServiceCIDR = "10.64.0.0/12"

// BenchmarkProgrammedAtScale: each proxy already running while N Services
// × 10 endpoints are created through a real API server, as `kubectl apply`
// and the EndpointSlice controller write them (createServicesWithEndpoints),
// then one more Service and its EndpointSlice, the last objects. It
// measures, for Sluice and kube-proxy nftables in the same run:
//   - after-last-ms: from the last object written until a client reaches
//     it, which is when the proxy has caught up with everything before it;
//   - change-ms: then one EndpointSlice change until a client sees it;
//   - cpu-s: the proxy's CPU time from the first object to the last one
//     programmed;
//   - read-MB: the bytes the proxy read over the same span (/proc/PID/io
//     rchar: its lists and watches of the API server, nearly all of it);
//   - rss-MB at the end.
//
// The N objects arrive two ways: via=api creates them through the API
// server; via=etcd writes them straight into its etcd, which its watch
// cache follows (storeServicesWithEndpoints): the API server creates a
// Service in O(N), so 100,000 through it take hours. The last objects are
// created through the API server either way.
//
// CI: 100 Services. SLUICE_BENCH_FULL=1: 10,000 and 100,000.
// SLUICE_BENCH_SCALE_SIZES=a,b chooses the sizes, SLUICE_BENCH_SCALE_VIA
// one way; SLUICE_BENCH_SCALE_WAIT bounds the wait for the last object
// (default 10m): a proxy that takes longer is reported with timed-out 1 and
// the bound as its time.
func BenchmarkProgrammedAtScale(b *testing.B) {
	bpftest.Require(b)
	if _, _, err := apiservertest.Binaries(); err != nil {
		b.Skip(err)
	}
	sluice, kubeProxy := proxyBinaries(b)
	sizes := []int{100}
	if os.Getenv("SLUICE_BENCH_FULL") == "1" {
		sizes = []int{10_000, 100_000}
	}
	if s := os.Getenv("SLUICE_BENCH_SCALE_SIZES"); s != "" {
		sizes = nil
		for f := range strings.SplitSeq(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				b.Fatalf("SLUICE_BENCH_SCALE_SIZES: %v", err)
			}
			sizes = append(sizes, n)
		}
	}
	wait := 10 * time.Minute
	if s := os.Getenv("SLUICE_BENCH_SCALE_WAIT"); s != "" {
		var err error
		if wait, err = time.ParseDuration(s); err != nil {
			b.Fatalf("SLUICE_BENCH_SCALE_WAIT: %v", err)
		}
	}
	vias := []string{"api", "etcd"}
	if s := os.Getenv("SLUICE_BENCH_SCALE_VIA"); s != "" {
		vias = []string{s}
	}
	for _, n := range sizes {
		for _, via := range vias {
			for _, proxy := range []string{"sluice", "nftables"} {
				b.Run(fmt.Sprintf("services=%d/via=%s/%s", n, via, proxy), func(b *testing.B) {
					var at programmedAtScale
					measured := false
					for b.Loop() {
						if !measured { // once: b.N's growth reuses it
							at, measured = programmedAt(b, proxy, via, n, sluice, kubeProxy, wait), true
						}
					}
					b.ReportMetric(at.createS, "create-s")
					b.ReportMetric(at.afterLastMs, "after-last-ms")
					b.ReportMetric(at.timedOut, "timed-out")
					b.ReportMetric(at.changeMs, "change-ms")
					b.ReportMetric(at.cpuS, "cpu-s")
					b.ReportMetric(at.readMB, "read-MB")
					b.ReportMetric(at.rss.total, "rss-MB")
				})
			}
		}
	}
}

// programmedAtScale is what programmedAt measures of a proxy.
type programmedAtScale struct {
	createS, afterLastMs, timedOut float64
	changeMs, cpuS, readMB         float64
	rss                            residentMemory
}

func programmedAt(b *testing.B, proxy, via string, n int, sluice, kubeProxy string, wait time.Duration) programmedAtScale {
	e := newDirectEnv(b)
	e.api = apiservertest.StartIn(b, e.node, apiservertest.ServiceCIDR(scaleServiceCIDR))
	p := e.startProxy(b, proxy, sluice, kubeProxy)
	// The proxy has listed the empty cluster and programs what it is told.
	first := e.createServices(b, "first", 1, e.backendIPs[0])
	e.waitFor(b, first[0]+":80", "b1", 2*time.Minute)

	cpu, read := processCPU(b, p.Pid), readBytes(b, p.Pid)
	start := time.Now()
	switch via {
	case "api":
		e.createServicesWithEndpoints(b, n, 10)
	case "etcd":
		e.storeServicesWithEndpoints(b, n, 10)
	default:
		b.Fatalf("SLUICE_BENCH_SCALE_VIA=%q: api or etcd", via)
	}
	var at programmedAtScale
	at.createS = time.Since(start).Seconds()
	probe := e.createServices(b, "probe", 1, e.backendIPs[0])
	took, ok := e.answersWithin(probe[0]+":80", "b1", wait)
	at.afterLastMs = float64(took.Microseconds()) / 1000
	if !ok {
		at.timedOut = 1
		b.Logf("%s: the last Service of %d did not answer within %v", proxy, n, wait)
		return at
	}
	at.cpuS = (processCPU(b, p.Pid) - cpu).Seconds()
	at.readMB = float64(readBytes(b, p.Pid)-read) / 1e6
	at.rss = readResidentMemory(b, p.Pid)
	b.Logf("%s: %d Services created in %.0f s; the last programmed %.0f ms after it was written", proxy, n, at.createS, at.afterLastMs)

	time.Sleep(time.Second) // the sync that programmed the probe settles
	at.changeMs = e.timeOneChange(b, probe[0])
	return at
}

// readBytes is what a process has read through read(2) and its kin, sockets
// included (/proc/PID/io rchar).
func readBytes(b *testing.B, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "rchar:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				b.Fatalf("/proc/%d/io: %q: %v", pid, line, err)
			}
			return n
		}
	}
	b.Fatalf("/proc/%d/io has no rchar", pid)
	return 0
}
