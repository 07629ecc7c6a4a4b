package policy_test

import (
	"net/netip"
	"testing"

	"github.com/sluice-net/sluice/policy"
	"github.com/sluice-net/sluice/policy/k8s"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	alpha "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	npa "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// The translation of every construct the Kubernetes policy APIs bring —
// ClusterNetworkPolicy's Admin and Baseline tiers with Accept, Deny and Pass,
// the v1alpha1 AdminNetworkPolicy and BaselineAdminNetworkPolicy, a
// NetworkPolicy between them, named ports, port ranges, networks — compiled
// and run: every pod's compiled verdict and deciding rule equal the reference
// evaluator's, for every source, destination, protocol and port of a grid.
func TestTranslatedAdminTiersCompiledEqualReference(t *testing.T) {
	e := newEnv(t)
	sel := func(kv ...string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{kv[0]: kv[1]}}
	}
	ns := func(name string) *v1.Namespace {
		return &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"name": name}}}
	}
	pod := func(namespace, name, ip, app string, ports ...v1.ContainerPort) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{"app": app}},
			Spec:   v1.PodSpec{NodeName: "node-a", Containers: []v1.Container{{Name: "c", Ports: ports}}},
			Status: v1.PodStatus{PodIP: ip}}
	}
	named := "http"
	port := func(n int32) *npa.Port { return &npa.Port{Number: n} }
	c := k8s.Cluster{
		Namespaces: []*v1.Namespace{ns("a"), ns("b"), ns("c")},
		Pods: []*v1.Pod{
			pod("a", "web", "10.0.0.1", "web", v1.ContainerPort{Name: "http", ContainerPort: 8080}),
			pod("a", "db", "10.0.0.2", "db", v1.ContainerPort{Name: "http", ContainerPort: 5432}),
			pod("b", "client", "10.0.1.1", "client"),
			pod("c", "other", "10.0.2.1", "other", v1.ContainerPort{Name: "http", ContainerPort: 9090, Protocol: v1.ProtocolUDP}),
		},
		Policies: []*netv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "db"}, Spec: netv1.NetworkPolicySpec{
			PodSelector: *sel("app", "db"),
			Ingress: []netv1.NetworkPolicyIngressRule{{From: []netv1.NetworkPolicyPeer{{NamespaceSelector: sel("name", "b")}},
				Ports: []netv1.NetworkPolicyPort{{Port: &intstr.IntOrString{Type: intstr.String, StrVal: "http"}}}}},
		}}},
		ClusterNetworkPolicies: []*npa.ClusterNetworkPolicy{
			{ObjectMeta: metav1.ObjectMeta{Name: "admin"}, Spec: npa.ClusterNetworkPolicySpec{Tier: npa.AdminTier, Priority: 3,
				Subject: npa.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}},
				Ingress: []npa.ClusterNetworkPolicyIngressRule{
					{Action: npa.ClusterNetworkPolicyRuleActionDeny, From: []npa.ClusterNetworkPolicyIngressPeer{{Namespaces: sel("name", "c")}},
						Protocols: []npa.ClusterNetworkPolicyProtocol{{TCP: &npa.ClusterNetworkPolicyProtocolTCP{DestinationPort: &npa.Port{Range: &npa.PortRange{Start: 8000, End: 8999}}}}}},
					{Action: npa.ClusterNetworkPolicyRuleActionPass, From: []npa.ClusterNetworkPolicyIngressPeer{{Pods: &npa.NamespacedPod{NamespaceSelector: *sel("name", "b"), PodSelector: *sel("app", "client")}}}},
					{Action: npa.ClusterNetworkPolicyRuleActionAccept, From: []npa.ClusterNetworkPolicyIngressPeer{{Namespaces: sel("name", "c")}},
						Protocols: []npa.ClusterNetworkPolicyProtocol{{DestinationNamedPort: "http"}, {UDP: &npa.ClusterNetworkPolicyProtocolUDP{DestinationPort: port(53)}}}},
				},
				Egress: []npa.ClusterNetworkPolicyEgressRule{
					{Action: npa.ClusterNetworkPolicyRuleActionDeny, To: []npa.ClusterNetworkPolicyEgressPeer{{Networks: []npa.CIDR{"10.0.2.0/24"}}},
						Protocols: []npa.ClusterNetworkPolicyProtocol{{TCP: &npa.ClusterNetworkPolicyProtocolTCP{DestinationPort: port(22)}}}},
					{Action: npa.ClusterNetworkPolicyRuleActionAccept, To: []npa.ClusterNetworkPolicyEgressPeer{{Namespaces: &metav1.LabelSelector{}}},
						Protocols: []npa.ClusterNetworkPolicyProtocol{{DestinationNamedPort: "http"}}},
				}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "baseline"}, Spec: npa.ClusterNetworkPolicySpec{Tier: npa.BaselineTier,
				Subject: npa.ClusterNetworkPolicySubject{Pods: &npa.NamespacedPod{NamespaceSelector: metav1.LabelSelector{}, PodSelector: *sel("app", "web")}},
				Egress: []npa.ClusterNetworkPolicyEgressRule{{Action: npa.ClusterNetworkPolicyRuleActionDeny,
					To: []npa.ClusterNetworkPolicyEgressPeer{{Networks: []npa.CIDR{"0.0.0.0/0"}}}}}}},
		},
		AdminNetworkPolicies: []*alpha.AdminNetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "anp"}, Spec: alpha.AdminNetworkPolicySpec{
			Priority: 1, Subject: alpha.AdminNetworkPolicySubject{Namespaces: sel("name", "a")},
			Ingress: []alpha.AdminNetworkPolicyIngressRule{{Action: alpha.AdminNetworkPolicyRuleActionAllow,
				From:  []alpha.AdminNetworkPolicyIngressPeer{{Namespaces: sel("name", "a")}},
				Ports: &[]alpha.AdminNetworkPolicyPort{{NamedPort: &named}, {PortNumber: &alpha.Port{Protocol: v1.ProtocolUDP, Port: 53}}}}},
		}}},
		BaselineAdminNetworkPolicies: []*alpha.BaselineAdminNetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: alpha.BaselineAdminNetworkPolicySpec{
			Subject: alpha.AdminNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}},
			Ingress: []alpha.BaselineAdminNetworkPolicyIngressRule{{Action: alpha.BaselineAdminNetworkPolicyRuleActionDeny,
				From: []alpha.AdminNetworkPolicyIngressPeer{{Namespaces: sel("name", "b")}}}}}}},
	}
	res := k8s.Translate(c, "node-a")
	if len(res.Errors) != 0 {
		t.Fatal(res.Errors)
	}
	e.setIPSets(res.IPSets)
	addrs := []string{"10.0.0.1", "10.0.0.2", "10.0.1.1", "10.0.2.1", "192.0.2.1"}
	ports := []uint16{22, 53, 80, 5432, 8080, 8500, 9090}
	cases := 0
	for name, ep := range res.Endpoints {
		for _, dir := range []struct {
			ingress bool
			p       *policy.EndpointPolicy
		}{{true, &ep.Ingress}, {false, &ep.Egress}} {
			if len(dir.p.Tiers) == 0 {
				continue
			}
			if err := dir.p.Validate(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			prog := e.load(dir.p, 5)
			for _, peer := range addrs {
				for _, proto := range []uint8{6, 17} {
					for _, dport := range ports {
						pkt := policy.Packet{Src: netip.MustParseAddr(peer), Dst: ep.IP, Protocol: proto, DstPort: dport, SrcPort: 40000}
						if !dir.ingress {
							pkt.Src, pkt.Dst = ep.IP, netip.MustParseAddr(peer)
						}
						want := policy.Evaluate(dir.p, res.IPSets, pkt)
						allow, rule := e.run(prog, pkt, dir.ingress)
						if allow != want.Allow || rule != want.RuleID {
							t.Fatalf("%s ingress=%v %+v: compiled %v rule %#x, reference %v rule %#x (%s)", name, dir.ingress, pkt,
								allow, rule, want.Allow, want.RuleID, res.Rules[want.RuleID])
						}
						cases++
					}
				}
			}
		}
	}
	if cases == 0 {
		t.Fatal("no endpoint had a policy")
	}
	t.Logf("%d packets agreed", cases)
}
