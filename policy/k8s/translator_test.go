package k8s

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	alpha "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	npa "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// randomCluster is a small cluster with every kind of peer: pod and
// namespace selectors (labels and expressions), ipBlocks, named ports of
// both directions, and now and then a selector that does not parse.
type randomCluster struct {
	rng  *rand.Rand
	c    Cluster
	next int
}

func (r *randomCluster) pod() *v1.Pod {
	r.next++
	ns := fmt.Sprintf("ns%d", r.rng.IntN(4))
	p := pod(ns, fmt.Sprintf("pod%d", r.next), fmt.Sprintf("10.1.%d.%d", r.next/250, r.next%250),
		map[string]string{"app": fmt.Sprintf("app%d", r.rng.IntN(6)), "tier": []string{"web", "db"}[r.rng.IntN(2)]},
		v1.ContainerPort{Name: "http", ContainerPort: int32(8000 + r.rng.IntN(3))})
	p.Spec.NodeName = fmt.Sprintf("node-%d", r.rng.IntN(3))
	return p
}

func (r *randomCluster) namespace(i int) *v1.Namespace {
	lbls := map[string]string{"kubernetes.io/metadata.name": fmt.Sprintf("ns%d", i)}
	if r.rng.IntN(2) == 0 {
		lbls["team"] = "ops"
	}
	return &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns%d", i), Labels: lbls}}
}

func (r *randomCluster) policy() *netv1.NetworkPolicy {
	r.next++
	app := func() map[string]string { return map[string]string{"app": fmt.Sprintf("app%d", r.rng.IntN(6))} }
	peers := []netv1.NetworkPolicyPeer{
		{PodSelector: &metav1.LabelSelector{MatchLabels: app()}},
		{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ops"}}},
		{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"db"}}}},
			NamespaceSelector: &metav1.LabelSelector{}},
		{IPBlock: &netv1.IPBlock{CIDR: "10.1.0.0/16", Except: []string{"10.1.0.0/28"}}},           // the pods from .16 on
		{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "bad value!"}}}, // does not parse
	}
	pick := func() []netv1.NetworkPolicyPeer {
		return []netv1.NetworkPolicyPeer{peers[r.rng.IntN(len(peers)-1)], peers[r.rng.IntN(len(peers))]}
	}
	named := netv1.NetworkPolicyPort{Port: ptr(intstr.FromString("http"))}
	return &netv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", r.rng.IntN(4)), Name: fmt.Sprintf("np%d", r.next)},
		Spec: netv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: app()},
			PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeIngress, netv1.PolicyTypeEgress},
			Ingress:     []netv1.NetworkPolicyIngressRule{{From: pick(), Ports: []netv1.NetworkPolicyPort{tcpPort(80), named}}},
			Egress:      []netv1.NetworkPolicyEgressRule{{To: pick(), Ports: []netv1.NetworkPolicyPort{named}}},
		}}
}

// clusterPolicy is a ClusterNetworkPolicy of either tier whose peers are
// namespaces, pods of namespaces, networks, and destination named ports.
func (r *randomCluster) clusterPolicy() *npa.ClusterNetworkPolicy {
	r.next++
	actions := []npa.ClusterNetworkPolicyRuleAction{npa.ClusterNetworkPolicyRuleActionAccept, npa.ClusterNetworkPolicyRuleActionDeny, npa.ClusterNetworkPolicyRuleActionPass}
	app := &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", r.rng.IntN(6))}}
	team := &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ops"}}
	tier := []npa.Tier{npa.AdminTier, npa.BaselineTier}[r.rng.IntN(2)]
	action := actions[r.rng.IntN(len(actions))]
	if tier == npa.BaselineTier && action == npa.ClusterNetworkPolicyRuleActionPass {
		action = npa.ClusterNetworkPolicyRuleActionDeny
	}
	subject := npa.ClusterNetworkPolicySubject{Namespaces: team}
	if r.rng.IntN(2) == 0 {
		subject = npa.ClusterNetworkPolicySubject{Pods: &npa.NamespacedPod{NamespaceSelector: metav1.LabelSelector{}, PodSelector: *app}}
	}
	return &npa.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cnp%d", r.next)}, Spec: npa.ClusterNetworkPolicySpec{
		Tier: tier, Priority: int32(r.rng.IntN(3)), Subject: subject,
		Ingress: []npa.ClusterNetworkPolicyIngressRule{{Action: action, From: []npa.ClusterNetworkPolicyIngressPeer{
			{Pods: &npa.NamespacedPod{NamespaceSelector: *team, PodSelector: *app}}}}},
		Egress: []npa.ClusterNetworkPolicyEgressRule{{Action: action,
			To:        []npa.ClusterNetworkPolicyEgressPeer{{Namespaces: team}, {Networks: []npa.CIDR{"10.1.0.0/20"}}},
			Protocols: []npa.ClusterNetworkPolicyProtocol{{DestinationNamedPort: "http"}}}},
	}}
}

