package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The baselines compare Sluice with the real kube-proxy (iptables and
// nftables modes, built from k8s.io/kubernetes by test/kube-apiserver), each
// driven by a real API server with the same Services and EndpointSlices, each
// in a fresh node namespace of its own: API server, etcd, proxy, pods and
// clients all live in namespaces the benchmark creates.
//
// Short mode (CI): 100 Services. SLUICE_BENCH_FULL=1: 100, 1,000 and 10,000.
//
// Every proxy runs with a minimum sync period of 0 (kube-proxy:
// --iptables-min-sync-period=0s, which its nftables mode reads too; Sluice:
// --min-sync-period=0s), so the figures are each proxy's own work rather than
// a configured wait.

// sluiceStackRouting is Sluice with --stack-routing: pod-to-pod packets
// through the node's IP stack rather than handed over by the datapath
// (bpf/include/deliver.h), what local delivery gains measured in the same
// run.
const sluiceStackRouting = "sluice-stack-routing"

// connTargets is how many addresses the connection-rate clients spread over.
const connTargets = 16

type baselineResult struct {
	programMs, changeMs         float64
	rate, p50us, p99us, synRetr float64
	dialErrors, proxyCPUms      float64
	// bpfNsPerConn, bpfRunsPerConn: the datapath's program time and runs
	// per counted connection (SLUICE_BENCH_BPF_STATS=1 only; progstats_test.go).
	bpfNsPerConn, bpfRunsPerConn float64
	// xNoProxy: the proxied rate over the no-proxy rate measured in the
	// windows between the proxied ones (pairedRates).
	xNoProxy float64
}

var (
	baselineMu    sync.Mutex
	baselineCache = map[string]baselineResult{}
)

// proxyBinaries builds this tree's agent, or takes SLUICE_AGENT_BINARY, and
// finds kube-proxy (SLUICE_KUBE_PROXY, which .ci/install builds).
func proxyBinaries(tb testing.TB) (sluice, kubeProxy string) {
	kubeProxy = os.Getenv("SLUICE_KUBE_PROXY")
	if _, err := os.Stat(kubeProxy); kubeProxy == "" || err != nil {
		tb.Skipf("SLUICE_KUBE_PROXY not set or missing (.ci/install builds it): %v", err)
	}
	// Another build of the agent, to compare it with this tree's in the
	// same harness (a commit before a fix, say).
	if sluice = os.Getenv("SLUICE_AGENT_BINARY"); sluice != "" {
		if _, err := os.Stat(sluice); err != nil {
			tb.Fatalf("SLUICE_AGENT_BINARY: %v", err)
		}
		return sluice, kubeProxy
	}
	sluice = filepath.Join(tb.TempDir(), "sluice")
	if out, err := exec.Command("go", "build", "-o", sluice, "github.com/sluice-net/sluice/cmd/sluice").CombinedOutput(); err != nil {
		tb.Fatalf("build sluice: %v\n%s", err, out)
	}
	return sluice, kubeProxy
}

// baselineEnv: a node namespace (API server, etcd, the proxy) with a client
// pod and two backend pods behind veths.
type baselineEnv struct {
	node, client *bpftest.NetNS
	backends     []*bpftest.NetNS
	backendIPs   []string
	api          *apiservertest.Server
	pinDir       string // Sluice's, once started
	nodeIP       string // the Node object's InternalIP; empty: the first pod's gateway
}

func newBaselineEnv(b *testing.B) *baselineEnv {
	e := newDirectEnv(b)
	e.api = apiservertest.StartIn(b, e.node)
	return e
}

// newDirectEnv is a baselineEnv without API server or proxy: the no-proxy
// run's.
func newDirectEnv(b *testing.B) *baselineEnv {
	e := &baselineEnv{node: bpftest.NewNetNS(b)}
	e.node.Run("sysctl", "-qw", "net.ipv4.ip_forward=1")
	for i := range 3 {
		ns, ip := e.addPod(b, i)
		if i == 0 {
			e.client = ns
			continue
		}
		e.backends, e.backendIPs = append(e.backends, ns), append(e.backendIPs, ip)
		bpftest.ServeTCP(b, ns, fmt.Sprintf("b%d", i), ":8080")
	}
	// The no-proxy run dials as many addresses as the proxied runs (16
	// Services): one address alone makes the client's port search over its
	// TIME_WAIT sockets the bottleneck, not the network. The Services reach
	// the same sockets (targetPort).
	for port := 8081; port < 8080+connTargets; port++ {
		bpftest.ServeTCP(b, e.backends[0], "b1", fmt.Sprintf(":%d", port))
	}
	return e
}

// directTargets are the sockets the no-proxy run dials: the first backend's
// 16 listeners, which the proxied runs' first 16 Services reach.
func (e *baselineEnv) directTargets() []string {
	var targets []string
	for i := range connTargets {
		targets = append(targets, fmt.Sprintf("%s:%d", e.backendIPs[0], targetPort(i)))
	}
	return targets
}

// addPod makes pod i: 10.20<i>.0.2/24 behind a veth whose node side is
// 10.20<i>.0.1, the pod's gateway.
func (e *baselineEnv) addPod(b testing.TB, i int) (*bpftest.NetNS, string) {
	ip := fmt.Sprintf("10.20%d.0.2", i)
	ns := bpftest.NewPod(b, e.node, fmt.Sprintf("slv%d", i), netip.MustParsePrefix(ip+"/24"), netip.MustParseAddr(fmt.Sprintf("10.20%d.0.1", i)))
	return ns, ip
}

// startProxy starts a proxy in the node namespace; extra flags are the
// proxy's own (Sluice's or kube-proxy's).
func (e *baselineEnv) startProxy(b testing.TB, name, sluice, kubeProxy string, extra ...string) *os.Process {
	e.registerNode(b)
	var args []string
	if name == "sluice" {
		e.pinDir = filepath.Join(bpftest.PinDir(b), "sluice")
		args = []string{sluice, "agent", "--kubeconfig", e.api.Kubeconfig, "--hostname-override", "node",
			"--bpf-pin-dir", e.pinDir, "--workload-iface-prefixes", "slv",
			"--data-ifaces", "^$", "--cgroup=", "--healthz-bind-address=", "--metrics-bind-address=", "--log-level", "warn",
			"--min-sync-period=0s"}
	} else {
		args = []string{kubeProxy, "--kubeconfig", e.api.Kubeconfig, "--hostname-override", "node", "--proxy-mode", name,
			"--conntrack-max-per-core=0", "--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249", "--v=0",
			"--iptables-min-sync-period=0s"}
	}
	return apiservertest.StartProcess(b, e.node, filepath.Join(b.TempDir(), name+".log"), append(args, extra...)...)
}

// registerNode creates the proxies' Node object, as a kubelet would have:
// without it kube-proxy waits 30 s for the Node before it falls back to
// loopback as the node's IP ("Timed out waiting for node to exist").
func (e *baselineEnv) registerNode(b testing.TB) {
	ip := e.nodeIP
	if ip == "" {
		ip = "10.200.0.1"
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node"},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}}}}
	if _, err := e.api.Client.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
}

// createServices creates n Services whose endpoints are backends and
// returns their ClusterIPs, in creation order. Service i reaches its
// backends on targetPort(i).
func (e *baselineEnv) createServices(b *testing.B, prefix string, n int, backends ...string) []string {
	ctx := context.Background()
	var ips []string
	for i := range n {
		name := fmt.Sprintf("%s%d", prefix, i)
		svc, err := e.api.Client.CoreV1().Services("default").Create(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := e.api.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice(name, targetPort(i), backends...), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		ips = append(ips, svc.Spec.ClusterIP)
	}
	return ips
}

// targetPort is the backend port of the i-th Service: the first connTargets
// reach the sockets the no-proxy run dials (8080 onwards), so that every run
// connects to the same 16 listeners, and none clash at the backend with
// another Service's flows from the same client port. The rest reach 8080.
func targetPort(i int) int32 {
	if i < connTargets {
		return int32(8080 + i)
	}
	return 8080
}

func slice(svc string, port int32, backends ...string) *discovery.EndpointSlice {
	proto, pname := v1.ProtocolTCP, "http"
	var eps []discovery.Endpoint
	for _, be := range backends {
		eps = append(eps, discovery.Endpoint{Addresses: []string{be}})
	}
	return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: svc + "-1", Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: discovery.AddressTypeIPv4, Endpoints: eps,
		Ports: []discovery.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}}}
}

