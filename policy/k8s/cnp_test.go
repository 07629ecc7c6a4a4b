package k8s

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/policy"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	alpha "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	npa "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// adminFixture: web in ns shop (http=8080); clients in ns shop, ops and
// guest. Namespaces carry kubernetes.io/metadata.name, as the API server
// sets it.
func adminFixture() Cluster {
	ns := func(name string) *v1.Namespace {
		return &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/metadata.name": name}}}
	}
	return Cluster{
		Pods: []*v1.Pod{
			pod("shop", "web", "10.1.0.10", map[string]string{"app": "web"}, v1.ContainerPort{Name: "http", ContainerPort: 8080}),
			pod("shop", "cart", "10.1.0.11", map[string]string{"app": "cart"}),
			pod("ops", "admin", "10.1.0.20", map[string]string{"role": "admin"}),
			pod("guest", "visitor", "10.1.0.30", map[string]string{"role": "visitor"}),
		},
		Namespaces: []*v1.Namespace{ns("shop"), ns("ops"), ns("guest")},
	}
}

func nsSel(name string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": name}}
}

// webAllowsEveryone is a NetworkPolicy that isolates web and allows every source.
var webAllowsEveryone = &netv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-open"}, Spec: netv1.NetworkPolicySpec{
	PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
	Ingress:     []netv1.NetworkPolicyIngressRule{{}},
}}

// webAllowsOps isolates web and allows the ops namespace only.
var webAllowsOps = &netv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-ops"}, Spec: netv1.NetworkPolicySpec{
	PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
	Ingress:     []netv1.NetworkPolicyIngressRule{{From: []netv1.NetworkPolicyPeer{{NamespaceSelector: nsSel("ops")}}}},
}}

func cnp(name string, tier npa.Tier, prio int32, rules ...npa.ClusterNetworkPolicyIngressRule) *npa.ClusterNetworkPolicy {
	return &npa.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: npa.ClusterNetworkPolicySpec{
		Tier: tier, Priority: prio, Subject: npa.ClusterNetworkPolicySubject{Namespaces: nsSel("shop")}, Ingress: rules}}
}

func from(action npa.ClusterNetworkPolicyRuleAction, ns string) npa.ClusterNetworkPolicyIngressRule {
	return npa.ClusterNetworkPolicyIngressRule{Action: action, From: []npa.ClusterNetworkPolicyIngressPeer{{Namespaces: nsSel(ns)}}}
}

// admits evaluates the web pod's ingress for a source on TCP port.
func admits(t *testing.T, c Cluster, src string, port uint16) bool {
	t.Helper()
	res := Translate(c, "node-a")
	e := res.Endpoints["shop/web"]
	if err := e.Ingress.Validate(); err != nil {
		t.Fatal(err)
	}
	return policy.Evaluate(&e.Ingress, res.IPSets, policy.Packet{Src: netip.MustParseAddr(src), Dst: e.IP, Protocol: 6, DstPort: port}).Allow
}

const (
	fromOps   = "10.1.0.20"
	fromGuest = "10.1.0.30"
	fromShop  = "10.1.0.11"
)

