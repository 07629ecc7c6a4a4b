package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
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
// real API server. Three nodes side by side, each with its own pods: Sluice,
// kube-proxy nftables, and no proxy at all (the client dials the backends).
// Four phases, each for the phase's length:
//   - servers close first (an HTTP/1.0 server, nginx closing idle
//     keep-alives), so each connection's tuple is held in TIME_WAIT at its
//     backend: 16 Services in turn, then one Service;
//   - clients close first (they hold TIME_WAIT themselves): 16 Services,
//     then one.
//
// Within a phase the three nodes take turns (2 s, SLUICE_CHURN_TURN) until
// each has dialled for the phase's length, so that all three meet the same
// moments of this VM, whose speed varies by a quarter from one minute to the
// next: runs one after the other measured kube-proxy ahead of Sluice in one
// and behind it in the next. Turns spread each node's flows over three
// times the time, so its conntrack table fills a third as fast;
// SLUICE_CHURN_TURN=0 has each node dial the whole phase in one turn, at
// the full rate a node sees in the field, one node after the other.
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
// SLUICE_CHURN_SERVICES=n has the API servers hold n more Services of 10
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
	turn := 2 * time.Second
	if v := os.Getenv("SLUICE_CHURN_TURN"); v != "" {
		var err error
		if turn, err = time.ParseDuration(v); err != nil {
			b.Fatalf("SLUICE_CHURN_TURN=%q: %v", v, err)
		}
	}
	var nodes []*churnNode
	for _, proxy := range []string{"sluice", "nftables", "no-proxy"} {
		nodes = append(nodes, newChurnNode(b, proxy, sluice, kubeProxy, more))
	}
	// The API servers and etcd settle after thousands of writes (etcd
	// snapshots, the watch cache): a proxy that programs them at once would
	// otherwise start its phases in their wake.
	settle := waitQuiet(b, 90*time.Second)
	// The datapath's own time, on request (progstats_test.go): only
	// Sluice's node runs programs named sl_*.
	if stats := enableRunTimeStats(b); stats != nil {
		defer stats.Close()
		nodes[0].stats = true
	}
	phases := []churnPhase{
		{"16-services", func(n *churnNode) []string { return n.closeFirst }, bpftest.RunClients},
		{"1-service", func(n *churnNode) []string { return n.closeFirst[:1] }, bpftest.RunClients},
		{"16-services-client-closes", func(n *churnNode) []string { return n.clientFirst }, bpftest.RunClientsClosingFirst},
		{"1-service-client-closes", func(n *churnNode) []string { return []string{n.oneClientFirst} }, bpftest.RunClientsClosingFirst},
	}
	if turn <= 0 { // each node its four phases in a row, as a node in the field
		for _, n := range nodes {
			for _, phase := range phases {
				phase.dial(b, []*churnNode{n}, d, d)
			}
		}
	} else {
		for _, phase := range phases {
			phase.dial(b, nodes, d, turn)
		}
	}
	for _, n := range nodes {
		b.Run(n.proxy, func(b *testing.B) {
			for b.Loop() {
			}
			// After b.Loop, which resets the metrics.
			b.ReportMetric(settle.Seconds(), "settle-s")
			for _, m := range n.metrics {
				b.ReportMetric(m.value, m.unit)
			}
		})
	}
}

// churnPhase is one of BenchmarkSNATChurn's phases: what each node dials,
// and how.
type churnPhase struct {
	name    string
	targets func(*churnNode) []string
	run     func(*bpftest.NetNS, []string, int, time.Duration) bpftest.ClientResult
}

// dial has the nodes take turns until each has dialled for d, and records
// each node's figures.
func (phase churnPhase) dial(b *testing.B, nodes []*churnNode, d, turn time.Duration) {
	results := make([]bpftest.ClientResult, len(nodes))
	for _, n := range nodes {
		n.before(b)
	}
	for slices.ContainsFunc(results, func(r bpftest.ClientResult) bool { return r.Elapsed < d }) {
		for i, n := range nodes {
			w := min(turn, d-results[i].Elapsed)
			if w <= 0 {
				continue
			}
			r := phase.run(n.client, phase.targets(n), 4, w)
			results[i].OK += r.OK
			results[i].Failed += r.Failed
			results[i].NoLocalPort += r.NoLocalPort
			results[i].Elapsed += r.Elapsed
			if results[i].FirstErr == nil {
				results[i].FirstErr = r.FirstErr
			}
		}
	}
	for i, n := range nodes {
		n.after(b, phase.name, results[i])
	}
}

// churnNode is one of BenchmarkSNATChurn's nodes: its pods, its proxy
// (none for "no-proxy"), what each phase dials, and the figures measured.
type churnNode struct {
	proxy  string
	e      *baselineEnv
	client *bpftest.NetNS
	proc   *os.Process // the proxy's; nil without one
	stats  bool        // the datapath's run-time statistics are on
	// closeFirst and clientFirst are 16 targets each; oneClientFirst is the
	// one the last phase dials: one the client has not closed connections
	// to already, so that it starts with every port free toward it, as
	// the others did.
	closeFirst, clientFirst []string
	oneClientFirst          string

	// A phase's readings before it.
	retrans          float64
	backends         map[string]uint64
	cpu              time.Duration
	drawn, snatDrops uint64
	scan             map[string]float64
	runs             map[ebpf.ProgramID]programRun
	metrics          []churnMetric
}

type churnMetric struct {
	value float64
	unit  string
}

