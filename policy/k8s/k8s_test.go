package k8s

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/policy"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func pod(ns, name, ip string, lbls map[string]string, ports ...v1.ContainerPort) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec:   v1.PodSpec{NodeName: "node-a", Containers: []v1.Container{{Name: "c", Ports: ports}}},
		Status: v1.PodStatus{PodIP: ip}}
}

func ptr[T any](v T) *T { return &v }

func tcpPort(p int32) netv1.NetworkPolicyPort {
	return netv1.NetworkPolicyPort{Protocol: ptr(v1.ProtocolTCP), Port: ptr(intstr.FromInt32(p))}
}

// A fixture of the NetworkPolicy API's common shapes, checked by evaluating
// the translation with the reference evaluator.
func TestNetworkPolicyTranslation(t *testing.T) {
	web := pod("shop", "web", "10.1.0.10", map[string]string{"app": "web"}, v1.ContainerPort{Name: "http", ContainerPort: 8080, Protocol: v1.ProtocolTCP})
	api := pod("shop", "api", "10.1.0.20", map[string]string{"app": "api"})
	mon := pod("monitoring", "prom", "10.1.0.30", map[string]string{"app": "prom"})
	other := pod("other", "x", "10.1.0.40", map[string]string{"app": "x"})
	c := Cluster{
		Pods: []*v1.Pod{web, api, mon, other},
		Namespaces: []*v1.Namespace{
			{ObjectMeta: metav1.ObjectMeta{Name: "shop"}},
			{ObjectMeta: metav1.ObjectMeta{Name: "monitoring", Labels: map[string]string{"team": "ops"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "other"}},
		},
		Policies: []*netv1.NetworkPolicy{
			// web: isolated for ingress; api may reach the named port http;
			// the monitoring namespace may reach 9100-9199; 192.0.2.0/24 but
			// not 192.0.2.128/25 may reach anything.
			{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-in"}, Spec: netv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				Ingress: []netv1.NetworkPolicyIngressRule{
					{From: []netv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}}}},
						Ports: []netv1.NetworkPolicyPort{{Protocol: ptr(v1.ProtocolTCP), Port: ptr(intstr.FromString("http"))}}},
					{From: []netv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ops"}}}},
						Ports: []netv1.NetworkPolicyPort{{Protocol: ptr(v1.ProtocolTCP), Port: ptr(intstr.FromInt32(9100)), EndPort: ptr(int32(9199))}}},
					{From: []netv1.NetworkPolicyPeer{{IPBlock: &netv1.IPBlock{CIDR: "192.0.2.0/24", Except: []string{"192.0.2.128/25"}}}}},
				},
			}},
			// api: isolated for egress only, may reach web on 8080.
			{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api-out"}, Spec: netv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
				PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeEgress},
				Egress: []netv1.NetworkPolicyEgressRule{{To: []netv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}},
					Ports: []netv1.NetworkPolicyPort{tcpPort(8080)}}},
			}},
		},
	}
	res := Translate(c, "node-a")
	if len(res.Errors) != 0 {
		t.Fatal(res.Errors)
	}
	in := func(ep, src string, proto uint8, port uint16) bool {
		e := res.Endpoints[ep]
		return policy.Evaluate(&e.Ingress, res.IPSets, policy.Packet{Src: netip.MustParseAddr(src), Dst: e.IP, Protocol: proto, DstPort: port}).Allow
	}
	out := func(ep, dst string, port uint16) bool {
		e := res.Endpoints[ep]
		return policy.Evaluate(&e.Egress, res.IPSets, policy.Packet{Src: e.IP, Dst: netip.MustParseAddr(dst), Protocol: 6, DstPort: port}).Allow
	}
	cases := []struct {
		name string
		got  bool
		want bool
	}{
		{"api reaches web's named port", in("shop/web", "10.1.0.20", 6, 8080), true},
		{"api on another port", in("shop/web", "10.1.0.20", 6, 9090), false},
		{"api over UDP", in("shop/web", "10.1.0.20", 17, 8080), false},
		{"a pod of another namespace", in("shop/web", "10.1.0.40", 6, 8080), false},
		{"monitoring in the port range", in("shop/web", "10.1.0.30", 6, 9150), true},
		{"monitoring past endPort", in("shop/web", "10.1.0.30", 6, 9200), false},
		{"ipBlock", in("shop/web", "192.0.2.10", 17, 53), true},
		{"ipBlock except", in("shop/web", "192.0.2.200", 6, 80), false},
		{"api not isolated for ingress", in("shop/api", "10.9.9.9", 6, 1), true},
		{"web not isolated for egress", out("shop/web", "8.8.8.8", 53), true},
		{"api egress to web:8080", out("shop/api", "10.1.0.10", 8080), true},
		{"api egress elsewhere", out("shop/api", "10.1.0.30", 8080), false},
		{"prom not isolated", in("monitoring/prom", "10.1.0.40", 6, 1), true},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s: allowed %v, want %v", c.name, c.got, c.want)
		}
	}
	for _, ep := range res.Endpoints {
		for _, p := range []*policy.EndpointPolicy{&ep.Ingress, &ep.Egress} {
			if err := p.Validate(); err != nil {
				t.Fatalf("%s/%s: %v", ep.Namespace, ep.Name, err)
			}
		}
	}
}