// answer connects from the client pod and returns the first word of the
// backend's answer ("b1", "b2"), or an error.
func (e *baselineEnv) answer(addr string, timeout time.Duration) (string, error) {
	var word string
	err := e.client.Do(func() error {
		c, err := net.DialTimeout("tcp4", addr, timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		fmt.Fprintln(c, "x")
		line, err := bufio.NewReader(c).ReadString('\n')
		word = strings.Fields(line + " ?")[0]
		return err
	})
	return word, err
}

// waitFor polls until the answer from addr is want, returning the time taken.
// timeOneChange is one change among many Services, in milliseconds: the
// probe Service's endpoint (probe0, on b1, at the probe ClusterIP) moves to
// the second backend, and a client sees it answer.
func (e *baselineEnv) timeOneChange(b *testing.B, probeIP string) float64 {
	if _, err := e.api.Client.DiscoveryV1().EndpointSlices("default").Update(context.Background(),
		slice("probe0", targetPort(0), e.backendIPs[1]), metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
	return float64(e.waitFor(b, probeIP+":80", "b2", time.Minute).Microseconds()) / 1000
}

func (e *baselineEnv) waitFor(b *testing.B, addr, want string, limit time.Duration) time.Duration {
	took, ok := e.answersWithin(addr, want, limit)
	if !ok {
		b.Fatalf("%s never answered %s within %v", addr, want, limit)
	}
	return took
}

// answersWithin polls until the answer from addr is want, for limit at
// most: the time taken, and whether it came.
func (e *baselineEnv) answersWithin(addr, want string, limit time.Duration) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < limit {
		if got, err := e.answer(addr, 200*time.Millisecond); err == nil && got == want {
			return time.Since(start), true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start), false
}

// change moves the last of n Services to the second backend and returns how
// long until it answers from there, in ms.
func (e *baselineEnv) change(b *testing.B, ips []string, n int) float64 {
	last := fmt.Sprintf("s%d", n-1)
	if _, err := e.api.Client.DiscoveryV1().EndpointSlices("default").Update(context.Background(), slice(last, 8080, e.backendIPs[1]), metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
	return float64(e.waitFor(b, ips[len(ips)-1]+":80", "b2", time.Minute).Microseconds()) / 1000
}

// synRetrans reads TCPSynRetrans of the client's namespace.
func (e *baselineEnv) synRetrans() float64 {
	v, err := bpftest.Netstat(e.client, "TcpExt", "TCPSynRetrans")
	if err != nil {
		return 0
	}
	return float64(v["TCPSynRetrans"])
}

// dials is what a connection-rate measurement saw: each connect's latency,
// the dials that failed (or gave up after a second: a SYN the path drops
// costs its worker the whole timeout without a retransmission being
// counted), and the time spent.
type dials struct {
	lat     []time.Duration
	errs    int
	elapsed time.Duration
}

// dialFor: 4 workers connect and close for d, spread over targets.
func (e *baselineEnv) dialFor(targets []string, d time.Duration, into *dials) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = e.client.Do(func() error { // one thread in the namespace per worker
				var mine []time.Duration
				myErrs := 0
				for i := w; time.Now().Before(deadline); i += 4 {
					start := time.Now()
					c, err := net.DialTimeout("tcp4", targets[i%len(targets)], time.Second)
					if err != nil {
						myErrs++
						continue
					}
					mine = append(mine, time.Since(start))
					c.Close()
				}
				mu.Lock()
				into.lat, into.errs = append(into.lat, mine...), into.errs+myErrs
				mu.Unlock()
				return nil
			})
		}()
	}
	wg.Wait()
	into.elapsed += d
}

