package bench

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
	"golang.org/x/sync/errgroup"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// snatChurnBackends is how many backend pods the SNAT churn benchmark's
// Services share: pods 0..7 (10.200.0.2 .. 10.207.0.2, the cluster CIDR
// 10.200.0.0/13); the client is pod 8 (10.208.0.2), outside it.
const snatChurnBackends = 8

// BenchmarkSNATChurn is issue 46's run: a client outside the cluster's pod
// CIDR, so that both proxies masquerade its ClusterIP flows to the node's
// address (kube-proxy with --cluster-cidr, Sluice the same), dials as fast as
// it can with 4 workers and the kernel's default ephemeral range, against a
// real API server, kube-proxy nftables in its own node beside Sluice, and
// the same client dialling the backends with no proxy at all. Four phases,
// each for the phase's length:
//   - servers close first (an HTTP/1.0 server, nginx closing idle
//     keep-alives), so each connection's tuple is held in TIME_WAIT at its
//     backend: 16 Services in turn, then one Service;
//   - clients close first (they hold TIME_WAIT themselves): 16 Services,
//     then one.
//
// Without a proxy, "16 Services" are 16 backend sockets (8 pods, 2 ports)
// and "one Service" one socket: as many addresses as the client's kernel
// sees through the proxies, which is what bounds a client that closes first
// (it does not reuse a port toward the same address for 60 s). The last
// phase dials a 17th Service (or socket), which the client has not yet
// closed connections to.
//
// Reported per phase: the rate; the proxy process's CPU (in CPUs: its
// scanner, sync and metrics, not the datapath, which runs in the packets'
// softirq time); the dials that failed (no answer in 3 s); the dials the
// client's kernel refused for want of a local port (a client closing first
// toward one address: its own TIME_WAIT, with or without a proxy); SYN
// retransmits; the backends' PAWS rejects and listen overflows. For Sluice
// also the flows refused for want of a SNAT port, the ports drawn, and its
// conntrack scanner's work: flows dropped early, flows cut to the guard of
// their server's TIME_WAIT, and the entries at the phase's end.
//
// Short mode (CI): 10 s a phase. SLUICE_BENCH_FULL=1: 75 s a phase (5
// minutes in all). SLUICE_CHURN_PHASE sets another length, and
// SLUICE_CHURN_SERVICES=n has the API server hold n more Services of 10
// endpoints each (issue 46's 1,000 and 10,000), created before the churn's.
// SLUICE_BENCH_BPF_STATS=1 adds the datapath's CPU and time per connection.
func BenchmarkSNATChurn(b *testing.B) {
	bpftest.Require(b)
	if _, _, err := apiservertest.Binaries(); err != nil {
		b.Skip(err)
	}
	sluice, kubeProxy := proxyBinaries(b)
	d := 10 * time.Second
	if os.Getenv("SLUICE_BENCH_FULL") == "1" {
		d = 75 * time.Second
	}
	if v := os.Getenv("SLUICE_CHURN_PHASE"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			b.Fatalf("SLUICE_CHURN_PHASE=%q: %v", v, err)
		}
	}
	var more int
	if v := os.Getenv("SLUICE_CHURN_SERVICES"); v != "" {
		var err error
		if more, err = strconv.Atoi(v); err != nil || more < 0 {
			b.Fatalf("SLUICE_CHURN_SERVICES=%q: want a count of Services", v)
		}
	}
	for _, proxy := range []string{"sluice", "nftables", "no-proxy"} {
		b.Run(proxy, func(b *testing.B) {
			e, client := newSNATChurnEnv(b, proxy != "no-proxy")
			// 16 targets each, and the one the last phase dials: one
			// the client has not closed connections to already, so that
			// it starts with every port free toward it, as the others.
			var closeFirst, clientFirst []string
			var oneClientFirst string
			var proc *os.Process
			if proxy == "no-proxy" {
				for _, ip := range e.backendIPs {
					closeFirst = append(closeFirst, addrs([]string{ip}, 8080)[0], addrs([]string{ip}, 8082)[0])
					clientFirst = append(clientFirst, addrs([]string{ip}, 8081)[0], addrs([]string{ip}, 8083)[0])
				}
				oneClientFirst = addrs(e.backendIPs[:1], 8085)[0]
			} else {
				proc = e.startProxy(b, proxy, sluice, kubeProxy, "--cluster-cidr=10.200.0.0/13", "--metrics-bind-address=127.0.0.1:10249")
				e.createIdleServices(b, more)
				ips := e.createChurnServices(b, 17, e.backendIPs)
				closeFirst, clientFirst, oneClientFirst = addrs(ips[:16], 80), addrs(ips[:16], 81), addrs(ips[16:], 81)[0]
			}
			// The datapath's own time, on request (progstats_test.go).
			var stats io.Closer
			if proxy == "sluice" {
				if stats = enableRunTimeStats(b); stats != nil {
					defer stats.Close()
				}
			}
			for b.Loop() {
			}
			for _, phase := range []struct {
				name    string
				targets []string
				run     func(*bpftest.NetNS, []string, int, time.Duration) bpftest.ClientResult
			}{
				{"16-services", closeFirst, bpftest.RunClients},
				{"1-service", closeFirst[:1], bpftest.RunClients},
				{"16-services-client-closes", clientFirst, bpftest.RunClientsClosingFirst},
				{"1-service-client-closes", []string{oneClientFirst}, bpftest.RunClientsClosingFirst},
			} {
				before, backendsBefore := e.synRetrans(), backendDrops(b, e.backends)
				var cpuBefore time.Duration
				if proc != nil {
					cpuBefore = processCPU(b, proc.Pid)
				}
				var drawnBefore, dropsBefore uint64
				var scanBefore map[string]float64
				var runsBefore map[ebpf.ProgramID]programRun
				if stats != nil {
					runsBefore = programRuns(b, "sl_")
				}
				if proxy == "sluice" {
					scanBefore = e.metricValues(b, append(scannerSeries, dropSeries)...)
					drawnBefore = counter(b, e.pinDir, gen.SluiceCounterCNT_SNAT_PORT_DRAWN)
					dropsBefore = counter(b, e.pinDir, gen.SluiceCounterCNT_DROP_SNAT_PORTS)
				}
				res := phase.run(client, phase.targets, 4, d)
				if stats != nil { // the datapath's share of the 2 CPUs, and its time per connection
					total, byName := programRunsSince(runsBefore, programRuns(b, "sl_"))
					b.ReportMetric(total.time.Seconds()/res.Elapsed.Seconds(), phase.name+"-bpf-cpus")
					if conns := float64(res.OK + res.Failed); conns > 0 {
						b.ReportMetric(float64(total.time.Nanoseconds())/conns, phase.name+"-bpf-ns/conn")
						for _, p := range byName {
							b.Logf("%s: %s: %.2f runs per connection, %.0f ns a run", phase.name, p.name, float64(p.runs)/conns, float64(p.time.Nanoseconds())/float64(p.runs))
						}
					}
				}
				b.ReportMetric(res.Rate(), phase.name+"-conn/s")
				b.ReportMetric(float64(res.Failed), phase.name+"-failed")
				b.ReportMetric(float64(res.NoLocalPort), phase.name+"-client-out-of-ports")
				if proc != nil { // the proxy's own process: its share of the 2 CPUs
					b.ReportMetric((processCPU(b, proc.Pid)-cpuBefore).Seconds()/res.Elapsed.Seconds(), phase.name+"-proxy-cpus")
				}
				b.ReportMetric(e.synRetrans()-before, phase.name+"-syn-retrans")
				// Why a SYN waited: a backend refused it against a
				// TIME_WAIT tuple (PAWS), or its listen queue overflowed.
				backendsAfter := backendDrops(b, e.backends)
				b.ReportMetric(float64(backendsAfter["PAWSTimewait"]-backendsBefore["PAWSTimewait"]), phase.name+"-paws-rejects")
				b.ReportMetric(float64(backendsAfter["ListenOverflows"]-backendsBefore["ListenOverflows"]), phase.name+"-listen-overflows")
				if proxy == "sluice" {
					b.ReportMetric(float64(counter(b, e.pinDir, gen.SluiceCounterCNT_DROP_SNAT_PORTS)-dropsBefore), phase.name+"-snat-drops")
					b.ReportMetric(float64(counter(b, e.pinDir, gen.SluiceCounterCNT_SNAT_PORT_DRAWN)-drawnBefore), phase.name+"-ports-drawn")
					scan := e.metricValues(b, append(scannerSeries, dropSeries)...)
					for i, what := range []string{"early-drops", "cut-to-guard", "ct-entries"} {
						v := scan[scannerSeries[i]]
						if i < 2 { // counters: the phase's
							v -= scanBefore[scannerSeries[i]]
						}
						b.ReportMetric(v, phase.name+"-"+what)
					}
					// Any packet the datapath dropped, by reason.
					for name, v := range scan {
						if strings.HasPrefix(name, strings.TrimSuffix(dropSeries, "*")) && v != scanBefore[name] {
							b.Logf("sluice %s: %s +%.0f", phase.name, name, v-scanBefore[name])
						}
					}
				}
				if res.Failed > 0 {
					b.Logf("%s %s: %d of %d connections failed; first: %v", proxy, phase.name, res.Failed, res.OK+res.Failed, res.FirstErr)
				}
			}
		})
	}
}

