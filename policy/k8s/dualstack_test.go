package k8s

import (
	"net/netip"
	"testing"

	"github.com/sluice-net/sluice/policy"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// On a dual-stack cluster a pod's policy judges both of its families: peers
// selected by label count with every address they have, and ipBlocks of
// either family hold for their family only.
func TestDualStackPodsAndIPv6IPBlocks(t *testing.T) {
	dual := func(name, ip4, ip6 string, lbls map[string]string) *v1.Pod {
		p := pod("shop", name, ip4, lbls)
		p.Status.PodIPs = []v1.PodIP{{IP: ip4}, {IP: ip6}}
		return p
	}
	web := dual("web", "10.1.0.10", "fd00:1::10", map[string]string{"app": "web"})
	api := dual("api", "10.1.0.20", "fd00:1::20", map[string]string{"app": "api"})
	other := dual("other", "10.1.0.30", "fd00:1::30", map[string]string{"app": "other"})
	c := Cluster{
		Pods:       []*v1.Pod{web, api, other},
		Namespaces: []*v1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}},
		Policies: []*netv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-in"}, Spec: netv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []netv1.NetworkPolicyIngressRule{
				{From: []netv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}}}}},
				{From: []netv1.NetworkPolicyPeer{{IPBlock: &netv1.IPBlock{CIDR: "2001:db8::/32", Except: []string{"2001:db8:bad::/48"}}}}},
			},
		}}},
	}
	res := Translate(c, "node-a")
	if len(res.Errors) != 0 {
		t.Fatal(res.Errors)
	}
	ep := res.Endpoints["shop/web"]
	if ep.IP != netip.MustParseAddr("10.1.0.10") {
		t.Fatalf("endpoint known by %v, want its IPv4 address", ep.IP)
	}
	in := func(src, dst string) bool {
		return policy.Evaluate(&ep.Ingress, res.IPSets, policy.Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Protocol: 6, DstPort: 80}).Allow
	}
	for _, tc := range []struct {
		src, dst string
		want     bool
	}{
		{"10.1.0.20", "10.1.0.10", true},         // api over IPv4
		{"fd00:1::20", "fd00:1::10", true},       // api over IPv6
		{"fd00:1::30", "fd00:1::10", false},      // another pod over IPv6
		{"2001:db8:1::1", "fd00:1::10", true},    // the IPv6 ipBlock
		{"2001:db8:bad::1", "fd00:1::10", false}, // its except
		{"192.0.2.1", "10.1.0.10", false},        // no IPv4 ipBlock
	} {
		if got := in(tc.src, tc.dst); got != tc.want {
			t.Errorf("%s -> %s: allowed %v, want %v", tc.src, tc.dst, got, tc.want)
		}
	}
}