// rate is connections a second; p50 and p99 the connect latency in µs.
func (r *dials) rate() (rate, p50, p99 float64) {
	if len(r.lat) == 0 {
		return 0, 0, 0
	}
	slices.Sort(r.lat)
	return float64(len(r.lat)) / r.elapsed.Seconds(), float64(r.lat[len(r.lat)/2].Microseconds()), float64(r.lat[len(r.lat)*99/100].Microseconds())
}

// rateWindow is how long a paired measurement dials one side before it
// turns to the other.
const rateWindow = 250 * time.Millisecond

// pairedRates measures the proxied env and the direct one for d each, in
// alternating windows, so that what the machine does meanwhile (this one's
// rate drifts by a tenth between runs a minute apart) weighs on both alike.
func pairedRates(proxied *baselineEnv, targets []string, direct *baselineEnv, d time.Duration) (viaProxy, noProxy dials) {
	for viaProxy.elapsed < d {
		proxied.dialFor(targets, rateWindow, &viaProxy)
		direct.dialFor(direct.directTargets(), rateWindow, &noProxy)
	}
	return viaProxy, noProxy
}

func runBaseline(b *testing.B, proxy string, n int, sluice, kubeProxy string, direct *baselineEnv) baselineResult {
	var r baselineResult
	d := time.Second
	if os.Getenv("SLUICE_BENCH_FULL") == "1" {
		d = 5 * time.Second
	}
	if proxy == "no-proxy" {
		before := direct.synRetrans()
		var got dials
		direct.dialFor(direct.directTargets(), d, &got)
		r.rate, r.p50us, r.p99us = got.rate()
		r.dialErrors = float64(got.errs)
		r.synRetr = direct.synRetrans() - before
		return r
	}
	e := newBaselineEnv(b)
	name, extra := proxy, []string(nil)
	if proxy == sluiceStackRouting {
		name, extra = "sluice", []string{"--stack-routing"}
	}
	isSluice := name == "sluice"
	proc := e.startProxy(b, name, sluice, kubeProxy, extra...)
	probe := e.createServices(b, "probe", 1, e.backendIPs[0])
	e.waitFor(b, probe[0]+":80", "b1", 60*time.Second) // the proxy is up and synced
	ips := e.createServices(b, "s", n, e.backendIPs[0])
	r.programMs = float64(e.waitFor(b, ips[len(ips)-1]+":80", "b1", 5*time.Minute).Microseconds()) / 1000
	r.changeMs = e.change(b, ips, n)
	var targets []string
	for _, ip := range ips[:min(connTargets, len(ips))] {
		targets = append(targets, ip+":80")
	}
	var stats io.Closer
	var runsBefore map[ebpf.ProgramID]programRun
	if isSluice {
		stats = enableRunTimeStats(b)
	}
	if stats != nil {
		runsBefore = programRuns(b, "sl_")
	}
	before, cpuBefore := e.synRetrans(), processCPU(b, proc.Pid)
	got, noProxy := pairedRates(e, targets, direct, d)
	r.synRetr = e.synRetrans() - before
	r.proxyCPUms = float64((processCPU(b, proc.Pid) - cpuBefore).Microseconds()) / 1000
	r.rate, r.p50us, r.p99us = got.rate()
	if stats != nil {
		total, byName := programRunsSince(runsBefore, programRuns(b, "sl_"))
		stats.Close()
		if conns := float64(len(got.lat)); conns > 0 {
			r.bpfNsPerConn, r.bpfRunsPerConn = float64(total.time.Nanoseconds())/conns, float64(total.runs)/conns
			for _, p := range byName {
				b.Logf("%s: %.2f runs per connection, %.0f ns a run", p.name, float64(p.runs)/conns, float64(p.time.Nanoseconds())/float64(p.runs))
			}
		}
	}
	r.dialErrors = float64(got.errs)
	if base, _, _ := noProxy.rate(); base > 0 {
		r.xNoProxy = r.rate / base
	}
	if r.dialErrors > 0 && isSluice {
		logCounters(b, e.pinDir)
	}
	return r
}