// newSNATChurnEnv is a node with snatChurnBackends backend pods, each
// serving on :8080 and :8082 a server that closes first and on :8081 and
// :8083 one that waits for its client to close (the first pod also on
// :8085), and the client pod outside the cluster CIDR; withAPI: an API
// server in the node too.
func newSNATChurnEnv(b testing.TB, withAPI bool) (*baselineEnv, *bpftest.NetNS) {
	e := &baselineEnv{node: bpftest.NewNetNS(b)}
	e.node.Run("sysctl", "-qw", "net.ipv4.ip_forward=1")
	for i := range snatChurnBackends {
		ns, ip := e.addPod(b, i)
		e.backends, e.backendIPs = append(e.backends, ns), append(e.backendIPs, ip)
		name := fmt.Sprintf("b%d", i)
		bpftest.ServeCloseFirst(b, ns, name, ":8080")
		bpftest.ServeCloseFirst(b, ns, name, ":8082")
		bpftest.ServeTCP(b, ns, name, ":8081")
		bpftest.ServeTCP(b, ns, name, ":8083")
		if i == 0 {
			bpftest.ServeTCP(b, ns, name, ":8085")
		}
	}
	client, _ := e.addPod(b, snatChurnBackends)
	e.client = client
	if withAPI {
		e.api = apiservertest.StartIn(b, e.node)
	}
	return e, client
}

