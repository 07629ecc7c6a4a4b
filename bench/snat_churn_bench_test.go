package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// snatChurnBackends is how many backend pods the SNAT churn benchmark's
// Services share: pods 0..7 (10.200.0.2 .. 10.207.0.2, the cluster CIDR
// 10.200.0.0/13); the client is pod 8 (10.208.0.2), outside it.
const snatChurnBackends = 8

// BenchmarkSNATChurn is issue 46's run: a client outside the cluster's pod
// CIDR, so that both proxies masquerade its ClusterIP flows to the node's
// address (kube-proxy with --cluster-cidr, Sluice the same), dials as fast as
// it can with 4 workers and the kernel's default ephemeral range; every
// server closes first (an HTTP/1.0 server, nginx closing idle keep-alives),
// so each connection's tuple is held in TIME_WAIT at its backend. First 16
// Services in turn, then one Service, each for the phase's length, against
// a real API server, kube-proxy nftables in its own node beside Sluice.
// Reported per phase: the rate, the dials that failed (or waited over a
// second), SYN retransmits, and for Sluice the flows refused for want of a
// SNAT port and the ports drawn.
//
// Short mode (CI): 10 s a phase. SLUICE_BENCH_FULL=1: 150 s a phase (5
// minutes in all).
func BenchmarkSNATChurn(b *testing.B) {
	bpftest.Require(b)
	if _, _, err := apiservertest.Binaries(); err != nil {
		b.Skip(err)
	}
	sluice, kubeProxy := proxyBinaries(b)
	d := 10 * time.Second
	if os.Getenv("SLUICE_BENCH_FULL") == "1" {
		d = 150 * time.Second
	}
	for _, proxy := range []string{"sluice", "nftables"} {
		b.Run(proxy, func(b *testing.B) {
			e, client := newSNATChurnEnv(b)
			e.startProxy(b, proxy, sluice, kubeProxy, "--cluster-cidr=10.200.0.0/13")
			ips := e.createCloseFirstServices(b, 16, e.backendIPs)
			for b.Loop() {
			}
			for _, phase := range []struct {
				name    string
				targets []string
			}{
				{"16-services", addrs(ips, 80)},
				{"1-service", addrs(ips[:1], 80)},
			} {
				before, backendsBefore := e.synRetrans(), backendDrops(b, e.backends)
				var drawnBefore, dropsBefore uint64
				if proxy == "sluice" {
					drawnBefore = counter(b, e.pinDir, gen.SluiceCounterCNT_SNAT_PORT_DRAWN)
					dropsBefore = counter(b, e.pinDir, gen.SluiceCounterCNT_DROP_SNAT_PORTS)
				}
				res := bpftest.RunClients(client, phase.targets, 4, d)
				b.ReportMetric(res.Rate(), phase.name+"-conn/s")
				b.ReportMetric(float64(res.Failed), phase.name+"-failed")
				b.ReportMetric(e.synRetrans()-before, phase.name+"-syn-retrans")
				// Why a SYN waited: a backend refused it against a
				// TIME_WAIT tuple (PAWS), or its listen queue overflowed.
				backendsAfter := backendDrops(b, e.backends)
				b.ReportMetric(float64(backendsAfter["PAWSTimewait"]-backendsBefore["PAWSTimewait"]), phase.name+"-paws-rejects")
				b.ReportMetric(float64(backendsAfter["ListenOverflows"]-backendsBefore["ListenOverflows"]), phase.name+"-listen-overflows")
				if proxy == "sluice" {
					b.ReportMetric(float64(counter(b, e.pinDir, gen.SluiceCounterCNT_DROP_SNAT_PORTS)-dropsBefore), phase.name+"-snat-drops")
					b.ReportMetric(float64(counter(b, e.pinDir, gen.SluiceCounterCNT_SNAT_PORT_DRAWN)-drawnBefore), phase.name+"-ports-drawn")
				}
				if res.Failed > 0 {
					b.Logf("%s %s: %d of %d connections failed; first: %v", proxy, phase.name, res.Failed, res.OK+res.Failed, res.FirstErr)
				}
			}
		})
	}
}

// newSNATChurnEnv is a node with an API server, snatChurnBackends backend
// pods whose servers close first on :8080, and the client pod outside the
// cluster CIDR.
func newSNATChurnEnv(b *testing.B) (*baselineEnv, *bpftest.NetNS) {
	e := &baselineEnv{node: bpftest.NewNetNS(b)}
	e.node.Run("sysctl", "-qw", "net.ipv4.ip_forward=1")
	for i := range snatChurnBackends {
		ns, ip := e.addPod(b, i)
		e.backends, e.backendIPs = append(e.backends, ns), append(e.backendIPs, ip)
		bpftest.ServeCloseFirst(b, ns, fmt.Sprintf("b%d", i), ":8080")
	}
	client, _ := e.addPod(b, snatChurnBackends)
	e.client = client
	e.api = apiservertest.StartIn(b, e.node)
	return e, client
}

// createCloseFirstServices creates n Services on port 80, each reaching
// every backend on 8080, and waits until the last answers.
func (e *baselineEnv) createCloseFirstServices(b *testing.B, n int, backends []string) []string {
	ctx := context.Background()
	var ips []string
	for i := range n {
		name := fmt.Sprintf("churn%d", i)
		svc, err := e.api.Client.CoreV1().Services("default").Create(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := e.api.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice(name, 8080, backends...), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		ips = append(ips, svc.Spec.ClusterIP)
	}
	last := netip.AddrPortFrom(netip.MustParseAddr(ips[len(ips)-1]), 80).String()
	deadline := time.Now().Add(time.Minute)
	for bpftest.RunClients(e.client, []string{last}, 1, 50*time.Millisecond).OK == 0 {
		if time.Now().After(deadline) {
			b.Fatalf("%s never answered", last)
		}
	}
	return ips
}

func addrs(ips []string, port int) []string {
	var out []string
	for _, ip := range ips {
		out = append(out, netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(port)).String())
	}
	return out
}

// backendDrops sums the backends' PAWSTimewait and ListenOverflows.
func backendDrops(b *testing.B, backends []*bpftest.NetNS) map[string]uint64 {
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
