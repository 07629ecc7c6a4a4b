package bench

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
)

// The tuple-clash baseline: clients that alternate a ClusterIP and its
// backends directly, behind servers that close first, with 64 ephemeral
// ports so that ports are reused across destinations — once from a pod
// inside --cluster-cidr, once from an external host outside it (ClusterIP
// traffic from there is masqueraded by both proxies). Each proxy runs on a
// fresh node namespace driven by a real API server; what counts is the
// connection rate, connections that failed, and SYN retransmits (every one
// is a connection stalled for a second).

type clashResult struct {
	rate, failed, synRetr [2]float64 // [pod, external]
}

var clashCache = map[string]clashResult{}

func runClashBaseline(b *testing.B, proxy, sluice, kubeProxy string) clashResult {
	e := &baselineEnv{node: bpftest.NewNetNS(b), nodeIP: "10.210.0.1"}
	e.node.Run("sysctl", "-qw", "net.ipv4.ip_forward=1")
	e.client, _ = e.addPod(b, 0)
	for i := 1; i <= 3; i++ {
		ns, ip := e.addPod(b, i)
		bpftest.ServeCloseFirst(b, ns, fmt.Sprintf("b%d", i), ":8080")
		e.backends, e.backendIPs = append(e.backends, ns), append(e.backendIPs, ip)
	}
	const dataIface = "sldata0"
	external := bpftest.NewPod(b, e.node, dataIface, netip.MustParsePrefix("10.210.0.2/24"), netip.MustParseAddr("10.210.0.1"))
	for _, ns := range []*bpftest.NetNS{e.client, external} {
		ns.Run("sysctl", "-qw", "net.ipv4.ip_local_port_range=40000 40063")
	}
	e.api = apiservertest.StartIn(b, e.node)

	const clusterCIDR = "10.200.0.0/14" // the pods, not the external host
	if proxy == "sluice" {
		e.startProxy(b, proxy, sluice, kubeProxy, "--cluster-cidr", clusterCIDR,
			"--data-ifaces", "^"+dataIface+"$", "--node-ips", "10.210.0.1")
	} else {
		e.startProxy(b, proxy, sluice, kubeProxy, "--cluster-cidr", clusterCIDR)
	}
	vip := e.createServices(b, "clash", 1, e.backendIPs...)[0] + ":80"
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		if _, err := e.answer(vip, 200*time.Millisecond); err == nil {
			break
		}
		if time.Since(start) > time.Minute {
			b.Fatalf("%s: the ClusterIP never answered", proxy)
		}
	}
	targets := []string{vip}
	for _, ip := range e.backendIPs {
		targets = append(targets, ip+":8080")
	}
	d := time.Second
	if os.Getenv("SLUICE_BENCH_FULL") == "1" {
		d = 5 * time.Second
	}
	var r clashResult
	for i, ns := range []*bpftest.NetNS{e.client, external} {
		client := &baselineEnv{client: ns}
		before := client.synRetrans()
		res := bpftest.RunClients(ns, targets, 4, d)
		if res.Failed > 0 {
			b.Logf("%s, %s client: %d connections failed, the first with: %v", proxy, []string{"pod", "external"}[i], res.Failed, res.FirstErr)
			if proxy == "sluice" {
				logCounters(b, e.pinDir)
			}
		}
		r.rate[i], r.failed[i] = res.Rate(), float64(res.Failed+res.NoLocalPort)
		r.synRetr[i] = client.synRetrans() - before
	}
	return r
}

// BenchmarkBaselineClash reports, per proxy, new connections per second,
// failed connections and client SYN retransmits for the pod client (pod-*)
// and the external client (ext-*).
func BenchmarkBaselineClash(b *testing.B) {
	bpftest.Require(b)
	if _, _, err := apiservertest.Binaries(); err != nil {
		b.Skip(err)
	}
	sluice, kubeProxy := proxyBinaries(b)
	for _, proxy := range []string{"sluice", "iptables", "nftables"} {
		b.Run(proxy, func(b *testing.B) {
			baselineMu.Lock()
			r, ok := clashCache[proxy]
			baselineMu.Unlock()
			if !ok { // measured once; b.N's growth reuses the result
				r = runClashBaseline(b, proxy, sluice, kubeProxy)
				baselineMu.Lock()
				clashCache[proxy] = r
				baselineMu.Unlock()
			}
			for b.Loop() {
			}
			for i, who := range []string{"pod", "ext"} {
				b.ReportMetric(r.rate[i], who+"-conn/s")
				b.ReportMetric(r.failed[i], who+"-failed")
				b.ReportMetric(r.synRetr[i], who+"-syn-retrans")
			}
		})
	}
}

// logCounters logs the datapath counters of a Sluice agent's pins that are
// not zero, by enum counter value (bpf/include/counters.h).
func logCounters(b testing.TB, pinDir string) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, gen.SluiceMapSlCountersV7), nil)
	if err != nil {
		b.Logf("counters: %v", err)
		return
	}
	defer m.Close()
	for c := gen.SluiceCounter(0); c < gen.SluiceCounterCNT_MAX; c++ {
		sum, err := counterSum(m, c)
		if err != nil {
			b.Logf("%v", err)
			continue
		}
		if sum != 0 {
			b.Logf("datapath counter %d: %d", c, sum)
		}
	}
}

// counterSum sums datapath counter c of the counters map m over the CPUs.
func counterSum(m *ebpf.Map, c gen.SluiceCounter) (uint64, error) {
	var vs []uint64
	if err := m.Lookup(c, &vs); err != nil {
		return 0, fmt.Errorf("counter %d: %w", c, err)
	}
	var sum uint64
	for _, v := range vs {
		sum += v
	}
	return sum, nil
}