// createChurnServices creates n Services, each reaching every backend:
// port 80 the servers that close first (8080), port 81 those that wait for
// the client (8081). It waits until the last answers.
func (e *baselineEnv) createChurnServices(b testing.TB, n int, backends []string) []string {
	ctx := context.Background()
	var ips []string
	for i := range n {
		name := fmt.Sprintf("churn%d", i)
		svc, err := e.api.Client.CoreV1().Services("default").Create(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1.ServiceSpec{Ports: []v1.ServicePort{
				{Name: "close", Port: 80, Protocol: v1.ProtocolTCP},
				{Name: "ask", Port: 81, Protocol: v1.ProtocolTCP}}}}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		sl := slice(name, 8080, backends...)
		sl.Ports[0].Name = ptr("close")
		sl.Ports = append(sl.Ports, discovery.EndpointPort{Name: ptr("ask"), Port: ptr[int32](8081), Protocol: ptr(v1.ProtocolTCP)})
		if _, err := e.api.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		ips = append(ips, svc.Spec.ClusterIP)
	}
	for port, dial := range map[uint16]func(*bpftest.NetNS, []string, int, time.Duration) bpftest.ClientResult{
		80: bpftest.RunClients, 81: bpftest.RunClientsClosingFirst} {
		last := netip.AddrPortFrom(netip.MustParseAddr(ips[len(ips)-1]), port).String()
		deadline := time.Now().Add(time.Minute)
		for dial(e.client, []string{last}, 1, 50*time.Millisecond).OK == 0 {
			if time.Now().After(deadline) {
				b.Fatalf("%s never answered", last)
			}
		}
	}
	return ips
}

