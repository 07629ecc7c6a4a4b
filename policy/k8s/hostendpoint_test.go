package k8s

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/policy"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestHostEndpointTranslation(t *testing.T) {
	hep := func(name, node, iface string, spec HostEndpointSpec) *HostEndpoint {
		spec.Node, spec.InterfaceName = node, iface
		return &HostEndpoint{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	}
	admin := pod("ops", "admin", "10.1.0.20", map[string]string{"role": "admin"})
	c := Cluster{
		Pods:       []*v1.Pod{admin},
		Namespaces: []*v1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "ops", Labels: map[string]string{"team": "ops"}}}},
		HostEndpoints: []*HostEndpoint{
			hep("a-eth0", "node-a", "eth0", HostEndpointSpec{Ingress: []netv1.NetworkPolicyIngressRule{{
				From:  []netv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ops"}}}},
				Ports: []netv1.NetworkPolicyPort{tcpPort(22)}}}}),
			hep("b-eth0", "node-a", "eth0", HostEndpointSpec{}), // a second for eth0: ignored, reported
			hep("all", "", "*", HostEndpointSpec{Egress: []netv1.NetworkPolicyEgressRule{{To: []netv1.NetworkPolicyPeer{{IPBlock: &netv1.IPBlock{CIDR: "192.0.2.0/24"}}}}}}),
			hep("other-node", "node-b", "eth1", HostEndpointSpec{}),
		},
	}
	res := Translate(c, "node-a")
	if len(res.Errors) != 1 || !strings.Contains(res.Errors[0].Error(), "b-eth0") {
		t.Fatalf("errors %v: want one naming the shadowed b-eth0", res.Errors)
	}
	if _, ok := res.Endpoints[HostEndpointID("eth1")]; ok {
		t.Fatal("another node's host endpoint translated")
	}
	eth0, all := res.Endpoints[HostEndpointID("eth0")], res.Endpoints[HostEndpointID(AllInterfaces)]
	if eth0.Interface != "eth0" || all.Interface != AllInterfaces {
		t.Fatalf("interfaces %q %q", eth0.Interface, all.Interface)
	}
	node := netip.MustParseAddr("10.0.0.1")
	judge := func(p *policy.EndpointPolicy, src, dst string, port uint16) bool {
		t.Helper()
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
		return policy.Evaluate(p, res.IPSets, policy.Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Protocol: 6, DstPort: port}).Allow
	}
	if !judge(&eth0.Ingress, "10.1.0.20", node.String(), 22) || judge(&eth0.Ingress, "10.1.0.20", node.String(), 80) || judge(&eth0.Ingress, "10.9.9.9", node.String(), 22) {
		t.Fatal("eth0 ingress: want ops on 22 only")
	}
	if len(eth0.Egress.Tiers) != 0 {
		t.Fatal("eth0 isolated for egress without egress rules")
	}
	// "all" has egress rules: isolated both ways; ingress allows nothing.
	if judge(&all.Ingress, "10.1.0.20", node.String(), 22) || !judge(&all.Egress, node.String(), "192.0.2.9", 443) || judge(&all.Egress, node.String(), "198.51.100.1", 443) {
		t.Fatal("all: want ingress denied, egress to 192.0.2.0/24 only")
	}
}
