package k8s

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
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
		{IPBlock: &netv1.IPBlock{CIDR: "10.1.0.0/16", Except: []string{"10.1.0.0/24"}}},
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

// change makes one change, as an informer would hand it over: a changed
// object is a new one, the others keep theirs.
func (r *randomCluster) change() string {
	c := &r.c
	switch k := r.rng.IntN(9); {
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
		i := r.rng.IntN(len(c.Pods))
		p := c.Pods[i].DeepCopy()
		p.Labels["app"] = fmt.Sprintf("app%d", r.rng.IntN(6))
		c.Pods = slices.Clone(c.Pods)
		c.Pods[i] = p
		return "pod relabelled"
	case k == 5 && len(c.Pods) > 0:
		i := r.rng.IntN(len(c.Pods))
		p := c.Pods[i].DeepCopy()
		p.Status.PodIP = fmt.Sprintf("10.2.%d.%d", r.rng.IntN(250), r.rng.IntN(250))
		c.Pods = slices.Clone(c.Pods)
		c.Pods[i] = p
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
	default:
		c.Policies = append(slices.Clip(c.Policies), r.policy())
		return "policy added"
	}
}

// comparable strips a Result to what DeepEqual can judge: errors by text.
func comparable(r *Result) any {
	var errs []string
	for _, e := range r.Errors {
		errs = append(errs, e.Error())
	}
	return []any{r.Endpoints, r.IPSets, r.Rules, errs}
}

// A Translator given one state of the cluster after another translates
// each as Translate does from nothing: pods added, deleted, relabelled and
// readdressed, namespaces relabelled, policies added and replaced, and the
// whole pod list replaced at once, over 400 changes and three seeds.
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
		tr := NewTranslator("node-1")
		for step := range 400 {
			what := "the first state"
			if step > 0 {
				what = r.change()
			}
			got, want := tr.Translate(r.c), Translate(r.c, "node-1")
			if !reflect.DeepEqual(comparable(got), comparable(want)) {
				t.Fatalf("seed %d, step %d (%s): the Translator's translation differs from Translate's:\n got %+v\nwant %+v",
					seed, step, what, comparable(got), comparable(want))
			}
			if step == 0 && (len(got.Endpoints) == 0 || len(got.IPSets) == 0 || len(got.Errors) == 0) {
				t.Fatalf("the cluster translates to too little to judge: %+v", comparable(got))
			}
		}
		if n := len(tr.parsed.m); n > 4*len(r.c.Policies)+8 {
			t.Errorf("seed %d: %d selectors kept for %d policies: the ones no longer used are not forgotten", seed, n, len(r.c.Policies))
		}
		if len(tr.pods.seen) != len(r.c.Pods) {
			t.Errorf("seed %d: the index holds %d pods, the cluster %d", seed, len(tr.pods.seen), len(r.c.Pods))
		}
	}
}