// adminPolicy is an AdminNetworkPolicy (v1alpha1), converted before it is
// translated.
func (r *randomCluster) adminPolicy() *alpha.AdminNetworkPolicy {
	r.next++
	return &alpha.AdminNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("anp%d", r.next)}, Spec: alpha.AdminNetworkPolicySpec{
		Priority: int32(r.rng.IntN(3)),
		Subject:  alpha.AdminNetworkPolicySubject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ops"}}},
		Ingress: []alpha.AdminNetworkPolicyIngressRule{{Action: alpha.AdminNetworkPolicyRuleActionDeny,
			From: []alpha.AdminNetworkPolicyIngressPeer{{Pods: &alpha.NamespacedPod{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"tier": "db"}}}}}}},
	}}
}

// updatePod changes a pod picked at random, as an informer hands over an
// update: a new object in the old one's place.
func (r *randomCluster) updatePod(change func(*v1.Pod)) {
	i := r.rng.IntN(len(r.c.Pods))
	p := r.c.Pods[i].DeepCopy()
	change(p)
	r.c.Pods = slices.Clone(r.c.Pods)
	r.c.Pods[i] = p
}

// change makes one change, as an informer would hand it over: a changed
// object is a new one, the others keep theirs.
func (r *randomCluster) change() string {
	c := &r.c
	switch k := r.rng.IntN(13); {
	case k == 0:
		c.Pods = append(slices.Clip(c.Pods), r.pod())
		return "pod added"
	case k == 1 && r.rng.IntN(4) == 0:
		pods := make([]*v1.Pod, len(c.Pods))
		for i, p := range c.Pods {
			pods[i] = p.DeepCopy()
		}
		c.Pods = pods
		return "every pod a new object"
	case k == 2 && len(c.Pods) > 0:
		i := r.rng.IntN(len(c.Pods))
		c.Pods = slices.Delete(slices.Clone(c.Pods), i, i+1)
		return "pod deleted"
	case k <= 4 && len(c.Pods) > 0:
		r.updatePod(func(p *v1.Pod) { p.Labels["app"] = fmt.Sprintf("app%d", r.rng.IntN(6)) })
		return "pod relabelled"
	case k == 5 && len(c.Pods) > 0:
		r.updatePod(func(p *v1.Pod) { p.Status.PodIP = fmt.Sprintf("10.2.%d.%d", r.rng.IntN(250), r.rng.IntN(250)) })
		return "pod readdressed"
	case k == 6:
		i := r.rng.IntN(len(c.Namespaces))
		c.Namespaces = slices.Clone(c.Namespaces)
		c.Namespaces[i] = r.namespace(i)
		return "namespace relabelled"
	case k == 7 && len(c.Policies) > 0:
		i := r.rng.IntN(len(c.Policies))
		c.Policies = slices.Clone(c.Policies)
		c.Policies[i] = r.policy()
		return "policy replaced"
	case k == 8 && len(c.Pods) > 0:
		r.updatePod(func(p *v1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = int32(8000 + r.rng.IntN(3)) })
		return "pod's named port renumbered"
	case k == 9 && len(c.Pods) > 0:
		r.updatePod(func(p *v1.Pod) { p.Spec.NodeName = fmt.Sprintf("node-%d", r.rng.IntN(3)) })
		return "pod moved to another node"
	case k == 10 && len(c.ClusterNetworkPolicies) > 0 && r.rng.IntN(2) == 0:
		i := r.rng.IntN(len(c.ClusterNetworkPolicies))
		c.ClusterNetworkPolicies = slices.Delete(slices.Clone(c.ClusterNetworkPolicies), i, i+1)
		return "cluster network policy deleted"
	case k == 10:
		c.ClusterNetworkPolicies = append(slices.Clip(c.ClusterNetworkPolicies), r.clusterPolicy())
		return "cluster network policy added"
	case k == 11 && len(c.AdminNetworkPolicies) > 0:
		c.AdminNetworkPolicies = nil
		return "admin network policies deleted"
	case k == 11:
		c.AdminNetworkPolicies = []*alpha.AdminNetworkPolicy{r.adminPolicy()}
		return "admin network policy added"
	default:
		c.Policies = append(slices.Clip(c.Policies), r.policy())
		return "policy added"
	}
}

