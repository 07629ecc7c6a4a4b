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

// BenchmarkMinSyncPeriod measures, for the agent's --min-sync-period
// candidates, against a real API server: how long after the last of n
// Services (and their slices) was created it is programmed (program-ms), the
// agent's CPU time over the whole burst (cpu-ms), and how long one later
// EndpointSlice change takes (change-ms). SLUICE_BENCH_FULL=1: 1,000
// Services and six periods (bench/README.md); otherwise (CI) 100 Services,
// no minimum and the default. It chose the default: bursts must not wait,
// and coalescing must not cost a core.
func BenchmarkMinSyncPeriod(b *testing.B) {
	bpftest.Require(b)
	if _, _, err := apiservertest.Binaries(); err != nil {
		b.Skip(err)
	}
	sluice, kubeProxy := proxyBinaries(b)
	n := 100
	if os.Getenv("SLUICE_BENCH_FULL") == "1" {
		n = 1_000
	}
	for _, period := range minSyncCandidates() {
		b.Run(fmt.Sprintf("services=%d/min-sync-period=%s", n, period), func(b *testing.B) {
			var programMs, cpuMs, changeMs float64
			first := true
			for b.Loop() {
				if !first {
					continue // one measurement: an API server run per period
				}
				first = false
				e := newBaselineEnv(b)
				proc := e.startProxy(b, "sluice", sluice, kubeProxy, "--min-sync-period="+period)
				probe := e.createServices(b, "probe", 1, e.backendIPs[0])
				e.waitFor(b, probe[0]+":80", "b1", 60*time.Second)
				cpu0 := processCPU(b, proc.Pid)
				ips := e.createServices(b, "s", n, e.backendIPs[0])
				programMs = float64(e.waitFor(b, ips[len(ips)-1]+":80", "b1", 5*time.Minute).Microseconds()) / 1000
				cpuMs = float64(processCPU(b, proc.Pid)-cpu0) / float64(time.Millisecond)
				time.Sleep(2 * time.Second) // idle: the change is not part of a burst
				changeMs = e.change(b, ips, n)
			}
			b.ReportMetric(programMs, "program-ms")
			b.ReportMetric(cpuMs, "cpu-ms")
			b.ReportMetric(changeMs, "change-ms")
		})
	}
}

// processCPU is a process's user and system time so far.
func processCPU(b testing.TB, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name (which may hold spaces) in parentheses.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// minSyncCandidates are the periods measured (SLUICE_MIN_SYNC=a,b chooses
// them).
func minSyncCandidates() []string {
	if s := os.Getenv("SLUICE_MIN_SYNC"); s != "" {
		return strings.Split(s, ",")
	}
	if os.Getenv("SLUICE_BENCH_FULL") == "1" {
		return []string{"0s", "5ms", "20ms", "50ms", "100ms", "1s"}
	}
	return []string{"0s", "20ms"}
}