func TestClusterNetworkPolicyTiers(t *testing.T) {
	accept, deny, pass := npa.ClusterNetworkPolicyRuleActionAccept, npa.ClusterNetworkPolicyRuleActionDeny, npa.ClusterNetworkPolicyRuleActionPass
	cases := []struct {
		name  string
		nps   []*netv1.NetworkPolicy
		cnps  []*npa.ClusterNetworkPolicy
		allow map[string]bool // source -> admitted on 8080
	}{
		{"admin Deny overrides a NetworkPolicy allow", []*netv1.NetworkPolicy{webAllowsEveryone},
			[]*npa.ClusterNetworkPolicy{cnp("no-guests", npa.AdminTier, 10, from(deny, "guest"))},
			map[string]bool{fromGuest: false, fromOps: true, fromShop: true}},
		{"admin Accept overrides a NetworkPolicy's isolation", []*netv1.NetworkPolicy{webAllowsOps},
			[]*npa.ClusterNetworkPolicy{cnp("guests-ok", npa.AdminTier, 10, from(accept, "guest"))},
			map[string]bool{fromGuest: true, fromOps: true, fromShop: false}},
		{"admin Pass falls through to the NetworkPolicy", []*netv1.NetworkPolicy{webAllowsOps},
			[]*npa.ClusterNetworkPolicy{cnp("pass-ops", npa.AdminTier, 10, from(pass, "ops"), from(pass, "guest")),
				cnp("deny-later", npa.AdminTier, 20, from(deny, "ops"))},
			map[string]bool{fromOps: true, fromGuest: false, fromShop: false}},
		{"the lower priority number decides first", nil,
			[]*npa.ClusterNetworkPolicy{cnp("a-deny", npa.AdminTier, 20, from(deny, "ops")), cnp("z-accept", npa.AdminTier, 10, from(accept, "ops"))},
			map[string]bool{fromOps: true, fromGuest: true}},
		{"baseline is the default for pods no NetworkPolicy isolates", nil,
			[]*npa.ClusterNetworkPolicy{cnp("baseline", npa.BaselineTier, 0, from(deny, "guest"))},
			map[string]bool{fromGuest: false, fromOps: true, fromShop: true}},
		{"a NetworkPolicy overrides the baseline", []*netv1.NetworkPolicy{webAllowsEveryone},
			[]*npa.ClusterNetworkPolicy{cnp("baseline", npa.BaselineTier, 0, from(deny, "guest"))},
			map[string]bool{fromGuest: true}},
		{"admin Pass to the baseline when no NetworkPolicy isolates", nil,
			[]*npa.ClusterNetworkPolicy{cnp("pass", npa.AdminTier, 10, from(pass, "guest")), cnp("baseline", npa.BaselineTier, 0, from(deny, "guest"))},
			map[string]bool{fromGuest: false, fromOps: true}},
	}
	for _, tc := range cases {
		c := adminFixture()
		c.Policies, c.ClusterNetworkPolicies = tc.nps, tc.cnps
		for src, want := range tc.allow {
			if got := admits(t, c, src, 8080); got != want {
				t.Errorf("%s: from %s admitted %v, want %v", tc.name, src, got, want)
			}
		}
	}
}

// The v1alpha1 kinds mean what their ClusterNetworkPolicy conversions mean:
// ANP Deny over a NetworkPolicy allow, ANP Pass to the NetworkPolicy, BANP
// as the default; with ports by number, range and name.
func TestAdminAndBaselineAdminNetworkPolicy(t *testing.T) {
	subject := alpha.AdminNetworkPolicySubject{Namespaces: nsSel("shop")}
	ports := func(ps ...alpha.AdminNetworkPolicyPort) *[]alpha.AdminNetworkPolicyPort { return &ps }
	named := "http"
	c := adminFixture()
	c.Policies = []*netv1.NetworkPolicy{webAllowsOps}
	c.AdminNetworkPolicies = []*alpha.AdminNetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "anp"}, Spec: alpha.AdminNetworkPolicySpec{
		Priority: 5, Subject: subject,
		Ingress: []alpha.AdminNetworkPolicyIngressRule{
			{Action: alpha.AdminNetworkPolicyRuleActionDeny, From: []alpha.AdminNetworkPolicyIngressPeer{{Namespaces: nsSel("ops")}},
				Ports: ports(alpha.AdminNetworkPolicyPort{PortRange: &alpha.PortRange{Protocol: v1.ProtocolTCP, Start: 9000, End: 9099}})},
			{Action: alpha.AdminNetworkPolicyRuleActionAllow, From: []alpha.AdminNetworkPolicyIngressPeer{{Namespaces: nsSel("guest")}},
				Ports: ports(alpha.AdminNetworkPolicyPort{NamedPort: &named})},
			{Action: alpha.AdminNetworkPolicyRuleActionPass, From: []alpha.AdminNetworkPolicyIngressPeer{{Pods: &alpha.NamespacedPod{
				NamespaceSelector: *nsSel("shop"), PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "cart"}}}}}},
		}}}}
	c.BaselineAdminNetworkPolicies = []*alpha.BaselineAdminNetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: alpha.BaselineAdminNetworkPolicySpec{
		Subject: alpha.AdminNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}},
		Ingress: []alpha.BaselineAdminNetworkPolicyIngressRule{{Action: alpha.BaselineAdminNetworkPolicyRuleActionDeny,
			From: []alpha.AdminNetworkPolicyIngressPeer{{Namespaces: nsSel("guest")}}}}}}}
	for _, tc := range []struct {
		src  string
		port uint16
		want bool
	}{
		{fromOps, 9050, false},   // the ANP's Deny beats the NetworkPolicy's allow of ops
		{fromOps, 8080, true},    // outside the range: the NetworkPolicy admits ops
		{fromGuest, 8080, true},  // the ANP allows guests on web's port named http ...
		{fromGuest, 9050, false}, // ... and on no other (the NetworkPolicy isolates web)
		{fromShop, 8080, false},  // Pass: the NetworkPolicy decides, and admits ops only
	} {
		if got := admits(t, c, tc.src, tc.port); got != tc.want {
			t.Errorf("from %s to %d: admitted %v, want %v", tc.src, tc.port, got, tc.want)
		}
	}
	// The BANP holds for a pod no NetworkPolicy isolates: cart.
	res := Translate(c, "node-a")
	e := res.Endpoints["shop/cart"]
	guest := policy.Evaluate(&e.Ingress, res.IPSets, policy.Packet{Src: netip.MustParseAddr(fromGuest), Dst: e.IP, Protocol: 6, DstPort: 80}).Allow
	ops := policy.Evaluate(&e.Ingress, res.IPSets, policy.Packet{Src: netip.MustParseAddr(fromOps), Dst: e.IP, Protocol: 6, DstPort: 80}).Allow
	if guest || !ops {
		t.Errorf("cart under the BANP: guest admitted %v (want false), ops %v (want true)", guest, ops)
	}
}