// difference names the first part in which two Results differ, or "".
func difference(got, want *Result) string {
	for _, k := range slices.Sorted(maps.Keys(want.Endpoints)) {
		if !reflect.DeepEqual(got.Endpoints[k], want.Endpoints[k]) {
			return fmt.Sprintf("endpoint %s:\n got %+v\nwant %+v", k, got.Endpoints[k], want.Endpoints[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got.Endpoints)) {
		if _, ok := want.Endpoints[k]; !ok {
			return fmt.Sprintf("endpoint %s is not Translate's", k)
		}
	}
	for _, part := range []struct {
		name      string
		got, want any
	}{{"IP sets", got.IPSets, want.IPSets}, {"rules", got.Rules, want.Rules}, {"errors", comparable(got)[3], comparable(want)[3]}} {
		if !reflect.DeepEqual(part.got, part.want) {
			return fmt.Sprintf("%s:\n got %+v\nwant %+v", part.name, part.got, part.want)
		}
	}
	return ""
}

// comparable strips a Result to what DeepEqual can judge: errors by text.
func comparable(r *Result) []any {
	var errs []string
	for _, e := range r.Errors {
		errs = append(errs, e.Error())
	}
	return []any{r.Endpoints, r.IPSets, r.Rules, errs}
}

// A Translator given one state of the cluster after another translates
// each as Translate does from nothing: pods added, deleted, relabelled,
// readdressed, moved between nodes and given other port numbers,
// namespaces relabelled, NetworkPolicies added and replaced,
// ClusterNetworkPolicies and AdminNetworkPolicies added and deleted, and
// the whole pod list replaced at once, over 400 changes and three seeds.
// Most changes leave most endpoints' translations standing: the test also
// checks that some were kept, and some translated again.
func TestTranslatorTranslatesEachStateAsTranslateDoes(t *testing.T) {
	for seed := range uint64(3) {
		r := &randomCluster{rng: rand.New(rand.NewPCG(seed, 1))}
		for i := range 4 {
			r.c.Namespaces = append(r.c.Namespaces, r.namespace(i))
		}
		for range 60 {
			r.c.Pods = append(r.c.Pods, r.pod())
		}
		for range 12 {
			r.c.Policies = append(r.c.Policies, r.policy())
		}
		r.c.HostEndpoints = []*HostEndpoint{{ObjectMeta: metav1.ObjectMeta{Name: "eth0"}, Spec: HostEndpointSpec{InterfaceName: "eth0",
			Ingress: []netv1.NetworkPolicyIngressRule{{From: []netv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ops"}}}}}}}}}
		tr := NewTranslator("node-1")
		kept, again := 0, 0
		for step := range 400 {
			what := "the first state"
			if step > 0 {
				what = r.change()
			}
			before := maps.Clone(tr.memos)
			got, want := tr.Translate(r.c), Translate(r.c, "node-1")
			// An endpoint with rules whose record is the one before (or
			// its renumbered copy) was kept; one with a new record, of the
			// same pod object, was translated again.
			for k, m := range tr.memos {
				if b := before[k]; b != nil && b.pod == m.pod && len(b.rules) > 0 && len(m.rules) > 0 {
					if &b.rules[0] == &m.rules[0] {
						kept++
					} else {
						again++
					}
				}
			}
			if diff := difference(got, want); diff != "" {
				t.Fatalf("seed %d, step %d (%s): the Translator's translation differs from Translate's: %s", seed, step, what, diff)
			}
			if step == 0 && (len(got.Endpoints) == 0 || len(got.IPSets) == 0 || len(got.Errors) == 0) {
				t.Fatalf("the cluster translates to too little to judge: %+v", comparable(got))
			}
		}
		// A translation of the same state replays every endpoint, and
		// keeps the selectors they parsed.
		if n := len(tr.parsed.m); tr.Translate(r.c) != nil && len(tr.parsed.m) != n {
			t.Errorf("seed %d: %d selectors kept parsed, %d after a translation of the same state", seed, n, len(tr.parsed.m))
		}
		if kept == 0 || again == 0 {
			t.Errorf("seed %d: %d endpoints' translations kept, %d translated again: the test does not exercise both", seed, kept, again)
		}
		if n := len(tr.parsed.m); n > 4*len(r.c.Policies)+8*len(r.c.ClusterNetworkPolicies)+16 {
			t.Errorf("seed %d: %d selectors kept for %d policies: the ones no longer used are not forgotten", seed, n, len(r.c.Policies))
		}
		if len(tr.pods.seen) != len(r.c.Pods) {
			t.Errorf("seed %d: the index holds %d pods, the cluster %d", seed, len(tr.pods.seen), len(r.c.Pods))
		}
	}
}

// objectSet.same tells a list of the same objects (in any order) from one
// with an object added, removed, replaced or listed twice.
func TestObjectSetTellsTheSameObjects(t *testing.T) {
	a, b, c := &v1.Namespace{}, &v1.Namespace{}, &v1.Namespace{}
	var s objectSet[v1.Namespace]
	for i, step := range []struct {
		list []*v1.Namespace
		want bool
	}{
		{[]*v1.Namespace{a, b}, false}, // the first list
		{[]*v1.Namespace{b, a}, true},
		{[]*v1.Namespace{a, b, c}, false},
		{[]*v1.Namespace{a, b, c}, true},
		{[]*v1.Namespace{a, c}, false},
		{[]*v1.Namespace{a, b}, false},
		{[]*v1.Namespace{a, b, b}, false},
		{[]*v1.Namespace{a, b, b}, false}, // a list with an object twice is never the same
		{[]*v1.Namespace{a, b}, false},
		{[]*v1.Namespace{a, b}, true},
		{nil, false},
		{nil, true},
	} {
		if got := s.same(step.list); got != step.want {
			t.Fatalf("step %d: same %v, want %v", i, got, step.want)
		}
	}
	if len(s.stamp) != 0 {
		t.Errorf("%d objects still stamped after an empty list", len(s.stamp))
	}
}

// A peer selector that does not parse is reported for each policy that
// has it, though policies with the same peer share its (empty) set, and
// for each endpoint such a policy isolates: when the first of them goes,
// the next one's kept translation still reports it.
func TestTranslatorKeepsAPeersErrorWithEachEndpoint(t *testing.T) {
	bad := netv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "bad value!"}}}
	np := func(name, app string) *netv1.NetworkPolicy {
		return &netv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: netv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
			Ingress:     []netv1.NetworkPolicyIngressRule{{From: []netv1.NetworkPolicyPeer{bad}}}}}
	}
	c := Cluster{Pods: []*v1.Pod{pod("ns", "a", "10.1.0.1", map[string]string{"app": "a"}), pod("ns", "a2", "10.1.0.2", map[string]string{"app": "a"}),
		pod("ns", "b", "10.1.0.3", map[string]string{"app": "b"})},
		Policies: []*netv1.NetworkPolicy{np("np-a", "a"), np("np-b", "b")}}
	for i := range 8 { // others, so that a's deletion is a change, not a new list
		c.Pods = append(c.Pods, pod("other", fmt.Sprintf("p%d", i), fmt.Sprintf("10.1.1.%d", i), nil))
	}
	tr := NewTranslator("")
	res := tr.Translate(c)
	if len(res.Errors) != 2 || !strings.Contains(res.Errors[0].Error(), "ns/np-a") || !strings.Contains(res.Errors[1].Error(), "ns/np-b") {
		t.Fatalf("errors %v, want np-a's and np-b's", res.Errors)
	}
	c.Pods = c.Pods[1:]
	got, want := tr.Translate(c), Translate(c, "")
	if diff := difference(got, want); diff != "" || len(got.Errors) != 2 {
		t.Fatalf("pod a deleted: %s (errors %v)", diff, got.Errors)
	}
}
