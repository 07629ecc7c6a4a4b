package kubeproxy_test

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-net/sluice/kubeproxy"
)

func TestNodeRoutes(t *testing.T) {
	node := func(name, ip string, cidrs ...string) *v1.Node {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NodeSpec{PodCIDRs: cidrs},
			Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeHostName, Address: name}, {Type: v1.NodeInternalIP, Address: ip}}}}
		if name == "a" {
			n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeExternalIP, Address: "203.0.113.9"})
		}
		return n
	}
	changes := 0
	r := &kubeproxy.NodeRoutes{OnChange: func() { changes++ }}
	r.OnNode(node("a", "10.0.0.1", "10.1.0.0/16"), false)
	dual := node("c", "10.0.0.3", "10.4.0.0/16", "fd01::/64")
	dual.Status.Addresses = append(dual.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: "fd01::a"})
	r.SetNodes([]*v1.Node{node("a", "10.0.0.1", "10.1.0.0/16"), node("b", "10.0.0.2", "10.2.0.0/16", "fd00::/64"), dual})
	r.SetNodes([]*v1.Node{node("a", "10.0.0.1", "10.1.0.0/16"), node("b", "10.0.0.2", "10.2.0.0/16", "fd00::/64"), dual})
	if changes != 2 {
		t.Fatalf("OnChange called %d times, want 2 (the same Nodes again change nothing)", changes)
	}
	for ip, want := range map[string]string{
		"10.1.3.4": "10.0.0.1", "10.2.0.9": "10.0.0.2", // pods
		"10.0.0.2": "10.0.0.2", "203.0.113.9": "10.0.0.1", // host-network endpoints: toward the InternalIP
		"10.3.0.1": "",                              // no node's
		"fd00::9":  "",                              // b's IPv6 pod CIDR, but b has no IPv6 address to route it toward
		"fd01::9":  "fd01::a", "fd01::a": "fd01::a", // c: a family of its own toward its IPv6 address
		"10.4.0.9": "10.0.0.3",
	} {
		got, ok := r.Lookup(netip.MustParseAddr(ip))
		if want == "" && ok || want != "" && (!ok || got.String() != want) {
			t.Errorf("Lookup(%s) = %v %v, want %q", ip, got, ok, want)
		}
	}
	r.OnNode(node("b", "10.0.0.2"), true)
	if _, ok := r.Lookup(netip.MustParseAddr("10.2.0.9")); ok {
		t.Fatal("a deleted Node's pod CIDR still routes")
	}
}