// createIdleServices creates n Services of 10 endpoints each (addresses
// nothing serves: no client dials them), 8 at a time, as a cluster's other
// workloads would have; the proxies program them all.
func (e *baselineEnv) createIdleServices(tb testing.TB, n int) {
	var endpoints []string
	for i := range 10 {
		endpoints = append(endpoints, fmt.Sprintf("10.207.100.%d", i+1))
	}
	var g errgroup.Group
	g.SetLimit(8)
	for i := range n {
		g.Go(func() error {
			name := fmt.Sprintf("idle%d", i)
			ctx := context.Background()
			if _, err := e.api.Client.CoreV1().Services("default").Create(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}, metav1.CreateOptions{}); err != nil {
				return err
			}
			_, err := e.api.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice(name, 8080, endpoints...), metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatalf("create %d idle Services: %v", n, err)
	}
}

func addrs(ips []string, port int) []string {
	var out []string
	for _, ip := range ips {
		out = append(out, netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(port)).String())
	}
	return out
}

// dropSeries are the datapath's drop counters.
const dropSeries = `sluice_datapath_events_total{event="drop_*`

// scannerSeries are the agent's conntrack scanner series the churn reports.
var scannerSeries = []string{
	`sluice_conntrack_deleted_total{reason="early-drop"}`,
	`sluice_conntrack_deleted_total{reason="guard-only"}`,
	`sluice_conntrack_entries{map="sl_ct_v2"}`,
}

// metricValues scrapes the proxy's /metrics (127.0.0.1:10249 in the node
// namespace) for the values of the series named whole, labels included, or
// starting with one that ends in '*'; a series not exported yet (a gauge
// before the first scan) reads 0.
func (e *baselineEnv) metricValues(b testing.TB, series ...string) map[string]float64 {
	out, err := exec.Command("ip", "netns", "exec", e.node.Name, "curl", "-sSf",
		"-H", "Accept: text/plain;version=0.0.4", "http://127.0.0.1:10249/metrics").Output()
	if err != nil {
		b.Fatalf("scrape the proxy's metrics: %v", err)
	}
	wanted := func(name string) bool {
		for _, s := range series {
			if prefix, ok := strings.CutSuffix(s, "*"); ok && strings.HasPrefix(name, prefix) || name == s {
				return true
			}
		}
		return false
	}
	values := map[string]float64{}
	for line := range strings.Lines(string(out)) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || strings.HasPrefix(name, "#") || !wanted(name) {
			continue
		}
		if values[name], err = strconv.ParseFloat(value, 64); err != nil {
			b.Fatalf("metric %s: %q: %v", name, value, err)
		}
	}
	return values
}

// backendDrops sums the backends' PAWSTimewait and ListenOverflows.
func backendDrops(b testing.TB, backends []*bpftest.NetNS) map[string]uint64 {
	sum := map[string]uint64{}
	for _, ns := range backends {
		v, err := bpftest.Netstat(ns, "TcpExt", "PAWSTimewait", "ListenOverflows")
		if err != nil {
			b.Fatal(err)
		}
		for k, n := range v {
			sum[k] += n
		}
	}
	return sum
}
