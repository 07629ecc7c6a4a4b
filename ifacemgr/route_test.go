package ifacemgr_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/ifacemgr"
	"github.com/sluice-net/sluice/netlab"
)

// A pod's host-side interface is found whether the node routes the pod's IP
// to its own veth (routed: Calico, Cilium) or to a bridge (the CNI bridge
// plugin): then it is the bridge port whose peer holds the IP. Naming the
// bridge instead bound no pod's NetworkPolicy to any interface, and no
// policy was enforced on a bridged node (found by the conformance cluster).
func TestPodInterfacesBehindABridgeAndRouted(t *testing.T) {
	bpftest.Require(t)
	lab := netlab.Lab{Prefix: bpftest.UniqueName("slpi")}
	t.Cleanup(lab.Close)
	node, err := lab.Bridge("node")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := netlab.IP("-n", node, "addr", "add", "10.244.0.1/24", "dev", "br0"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct{ name, port, addr string }{{"a", "vetha", "10.244.0.2/24"}, {"b", "vethb", "10.244.0.3/24"}} {
		ns, err := lab.Namespace(p.name)
		if err != nil {
			t.Fatal(err)
		}
		if err := lab.Plug(ns, "eth0", netip.MustParsePrefix(p.addr), node, p.port); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := lab.Pod(node, "cali1", "c", netip.MustParsePrefix("10.245.0.2/24"), netip.MustParseAddr("10.245.0.1")); err != nil {
		t.Fatal(err)
	}

	pods, err := ifacemgr.NewPodInterfaces(netlab.Path(node))
	if err != nil {
		t.Fatal(err)
	}
	defer pods.Close()
	for ip, want := range map[string]string{"10.244.0.2": "vetha", "10.244.0.3": "vethb", "10.245.0.2": "cali1"} {
		got, err := pods.Interface(netip.MustParseAddr(ip))
		if err != nil || got != want {
			t.Errorf("pod %s: interface %q, %v; want %s", ip, got, err, want)
		}
	}
	// An address of the bridge's subnet that no port leads to names the bridge.
	if got, err := pods.Interface(netip.MustParseAddr("10.244.0.9")); err == nil || !strings.Contains(err.Error(), "br0") {
		t.Errorf("address behind no port: %q, %v; want an error naming br0", got, err)
	}
}

// BenchmarkPodInterfaces is one round of lookups of 100 routed pods'
// interfaces: what the agent's policy feed paid at every policy change
// before it kept the interfaces found while the routing stood
// (Manager.RoutingGeneration).
func BenchmarkPodInterfaces(b *testing.B) {
	bpftest.Require(b)
	lab := netlab.Lab{Prefix: bpftest.UniqueName("slpb")}
	b.Cleanup(lab.Close)
	node, err := lab.Bridge("node")
	if err != nil {
		b.Fatal(err)
	}
	var ips []netip.Addr
	for i := range 100 {
		ip := netip.AddrFrom4([4]byte{10, 245, byte(i), 2})
		if _, err := lab.Pod(node, fmt.Sprintf("cali%d", i), fmt.Sprintf("p%d", i), netip.PrefixFrom(ip, 24), netip.AddrFrom4([4]byte{10, 245, byte(i), 1})); err != nil {
			b.Fatal(err)
		}
		ips = append(ips, ip)
	}
	for b.Loop() {
		pods, err := ifacemgr.NewPodInterfaces(netlab.Path(node))
		if err != nil {
			b.Fatal(err)
		}
		for i, ip := range ips {
			if got, err := pods.Interface(ip); err != nil || got != fmt.Sprintf("cali%d", i) {
				b.Fatalf("pod %v: %q, %v", ip, got, err)
			}
		}
		pods.Close()
	}
}
