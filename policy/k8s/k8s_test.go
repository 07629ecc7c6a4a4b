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
	npa "sigs.k8s.io/network-policy-api/apis/v1beta1"
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

// The report, as a user wrote it: a db pod whose container names
// port 8080 "http" without a protocol (a manifest is not defaulted), a
// policy admitting admins of the ops team to "http". The named port
// resolves, for the pods the selectors reach in another namespace.
func TestIngressNamedPortOfAnUndefaultedContainerPort(t *testing.T) {
	db := pod("data", "db", "10.1.0.10", map[string]string{"tier": "db"}, v1.ContainerPort{Name: "http", ContainerPort: 8080})
	admin := pod("ops", "admin", "10.1.0.20", map[string]string{"role": "admin"})
	guest := pod("ops", "guest", "10.1.0.21", map[string]string{"role": "guest"})
	c := Cluster{
		Pods: []*v1.Pod{db, admin, guest},
		Namespaces: []*v1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "data"}},
			{ObjectMeta: metav1.ObjectMeta{Name: "ops", Labels: map[string]string{"team": "ops"}}}},
		Policies: []*netv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "data", Name: "db-admins"}, Spec: netv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"tier": "db"}},
			Ingress: []netv1.NetworkPolicyIngressRule{{
				From: []netv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ops"}},
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "admin"}}}},
				Ports: []netv1.NetworkPolicyPort{{Protocol: ptr(v1.ProtocolTCP), Port: ptr(intstr.FromString("http"))}},
			}},
		}}},
	}
	res := Translate(c, "node-a")
	if len(res.Errors) != 0 {
		t.Fatal(res.Errors)
	}
	e := res.Endpoints["data/db"]
	in := func(src string, port uint16) bool {
		return policy.Evaluate(&e.Ingress, res.IPSets, policy.Packet{Src: netip.MustParseAddr(src), Dst: e.IP, Protocol: 6, DstPort: port}).Allow
	}
	if !in("10.1.0.20", 8080) || in("10.1.0.20", 9090) || in("10.1.0.21", 8080) {
		t.Fatalf("admin:8080 %v (want true), admin:9090 %v, guest:8080 %v (want false)", in("10.1.0.20", 8080), in("10.1.0.20", 9090), in("10.1.0.21", 8080))
	}
}

// An egress rule's named port is the destination's: pods that give the name
// different numbers are each reached on theirs only, in any namespace the
// peer reaches; an ipBlock peer reaches the pods inside it; no peer, every pod.
func TestEgressNamedPortIsEachDestinationsOwn(t *testing.T) {
	client := pod("app", "client", "10.1.0.5", map[string]string{"role": "client"})
	a := pod("web", "a", "10.1.1.10", map[string]string{"app": "web"}, v1.ContainerPort{Name: "http", ContainerPort: 8080})
	b := pod("api", "b", "10.1.2.10", map[string]string{"app": "web"}, v1.ContainerPort{Name: "http", ContainerPort: 9090, Protocol: v1.ProtocolTCP})
	dns := pod("kube-system", "dns", "10.1.3.10", nil, v1.ContainerPort{Name: "http", ContainerPort: 53, Protocol: v1.ProtocolUDP})
	egress := func(to ...netv1.NetworkPolicyPeer) *netv1.NetworkPolicy {
		return &netv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "out"}, Spec: netv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}},
			PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeEgress},
			Egress: []netv1.NetworkPolicyEgressRule{{To: to,
				Ports: []netv1.NetworkPolicyPort{{Port: ptr(intstr.FromString("http"))}}}}, // protocol unset: TCP
		}}
	}
	cases := []struct {
		name string
		to   []netv1.NetworkPolicyPeer
		want map[string]bool // "ip:port" -> allowed
	}{
		{"selectors across namespaces", []netv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{},
			PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}},
			map[string]bool{"10.1.1.10:8080": true, "10.1.2.10:9090": true, "10.1.1.10:9090": false, "10.1.2.10:8080": false, "10.1.3.10:53": false}},
		{"no peer: every pod", nil,
			map[string]bool{"10.1.1.10:8080": true, "10.1.2.10:9090": true, "10.1.1.10:9090": false, "10.9.9.9:8080": false}},
		{"an ipBlock holding one of them", []netv1.NetworkPolicyPeer{{IPBlock: &netv1.IPBlock{CIDR: "10.1.0.0/16", Except: []string{"10.1.2.0/24"}}}},
			map[string]bool{"10.1.1.10:8080": true, "10.1.2.10:9090": false}},
	}
	for _, tc := range cases {
		res := Translate(Cluster{Pods: []*v1.Pod{client, a, b, dns},
			Namespaces: []*v1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, {ObjectMeta: metav1.ObjectMeta{Name: "web"}},
				{ObjectMeta: metav1.ObjectMeta{Name: "api"}}, {ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}}},
			Policies: []*netv1.NetworkPolicy{egress(tc.to...)}}, "node-a")
		if len(res.Errors) != 0 {
			t.Fatal(res.Errors)
		}
		e := res.Endpoints["app/client"]
		if err := e.Egress.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for dst, want := range tc.want {
			ap := netip.MustParseAddrPort(dst)
			got := policy.Evaluate(&e.Egress, res.IPSets, policy.Packet{Src: e.IP, Dst: ap.Addr(), Protocol: 6, DstPort: ap.Port()}).Allow
			if got != want {
				t.Errorf("%s: to %s allowed %v, want %v", tc.name, dst, got, want)
			}
		}
	}
}