// Egress: networks peers (IPv4 kept, IPv6 ignored), and what cannot be read
// fails closed as the API asks: Accept matches nothing, Deny everything.
func TestClusterNetworkPolicyEgressAndFailClosed(t *testing.T) {
	c := adminFixture()
	egress := func(rules ...npa.ClusterNetworkPolicyEgressRule) *npa.ClusterNetworkPolicy {
		return &npa.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "out"}, Spec: npa.ClusterNetworkPolicySpec{
			Tier: npa.AdminTier, Priority: 1, Subject: npa.ClusterNetworkPolicySubject{Namespaces: nsSel("shop")}, Egress: rules}}
	}
	to := func(dst string) bool {
		res := Translate(c, "node-a")
		e := res.Endpoints["shop/web"]
		if err := e.Egress.Validate(); err != nil {
			t.Fatal(err)
		}
		return policy.Evaluate(&e.Egress, res.IPSets, policy.Packet{Src: e.IP, Dst: netip.MustParseAddr(dst), Protocol: 6, DstPort: 443}).Allow
	}
	c.ClusterNetworkPolicies = []*npa.ClusterNetworkPolicy{egress(
		npa.ClusterNetworkPolicyEgressRule{Action: npa.ClusterNetworkPolicyRuleActionDeny, To: []npa.ClusterNetworkPolicyEgressPeer{{Networks: []npa.CIDR{"192.0.2.0/24", "fd00::/8"}}}})}
	if to("192.0.2.7") || !to("198.51.100.7") {
		t.Fatalf("networks peer: 192.0.2.7 allowed %v (want false), 198.51.100.7 %v (want true)", to("192.0.2.7"), to("198.51.100.7"))
	}

	c.ClusterNetworkPolicies = []*npa.ClusterNetworkPolicy{egress(
		npa.ClusterNetworkPolicyEgressRule{Action: npa.ClusterNetworkPolicyRuleActionDeny, To: []npa.ClusterNetworkPolicyEgressPeer{{DomainNames: []npa.DomainName{"example.com"}}}})}
	if to("198.51.100.7") {
		t.Fatal("a Deny rule with a peer Sluice cannot read let traffic through")
	}
	res := Translate(c, "node-a")
	if len(res.Errors) != 1 || !strings.Contains(res.Errors[0].Error(), "clusternetworkpolicy out") {
		t.Fatalf("errors %v: want one naming the policy", res.Errors)
	}

	c.ClusterNetworkPolicies = []*npa.ClusterNetworkPolicy{egress(
		npa.ClusterNetworkPolicyEgressRule{Action: npa.ClusterNetworkPolicyRuleActionAccept, To: []npa.ClusterNetworkPolicyEgressPeer{{DomainNames: []npa.DomainName{"example.com"}}}},
		npa.ClusterNetworkPolicyEgressRule{Action: npa.ClusterNetworkPolicyRuleActionDeny, To: []npa.ClusterNetworkPolicyEgressPeer{{Networks: []npa.CIDR{"0.0.0.0/0"}}}})}
	if to("198.51.100.7") {
		t.Fatal("an Accept rule with a peer Sluice cannot read accepted traffic")
	}
}

