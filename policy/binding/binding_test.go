package binding_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/policy"
	"github.com/sluice-net/sluice/policy/binding"
	"github.com/sluice-net/sluice/policy/k8s"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// cluster: two pods on node-a, each isolated by a policy of its own that
// admits pods labelled role=allowFrom, on port if not 0.
func cluster(allowFrom string, port int32) k8s.Cluster {
	pod := func(name, ip string, labels map[string]string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "demo", Labels: labels},
			Spec: v1.PodSpec{NodeName: "node-a"}, Status: v1.PodStatus{PodIP: ip}}
	}
	np := func(name, app string) *netv1.NetworkPolicy {
		rule := netv1.NetworkPolicyIngressRule{From: []netv1.NetworkPolicyPeer{{
			PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": allowFrom}}}}}
		if port != 0 {
			p := intstr.FromInt32(port)
			rule.Ports = []netv1.NetworkPolicyPort{{Port: &p}}
		}
		return &netv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "demo"},
			Spec: netv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
				Ingress: []netv1.NetworkPolicyIngressRule{rule}}}
	}
	return k8s.Cluster{
		Namespaces: []*v1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}},
		Pods: []*v1.Pod{pod("a", "10.1.0.2", map[string]string{"app": "a"}), pod("b", "10.1.0.3", map[string]string{"app": "b"}),
			pod("client", "10.1.0.4", map[string]string{"role": "client"})},
		Policies: []*netv1.NetworkPolicy{np("a-only", "a"), np("b-only", "b")},
	}
}

type node struct {
	t       testing.TB
	set     *maps.Set
	objs    *gen.SluiceObjects
	ifstate *maps.Map[gen.SluiceIfstateKey, gen.SluiceIfstateValue]
}