// An SCTP port allows SCTP to that port only, beside the policy's TCP
// port; a port of a protocol without ports (a manifest read from a folder
// is not validated) is refused by name and allows nothing.
func TestSCTPPortAllowsThatPort(t *testing.T) {
	web := pod("shop", "web", "10.1.0.10", map[string]string{"app": "web"})
	c := Cluster{Pods: []*v1.Pod{web}, Namespaces: []*v1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}},
		Policies: []*netv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "sctp"}, Spec: netv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []netv1.NetworkPolicyIngressRule{{Ports: []netv1.NetworkPolicyPort{
				{Protocol: ptr(v1.ProtocolSCTP), Port: ptr(intstr.FromInt32(3868))}, tcpPort(80),
				{Protocol: ptr(v1.Protocol("ICMP")), Port: ptr(intstr.FromInt32(9))}}}},
		}}}}
	res := Translate(c, "node-a")
	if len(res.Errors) != 1 || !strings.Contains(res.Errors[0].Error(), "shop/sctp") || !strings.Contains(res.Errors[0].Error(), "ICMP") {
		t.Fatalf("errors %v: want one naming the policy and ICMP", res.Errors)
	}
	e := res.Endpoints["shop/web"]
	for _, tc := range []struct {
		proto uint8
		port  uint16
		want  bool
	}{{132, 3868, true}, {132, 3869, false}, {6, 3868, false}, {6, 80, true}, {1, 9, false}} {
		got := policy.Evaluate(&e.Ingress, res.IPSets, policy.Packet{Src: netip.MustParseAddr("10.9.9.9"), Dst: e.IP, Protocol: tc.proto, DstPort: tc.port}).Allow
		if got != tc.want {
			t.Errorf("proto %d port %d: allowed %v, want %v", tc.proto, tc.port, got, tc.want)
		}
	}
}

// A ClusterNetworkPolicy's SCTP port matches SCTP to that port only: an
// Admin tier Deny of SCTP 3868 denies it and leaves SCTP to 3869 and TCP
// to 3868 to the (empty) lower tiers, which allow them.
func TestClusterNetworkPolicySCTPPortMatchesThatPort(t *testing.T) {
	web := pod("shop", "web", "10.1.0.10", map[string]string{"app": "web"})
	port := int32(3868)
	c := Cluster{Pods: []*v1.Pod{web}, Namespaces: []*v1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}},
		ClusterNetworkPolicies: []*npa.ClusterNetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "no-diameter"}, Spec: npa.ClusterNetworkPolicySpec{
			Tier: npa.AdminTier, Priority: 1,
			Subject: npa.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}},
			Ingress: []npa.ClusterNetworkPolicyIngressRule{{Action: npa.ClusterNetworkPolicyRuleActionDeny,
				From:      []npa.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}},
				Protocols: []npa.ClusterNetworkPolicyProtocol{{SCTP: &npa.ClusterNetworkPolicyProtocolSCTP{DestinationPort: &npa.Port{Number: port}}}}}},
		}}}}
	c.Pods = append(c.Pods, pod("shop", "client", "10.1.0.11", nil))
	res := Translate(c, "node-a")
	if len(res.Errors) != 0 {
		t.Fatalf("errors %v", res.Errors)
	}
	e := res.Endpoints["shop/web"]
	for _, tc := range []struct {
		proto uint8
		port  uint16
		want  bool
	}{{132, 3868, false}, {132, 3869, true}, {6, 3868, true}} {
		got := policy.Evaluate(&e.Ingress, res.IPSets, policy.Packet{Src: netip.MustParseAddr("10.1.0.11"), Dst: e.IP, Protocol: tc.proto, DstPort: tc.port}).Allow
		if got != tc.want {
			t.Errorf("proto %d port %d: allowed %v, want %v", tc.proto, tc.port, got, tc.want)
		}
	}
}