func newChurnNode(b *testing.B, proxy, sluice, kubeProxy string, idleServices int) *churnNode {
	e, client := newSNATChurnEnv(b, proxy != "no-proxy")
	n := &churnNode{proxy: proxy, e: e, client: client}
	if proxy == "no-proxy" {
		for _, ip := range e.backendIPs {
			n.closeFirst = append(n.closeFirst, addrs([]string{ip}, 8080)[0], addrs([]string{ip}, 8082)[0])
			n.clientFirst = append(n.clientFirst, addrs([]string{ip}, 8081)[0], addrs([]string{ip}, 8083)[0])
		}
		n.oneClientFirst = addrs(e.backendIPs[:1], 8085)[0]
		return n
	}
	n.proc = e.startProxy(b, proxy, sluice, kubeProxy, "--cluster-cidr=10.200.0.0/13", "--metrics-bind-address=127.0.0.1:10249")
	e.createIdleServices(b, idleServices)
	ips := e.createChurnServices(b, 17, e.backendIPs)
	n.closeFirst, n.clientFirst, n.oneClientFirst = addrs(ips[:16], 80), addrs(ips[:16], 81), addrs(ips[16:], 81)[0]
	return n
}

// before reads what a phase's figures are differences of.
func (n *churnNode) before(b *testing.B) {
	n.retrans, n.backends = n.e.synRetrans(), backendDrops(b, n.e.backends)
	if n.proc != nil {
		n.cpu = processCPU(b, n.proc.Pid)
	}
	if n.proxy == "sluice" {
		n.scan = n.e.metricValues(b, append(scannerSeries, dropSeries)...)
		n.drawn = counter(b, n.e.pinDir, gen.SluiceCounterCNT_SNAT_PORT_DRAWN)
		n.snatDrops = counter(b, n.e.pinDir, gen.SluiceCounterCNT_DROP_SNAT_PORTS)
	}
	if n.stats {
		n.runs = programRuns(b, "sl_")
	}
}

// after records a phase's figures, res being the node's dials over all its
// turns.
func (n *churnNode) after(b *testing.B, phase string, res bpftest.ClientResult) {
	report := func(v float64, unit string) { n.metrics = append(n.metrics, churnMetric{v, phase + "-" + unit}) }
	report(res.Rate(), "conn/s")
	report(float64(res.Failed), "failed")
	report(float64(res.NoLocalPort), "client-out-of-ports")
	if n.proc != nil { // the proxy's own process: its share of the 2 CPUs while this node dialled
		report((processCPU(b, n.proc.Pid)-n.cpu).Seconds()/res.Elapsed.Seconds(), "proxy-cpus")
	}
	report(n.e.synRetrans()-n.retrans, "syn-retrans")
	// Why a SYN waited: a backend refused it against a TIME_WAIT tuple
	// (PAWS), or its listen queue overflowed.
	backends := backendDrops(b, n.e.backends)
	report(float64(backends["PAWSTimewait"]-n.backends["PAWSTimewait"]), "paws-rejects")
	report(float64(backends["ListenOverflows"]-n.backends["ListenOverflows"]), "listen-overflows")
	if n.stats { // the datapath's share of the 2 CPUs, and its time per connection
		total, byName := programRunsSince(n.runs, programRuns(b, "sl_"))
		report(total.time.Seconds()/res.Elapsed.Seconds(), "bpf-cpus")
		if conns := float64(res.OK + res.Failed); conns > 0 {
			report(float64(total.time.Nanoseconds())/conns, "bpf-ns/conn")
			for _, p := range byName {
				b.Logf("%s: %s: %.2f runs per connection, %.0f ns a run", phase, p.name, float64(p.runs)/conns, float64(p.time.Nanoseconds())/float64(p.runs))
			}
		}
	}
	if n.proxy == "sluice" {
		report(float64(counter(b, n.e.pinDir, gen.SluiceCounterCNT_DROP_SNAT_PORTS)-n.snatDrops), "snat-drops")
		report(float64(counter(b, n.e.pinDir, gen.SluiceCounterCNT_SNAT_PORT_DRAWN)-n.drawn), "ports-drawn")
		scan := n.e.metricValues(b, append(scannerSeries, dropSeries)...)
		for i, what := range []string{"early-drops", "cut-to-guard", "ct-entries"} {
			v := scan[scannerSeries[i]]
			if i < 2 { // counters: the phase's
				v -= n.scan[scannerSeries[i]]
			}
			report(v, what)
		}
		// Any packet the datapath dropped, by reason.
		for name, v := range scan {
			if strings.HasPrefix(name, strings.TrimSuffix(dropSeries, "*")) && v != n.scan[name] {
				b.Logf("sluice %s: %s +%.0f", phase, name, v-n.scan[name])
			}
		}
	}
	if res.Failed > 0 {
		b.Logf("%s %s: %d of %d connections failed; first: %v", n.proxy, phase, res.Failed, res.OK+res.Failed, res.FirstErr)
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

// waitQuiet waits, up to limit, for a second in which the machine's CPUs
// were busy for less than a tenth of a CPU, and returns how long it waited.
func waitQuiet(b *testing.B, limit time.Duration) time.Duration {
	start := time.Now()
	for time.Since(start) < limit {
		before := busyCPU(b)
		time.Sleep(time.Second)
		if busyCPU(b)-before < 100*time.Millisecond {
			break
		}
	}
	return time.Since(start)
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