func newNode(t testing.TB) *node {
	bpftest.Require(t)
	set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	objs, err := gen.Load(gen.LoadOptions{Maps: set.All()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	ifstate, err := maps.IfState.In(set)
	if err != nil {
		t.Fatal(err)
	}
	return &node{t: t, set: set, objs: objs, ifstate: ifstate}
}

// binder starts a Binder, as an agent does on start.
func (n *node) binder() *binding.Binder {
	b, err := binding.New(binding.Options{Maps: n.set, Verdict: n.objs.SlPolicyVerdict, Node: "node-a"})
	if err != nil {
		n.t.Fatal(err)
	}
	return b
}

// bind asks for an interface's slots and writes them where the datapath
// reads them, as the interface manager does.
func (n *node) bind(b *binding.Binder, ifindex int, id string) [2]uint32 {
	n.t.Helper()
	in, out, err := b.Slots(ifindex, id)
	if err != nil {
		n.t.Fatal(err)
	}
	err = n.ifstate.Put(gen.SluiceIfstateKey{Ifindex: uint32(ifindex)}, gen.SluiceIfstateValue{
		Flags: gen.SluiceIfstateFlagsIFS_WORKLOAD | gen.SluiceIfstateFlagsIFS_READY, IngressPolicy: in, EgressPolicy: out}, ebpf.UpdateAny)
	if err != nil {
		n.t.Fatal(err)
	}
	return [2]uint32{in, out}
}

func (n *node) occupied(slot uint32) bool {
	var id uint32
	err := n.set.Map(maps.PolicyPrograms).Lookup(slot, &id)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		n.t.Fatal(err)
	}
	return err == nil
}

func TestBinderInstallsOncePerContentAndRetires(t *testing.T) {
	n := newNode(t)
	b := n.binder()
	if _, first := b.Update(cluster("client", 0)); !first {
		t.Fatal("the first Update does not say so")
	}
	a, bb := n.bind(b, 10, "demo/a"), n.bind(b, 11, "demo/b")
	if a[0] == policy.NoPolicy || bb[0] == policy.NoPolicy || a[0] == bb[0] || a[1] != policy.NoPolicy {
		t.Fatalf("slots a %v b %v: want an ingress policy each, in different slots, and no egress policy", a, bb)
	}
	// The same cluster again, as new objects: nothing compiled.
	if _, first := b.Update(cluster("client", 0)); first {
		t.Fatal("a second Update says it is the first")
	}
	if again := n.bind(b, 10, "demo/a"); again != a || b.Stats().Compiled != 2 {
		t.Fatalf("identical policy: slots %v (were %v), %d compiled", again, a, b.Stats().Compiled)
	}
	// Other peers: the same code, only the IP set's members change.
	b.Update(cluster("friend", 0))
	if same := n.bind(b, 10, "demo/a"); same != a || b.Stats().Compiled != 2 {
		t.Fatalf("a policy whose peers changed moved to %v (was %v), %d compiled", same, a, b.Stats().Compiled)
	}
	// A changed policy: a new slot; the old one is freed at the next Update.
	b.Update(cluster("friend", 8080))
	changed := n.bind(b, 10, "demo/a")
	if changed[0] == a[0] || !n.occupied(a[0]) {
		t.Fatalf("changed policy in slot %d (old %d, occupied %v): the old slot must stay until the next Update", changed[0], a[0], n.occupied(a[0]))
	}
	b.Update(cluster("friend", 8080))
	if n.occupied(a[0]) {
		t.Fatalf("the retired slot %d is still occupied", a[0])
	}
	// A pod that leaves its interface: no policy there.
	if none := n.bind(b, 12, ""); none != [2]uint32{policy.NoPolicy, policy.NoPolicy} {
		t.Fatalf("interface without a pod got %v", none)
	}
}

// The Binder's Hash is the content's, whether its tiers are the ones a
// translation kept (the same objects given again) or new ones.
func TestBinderHashIsTheContents(t *testing.T) {
	n := newNode(t)
	b := n.binder()
	c := cluster("client", 0)
	hash := func(c k8s.Cluster) (string, *policy.EndpointPolicy) {
		eps, _ := b.Update(c)
		ep := eps["demo/a"]
		got := b.Hash(&ep.Ingress)
		if want := binding.Hash(&ep.Ingress); got != want || len(ep.Ingress.Tiers) == 0 {
			t.Fatalf("Hash %s, the content's %s", got, want)
		}
		return got, &ep.Ingress
	}
	first, p := hash(c)
	again, q := hash(c) // the same objects: the translation kept
	if again != first || &p.Tiers[0] != &q.Tiers[0] {
		t.Fatalf("the same objects: hash %s then %s (tiers kept: %v)", first, again, &p.Tiers[0] == &q.Tiers[0])
	}
	if other, _ := hash(cluster("client", 8080)); other == first {
		t.Fatal("a port added: the same hash")
	}
	if back, _ := hash(c); back != first {
		t.Fatalf("back to the first objects: hash %s, was %s", back, first)
	}
}

// After a restart the new Binder keeps each interface's slots until its
// first Update, then keeps the unchanged policies where they are, without
// compiling them.
func TestBinderTakesOverAfterARestart(t *testing.T) {
	n := newNode(t)
	before := n.binder()
	before.Update(cluster("client", 0))
	a, bb := n.bind(before, 10, "demo/a"), n.bind(before, 11, "demo/b")

	after := n.binder()
	if got := n.bind(after, 10, "demo/a"); got != a {
		t.Fatalf("before its first Update the new binder gave %v, want the interface's own %v", got, a)
	}
	if _, first := after.Update(cluster("client", 0)); !first {
		t.Fatal("not the first Update")
	}
	if got := n.bind(after, 10, "demo/a"); got != a {
		t.Fatalf("unchanged policy moved from %v to %v", a, got)
	}
	if got := n.bind(after, 11, "demo/b"); got != bb {
		t.Fatalf("unchanged policy moved from %v to %v", bb, got)
	}
	if st := after.Stats(); st.Compiled != 0 || st.Kept != 2 {
		t.Fatalf("stats %+v: want both policies kept and none compiled", st)
	}
}

// What a translation cannot apply is counted while it lasts (the agent's
// sluice_policy_errors), and the count falls when the policy is fixed.
func TestTranslationErrorsAreCountedWhileTheyLast(t *testing.T) {
	n := newNode(t)
	b := n.binder()
	c := cluster("client", 80)
	icmp := v1.Protocol("ICMP") // no ports: refused
	c.Policies[0].Spec.Ingress[0].Ports[0].Protocol = &icmp
	b.Update(c)
	b.Finish()
	if got := b.Stats().Errors; got != 1 {
		t.Fatalf("an ICMP port: %d errors, want 1", got)
	}
	b.Update(cluster("client", 80))
	b.Finish()
	if got := b.Stats().Errors; got != 0 {
		t.Fatalf("once fixed: %d errors, want 0", got)
	}
}

// A host endpoint's slots come in the order of its interface's
// sl_ifstate_v1 entry: its egress policy where traffic leaves (TO_HOST),
// its ingress policy where traffic enters (FROM_HOST).
func TestHostEndpointSlotsByHook(t *testing.T) {
	n := newNode(t)
	b := n.binder()
	c := cluster("client", 80)
	c.HostEndpoints = []*k8s.HostEndpoint{{ObjectMeta: metav1.ObjectMeta{Name: "edge"},
		Spec: k8s.HostEndpointSpec{InterfaceName: k8s.AllInterfaces}}} // ingress only: default deny
	b.Update(c)
	if !b.Has(k8s.HostEndpointID(k8s.AllInterfaces)) || b.Has(k8s.HostEndpointID("eth9")) {
		t.Fatal("Has: want the \"*\" host endpoint only")
	}
	exit, entry, err := b.Slots(42, k8s.HostEndpointID(k8s.AllInterfaces))
	if err != nil {
		t.Fatal(err)
	}
	if exit != policy.NoPolicy || entry == policy.NoPolicy {
		t.Fatalf("slots (leaving %#x, entering %#x): want no egress policy and an ingress one", exit, entry)
	}
	b.Finish()
}

// BenchmarkUpdateChange is what a change costs the policy path of an agent
// on a node of a 10,000-pod cluster with 1,000 NetworkPolicies (100 pods on
// the node): the translation, the IP sets written, and each local
// endpoint's policies hashed, as the agent does to bind them. Each op
// relabels one pod of the cluster (a new object, as an informer's update
// is).
func BenchmarkUpdateChange(b *testing.B) {
	n := newNode(b)
	var c k8s.Cluster
	ops := &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ops"}}
	for i := range 50 {
		c.Namespaces = append(c.Namespaces, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns%d", i),
			Labels: map[string]string{"team": []string{"ops", "dev"}[min(i, 1)]}}})
	}
	for i := range 10_000 {
		c.Pods = append(c.Pods, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%50), Name: fmt.Sprintf("pod%d", i),
			Labels: map[string]string{"app": fmt.Sprintf("app%d", (i/50)%20)}},
			Spec: v1.PodSpec{NodeName: fmt.Sprintf("node-%d", i%100)}, Status: v1.PodStatus{PodIP: fmt.Sprintf("10.%d.%d.%d", 1+i>>16, (i>>8)&0xff, i&0xff)}})
	}
	for i := range 1_000 {
		app := func(k int) *metav1.LabelSelector {
			return &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", k%20)}}
		}
		port := intstr.FromInt32(8080)
		c.Policies = append(c.Policies, &netv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i/20), Name: fmt.Sprintf("np%d", i)},
			Spec: netv1.NetworkPolicySpec{PodSelector: *app(i % 20), Ingress: []netv1.NetworkPolicyIngressRule{
				{From: []netv1.NetworkPolicyPeer{{PodSelector: app(i%20 + 1)}}, Ports: []netv1.NetworkPolicyPort{{Port: &port}}},
				{From: []netv1.NetworkPolicyPeer{{NamespaceSelector: ops}}}}}})
	}
	bd, err := binding.New(binding.Options{Maps: n.set, Verdict: n.objs.SlPolicyVerdict, Node: "node-7"})
	if err != nil {
		b.Fatal(err)
	}
	update := func() {
		endpoints, _ := bd.Update(c)
		for _, ep := range endpoints {
			_ = bd.Hash(&ep.Ingress) + bd.Hash(&ep.Egress)
		}
		bd.Finish()
		if len(endpoints) != 100 {
			b.Fatalf("%d endpoints on the node", len(endpoints))
		}
	}
	update()
	i := 0
	for b.Loop() {
		i++
		k := i * 7919 % len(c.Pods)
		p := c.Pods[k].DeepCopy()
		p.Labels["app"] = fmt.Sprintf("app%d", i%20)
		c.Pods = slices.Clone(c.Pods)
		c.Pods[k] = p
		update()
	}
}