// BenchmarkBaselines reports, per proxy and number of Services: programming
// time after the last object is created (program-ms), time to follow one
// EndpointSlice change (change-ms), new connections per second over 16
// Services with p50/p99 connect latency, failed dials, SYN retransmits and
// the proxy's CPU time meanwhile, and the rate as a ratio to no-proxy's in
// the windows between (x-no-proxy, pairedRates).
func BenchmarkBaselines(b *testing.B) {
	bpftest.Require(b)
	if _, _, err := apiservertest.Binaries(); err != nil {
		b.Skip(err)
	}
	sluice, kubeProxy := proxyBinaries(b)
	direct := newDirectEnv(b) // no-proxy, and the proxied runs' pair
	sizes := []int{100}
	if os.Getenv("SLUICE_BENCH_FULL") == "1" {
		sizes = []int{100, 1_000, 10_000}
	}
	for _, n := range sizes {
		for _, proxy := range []string{"no-proxy", "sluice", sluiceStackRouting, "iptables", "nftables"} {
			b.Run(fmt.Sprintf("services=%d/%s", n, proxy), func(b *testing.B) {
				key := fmt.Sprintf("%d/%s", n, proxy)
				baselineMu.Lock()
				r, ok := baselineCache[key]
				baselineMu.Unlock()
				if !ok { // measured once; b.N's growth reuses the result
					r = runBaseline(b, proxy, n, sluice, kubeProxy, direct)
					baselineMu.Lock()
					baselineCache[key] = r
					baselineMu.Unlock()
				}
				for b.Loop() {
				}
				if proxy != "no-proxy" {
					b.ReportMetric(r.programMs, "program-ms")
					b.ReportMetric(r.changeMs, "change-ms")
				}
				b.ReportMetric(r.rate, "conn/s")
				b.ReportMetric(r.p50us, "p50-us")
				b.ReportMetric(r.p99us, "p99-us")
				b.ReportMetric(r.synRetr, "syn-retrans")
				b.ReportMetric(r.dialErrors, "dial-errors")
				if proxy != "no-proxy" {
					b.ReportMetric(r.proxyCPUms, "proxy-cpu-ms")
					b.ReportMetric(r.xNoProxy, "x-no-proxy")
				}
				if r.bpfRunsPerConn > 0 {
					b.ReportMetric(r.bpfNsPerConn, "bpf-ns/conn")
					b.ReportMetric(r.bpfRunsPerConn, "bpf-runs/conn")
				}
			})
		}
	}
}

// BenchmarkBaselinePairing measures the measure: two no-proxy nodes, paired
// as the baselines pair a proxied node with the no-proxy one
// (pairedRates). x-other is the first's rate over the second's, what
// x-no-proxy would be for a proxy that cost nothing; its distance from 1 is
// the pairing's own bias and noise.
func BenchmarkBaselinePairing(b *testing.B) {
	bpftest.Require(b)
	d := time.Second
	if os.Getenv("SLUICE_BENCH_FULL") == "1" {
		d = 5 * time.Second
	}
	first, second := newDirectEnv(b), newDirectEnv(b)
	for b.Loop() {
	}
	x, y := pairedRates(first, first.directTargets(), second, d)
	rx, _, _ := x.rate()
	ry, _, _ := y.rate()
	if ry == 0 {
		b.Fatalf("no connection of the second node succeeded (%d dials failed)", y.errs)
	}
	b.ReportMetric(rx, "conn/s")
	b.ReportMetric(rx/ry, "x-other")
	b.ReportMetric(float64(x.errs+y.errs), "dial-errors")
}