// Egress nodes peers: the addresses (InternalIP and ExternalIP) of the nodes
// the selector matches, kept current by a Translator as nodes are labelled,
// readdressed, added and removed; a selector that matches no node matches no
// destination (an Accept rule then admits nothing, a Deny denies nothing).
func TestClusterNetworkPolicyNodesPeers(t *testing.T) {
	c := adminFixture()
	node := func(name string, labels map[string]string, addrs ...v1.NodeAddress) *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Status: v1.NodeStatus{Addresses: addrs}}
	}
	infra := map[string]string{"role": "infra"}
	c.Nodes = []*v1.Node{
		node("n1", infra, v1.NodeAddress{Type: v1.NodeInternalIP, Address: "10.200.0.1"}, v1.NodeAddress{Type: v1.NodeExternalIP, Address: "203.0.113.1"},
			v1.NodeAddress{Type: v1.NodeHostName, Address: "n1"}),
		node("n2", map[string]string{"role": "worker"}, v1.NodeAddress{Type: v1.NodeInternalIP, Address: "10.200.0.2"}),
	}
	// web may reach infra nodes only (on anything), and nothing else.
	c.ClusterNetworkPolicies = []*npa.ClusterNetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "to-infra"}, Spec: npa.ClusterNetworkPolicySpec{
		Tier: npa.AdminTier, Priority: 1, Subject: npa.ClusterNetworkPolicySubject{Namespaces: nsSel("shop")},
		Egress: []npa.ClusterNetworkPolicyEgressRule{
			{Action: npa.ClusterNetworkPolicyRuleActionAccept, To: []npa.ClusterNetworkPolicyEgressPeer{{Nodes: &metav1.LabelSelector{MatchLabels: infra}}}},
			{Action: npa.ClusterNetworkPolicyRuleActionDeny, To: []npa.ClusterNetworkPolicyEgressPeer{{Networks: []npa.CIDR{"0.0.0.0/0"}}}},
		}}}}
	tr := NewTranslator("node-a")
	reach := func(step string, want map[string]bool) {
		t.Helper()
		res := tr.Translate(c)
		if len(res.Errors) != 0 {
			t.Fatalf("%s: errors %v", step, res.Errors)
		}
		e := res.Endpoints["shop/web"]
		if err := e.Egress.Validate(); err != nil {
			t.Fatal(err)
		}
		for dst, allowed := range want {
			if got := policy.Evaluate(&e.Egress, res.IPSets, policy.Packet{Src: e.IP, Dst: netip.MustParseAddr(dst), Protocol: 6, DstPort: 10250}).Allow; got != allowed {
				t.Errorf("%s: web to %s allowed %v, want %v", step, dst, got, allowed)
			}
		}
	}
	reach("n1 is infra", map[string]bool{"10.200.0.1": true, "203.0.113.1": true, "10.200.0.2": false, "198.51.100.7": false})
	// n2 becomes infra (a new object, as an informer hands it over).
	c.Nodes = []*v1.Node{c.Nodes[0], node("n2", infra, v1.NodeAddress{Type: v1.NodeInternalIP, Address: "10.200.0.2"})}
	reach("n2 labelled", map[string]bool{"10.200.0.1": true, "10.200.0.2": true})
	// n1 gets another address, and leaves.
	c.Nodes = []*v1.Node{node("n1", infra, v1.NodeAddress{Type: v1.NodeInternalIP, Address: "10.200.0.9"}), c.Nodes[1]}
	reach("n1 readdressed", map[string]bool{"10.200.0.1": false, "10.200.0.9": true, "10.200.0.2": true})
	c.Nodes = c.Nodes[1:]
	reach("n1 gone", map[string]bool{"10.200.0.9": false, "10.200.0.2": true})
	c.Nodes = nil
	reach("no node", map[string]bool{"10.200.0.2": false})
}