// A selector that does not parse (the API server would refuse it; manifests
// are not checked by one) fails closed, with one error however many pods it
// concerns: an invalid peer selector lets nobody in, an invalid podSelector
// isolates its whole namespace.
func TestInvalidSelectorsFailClosed(t *testing.T) {
	web := pod("shop", "web", "10.1.0.10", map[string]string{"app": "web"})
	api := pod("shop", "api", "10.1.0.20", map[string]string{"app": "api"})
	bad := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Sometimes"}}}
	c := Cluster{
		Pods:       []*v1.Pod{web, api},
		Namespaces: []*v1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, {ObjectMeta: metav1.ObjectMeta{Name: "other"}}},
		Policies: []*netv1.NetworkPolicy{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "bad-peer"}, Spec: netv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				Ingress:     []netv1.NetworkPolicyIngressRule{{From: []netv1.NetworkPolicyPeer{{PodSelector: &bad}}}},
			}},
		},
	}
	res := Translate(c, "node-a")
	if len(res.Errors) != 1 || !strings.Contains(res.Errors[0].Error(), "shop/bad-peer") {
		t.Fatalf("errors %v: want one naming the policy", res.Errors)
	}
	e := res.Endpoints["shop/web"]
	if policy.Evaluate(&e.Ingress, res.IPSets, policy.Packet{Src: netip.MustParseAddr(api.Status.PodIP), Dst: e.IP, Protocol: 6, DstPort: 80}).Allow {
		t.Fatal("an invalid peer selector let a pod in")
	}

	c.Policies = []*netv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "bad-target"}, Spec: netv1.NetworkPolicySpec{
		PodSelector: bad,
		Ingress:     []netv1.NetworkPolicyIngressRule{{}}, // would allow everyone to what it selects
	}}}
	res = Translate(c, "node-a")
	if len(res.Errors) != 1 || !strings.Contains(res.Errors[0].Error(), "shop/bad-target") {
		t.Fatalf("errors %v: want one naming the policy", res.Errors)
	}
	for _, name := range []string{"shop/web", "shop/api"} {
		e := res.Endpoints[name]
		if policy.Evaluate(&e.Ingress, res.IPSets, policy.Packet{Src: netip.MustParseAddr("10.9.9.9"), Dst: e.IP, Protocol: 6, DstPort: 80}).Allow {
			t.Fatalf("%s: a policy with an invalid podSelector left its namespace open", name)
		}
	}
}
