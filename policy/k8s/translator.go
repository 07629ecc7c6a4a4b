package k8s

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"

	"github.com/sluice-net/sluice/policy"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	npa "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Translator translates a node's policies from one state of the cluster
// after another, and keeps between translations what the objects it was
// given still determine:
//   - the pod index, updated for the pods that changed (pods added, removed
//     or updated: not every pod of the cluster);
//   - each label selector, parsed;
//   - each AdminNetworkPolicy and BaselineAdminNetworkPolicy, converted;
//   - each of the node's endpoints, translated, with what its translation
//     read: its pod, its namespace's NetworkPolicies, and which pods its
//     peers' selectors asked for. An endpoint none of whose inputs changed
//     is not translated again: the record of its translation is replayed
//     (the IP sets it used, renumbered when the sets before it changed; its
//     rules' descriptions; its errors), so the result is Translate's.
//
// Any change of the namespaces or of the ClusterNetworkPolicies translates
// every endpoint again; so does a change of a node's labels or addresses
// while a ClusterNetworkPolicy has a nodes peer.
//
// The objects given must not be changed afterwards (an informer's never
// are: an update is a new object), nor the Results returned, which share
// what did not change. Not safe for concurrent use.
type Translator struct {
	node   string
	once   bool // Translate's: nothing to keep for a next translation
	pods   *podIndex
	parsed *selectorCache
	// converted holds the ClusterNetworkPolicy each AdminNetworkPolicy
	// and BaselineAdminNetworkPolicy object converts to.
	converted map[any]conversion
	// memos are the node's endpoints as last translated, by namespace/name.
	memos map[string]*endpointMemo
	// The objects of the last translation, to tell whether they changed:
	// the memos hold while the namespaces and ClusterNetworkPolicies do,
	// and the NetworkPolicies stay sorted by namespace while they do.
	namespaces objectSet[v1.Namespace]
	cnps       objectSet[npa.ClusterNetworkPolicy]
	policies   objectSet[netv1.NetworkPolicy]
	polsIn     map[string][]*netv1.NetworkPolicy
	// nodes digests the nodes' names, labels and addresses when a
	// ClusterNetworkPolicy has a nodes peer (0 when none has): the memos
	// hold while it does.
	nodes uint64
}

// objectSet tells whether a list holds exactly the objects of the list
// before it, in any order, by stamping each object with the list it was
// last seen in.
type objectSet[T any] struct {
	stamp      map[*T]uint64
	generation uint64
	size       int  // distinct objects of the last list
	twice      bool // the last list held an object twice
}

// same records objs and tells whether they are the objects of the list the
// last call recorded, each once (false on the first call).
func (s *objectSet[T]) same(objs []*T) bool {
	if s.stamp == nil {
		s.stamp = map[*T]uint64{}
	}
	s.generation++
	kept, fresh, twice := 0, 0, false
	for _, o := range objs {
		switch g, ok := s.stamp[o]; {
		case !ok:
			fresh++
		case g == s.generation:
			twice = true
			continue
		default:
			kept++
		}
		s.stamp[o] = s.generation
	}
	same := s.generation > 1 && fresh == 0 && kept == s.size && !twice && !s.twice
	if kept < s.size {
		for o, g := range s.stamp {
			if g != s.generation {
				delete(s.stamp, o)
			}
		}
	}
	s.size, s.twice = kept+fresh, twice
	return same
}

type conversion struct {
	cnp        *npa.ClusterNetworkPolicy
	generation uint64
}

// NewTranslator returns a Translator for node ("" for every pod).
func NewTranslator(node string) *Translator {
	return &Translator{node: node, pods: &podIndex{}, parsed: &selectorCache{m: map[*metav1.LabelSelector]parsedSelector{}},
		converted: map[any]conversion{}, memos: map[string]*endpointMemo{}}
}

// endpointMemo is an endpoint's translation and what it read and wrote
// besides the endpoint, in order.
type endpointMemo struct {
	pod   *v1.Pod
	pols  []*netv1.NetworkPolicy // its namespace's NetworkPolicies
	ep    Endpoint
	sets  []setUse
	rules []ruleUse
	errs  []error
	reads []podQuery
	// selectors are the label selectors the translation parsed.
	selectors []*metav1.LabelSelector
}

type ruleUse struct {
	id   uint32
	info RuleInfo
}

// podQuery is a question a translation asked of the pods: every pod, or
// the pods of a namespace (nsSel nil) or of the namespaces nsSel matches,
// with labels podSel matches (nil: any). key names it: questions with one
// key are one question. A pod that changes and matches it, before or
// after, may change the answer.
type podQuery struct {
	key    string
	all    bool
	ns     string
	nsSel  labels.Selector
	podSel labels.Selector
}

func (q podQuery) matches(p *v1.Pod, nsLabel map[string]labels.Set) bool {
	switch {
	case q.all:
		return true
	case q.nsSel == nil && p.Namespace != q.ns:
		return false
	case q.nsSel != nil && !q.nsSel.Matches(nsLabel[p.Namespace]):
		return false
	}
	return q.podSel == nil || q.podSel.Matches(labels.Set(p.Labels))
}

// reads records a question asked of the pods.
func (t *translator) reads(q podQuery) {
	if t.rec != nil && !slices.ContainsFunc(t.rec.reads, func(r podQuery) bool { return r.key == q.key }) {
		t.rec.reads = append(t.rec.reads, q)
	}
}

// answerChanged tells whether a pod that changed (before or after) matches
// q: then q's answer may be another. Asked once per question.
func (t *translator) answerChanged(q podQuery) bool {
	changed, ok := t.answersChanged[q.key]
	if !ok {
		changed = slices.ContainsFunc(t.changedPods, func(p *v1.Pod) bool { return q.matches(p, t.nsLabel) })
		t.answersChanged[q.key] = changed
	}
	return changed
}

// stillHolds tells whether m is the translation of pod with pols, given the
// pods that changed since m was made.
func (t *translator) stillHolds(m *endpointMemo, pod *v1.Pod, pols []*netv1.NetworkPolicy) bool {
	if m.pod != pod || !slices.Equal(m.pols, pols) {
		return false
	}
	return !slices.ContainsFunc(m.reads, t.answerChanged)
}

// replay writes what m's translation wrote besides its endpoint, in the
// same order, and returns m as of this translation: its sets renumbered
// where the sets used before it changed.
func (t *translator) replay(m *endpointMemo) *endpointMemo {
	renumbered := map[uint32]uint32{}
	sets := m.sets
	for i, u := range m.sets {
		id := t.useSet(u)
		if u.peer != "" {
			now := u
			now.id = id
			t.peerSets[u.peer] = now
		}
		if id != u.id {
			if len(renumbered) == 0 {
				sets = slices.Clone(m.sets)
			}
			renumbered[u.id] = id
			sets[i].id = id
		}
	}
	for _, r := range m.rules {
		t.rule(r.id, r.info)
	}
	for _, err := range m.errs {
		t.err(err)
	}
	for _, s := range m.selectors {
		t.parsed.get(s) // still in use: kept parsed
	}
	if len(renumbered) == 0 {
		return m
	}
	out := *m
	out.sets = sets
	out.ep.Ingress = renumber(m.ep.Ingress, renumbered)
	out.ep.Egress = renumber(m.ep.Egress, renumbered)
	return &out
}

// renumber returns p with its rules' IP set ids renumbered, copying what
// it changes.
func renumber(p policy.EndpointPolicy, ids map[uint32]uint32) policy.EndpointPolicy {
	sets := func(in []uint32) []uint32 {
		out := slices.Clone(in)
		for i, id := range out {
			if n, ok := ids[id]; ok {
				out[i] = n
			}
		}
		return out
	}
	out := policy.EndpointPolicy{Tiers: slices.Clone(p.Tiers)}
	for ti := range out.Tiers {
		tier := &out.Tiers[ti]
		tier.Policies = slices.Clone(tier.Policies)
		for pi := range tier.Policies {
			pol := &tier.Policies[pi]
			pol.Rules = slices.Clone(pol.Rules)
			for ri := range pol.Rules {
				r := &pol.Rules[ri]
				r.SrcIPSets, r.DstIPSets = sets(r.SrcIPSets), sets(r.DstIPSets)
			}
		}
	}
	return out
}

// Translate computes the policies of the Translator's node for c.
func (tr *Translator) Translate(c Cluster) *Result {
	added, removed, reindexed := tr.pods.update(c.Pods)
	tr.parsed.generation++
	defer func() {
		for s, p := range tr.parsed.m {
			if p.generation != tr.parsed.generation {
				delete(tr.parsed.m, s)
			}
		}
	}()
	node := tr.node
	t := &translator{c: c, pods: tr.pods, parsed: tr.parsed, nsLabel: map[string]labels.Set{}, setIDs: map[string]uint32{}, peerSets: map[string]setUse{},
		res: &Result{Endpoints: map[string]Endpoint{}, IPSets: policy.IPSets{}, Rules: map[uint32]RuleInfo{}}}
	for _, ns := range c.Namespaces {
		t.nsLabel[ns.Name] = labels.Set(ns.Labels)
	}
	t.changedPods, t.answersChanged = append(added, removed...), map[string]bool{}
	t.c.ClusterNetworkPolicies = tr.clusterNetworkPolicies(c)
	// The memos hold while the namespaces (their labels feed selectors)
	// and the ClusterNetworkPolicies are the objects they were made from.
	sameNamespaces, sameCNPs := tr.namespaces.same(c.Namespaces), tr.cnps.same(t.c.ClusterNetworkPolicies)
	nodes := nodesDigest(t.c.ClusterNetworkPolicies, c.Nodes)
	memosHold := !reindexed && sameNamespaces && sameCNPs && nodes == tr.nodes
	tr.nodes = nodes

	// A pod's NetworkPolicies are its namespace's, sorted.
	if !tr.policies.same(c.Policies) {
		pols := slices.Clone(c.Policies)
		slices.SortFunc(pols, func(a, b *netv1.NetworkPolicy) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
		})
		tr.polsIn = map[string][]*netv1.NetworkPolicy{}
		for _, np := range pols {
			tr.polsIn[np.Namespace] = append(tr.polsIn[np.Namespace], np)
		}
	}
	polsIn := tr.polsIn
	// In a fixed order, so IP set and rule ids, and so the compiled
	// programs, do not depend on the order the pods were listed in.
	// Only this node's pods: sorting every pod of the cluster was a fifth
	// of a translation.
	var pods []*v1.Pod
	for _, pod := range c.Pods {
		if (node == "" || pod.Spec.NodeName == node) && !pod.Spec.HostNetwork {
			pods = append(pods, pod)
		}
	}
	slices.SortFunc(pods, func(a, b *v1.Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	memos := make(map[string]*endpointMemo, len(pods))
	for _, pod := range pods {
		ip, ok := podIP(pod)
		if !ok {
			continue
		}
		key := pod.Namespace + "/" + pod.Name
		nsPols := polsIn[pod.Namespace]
		if m := tr.memos[key]; memosHold && m != nil && t.stillHolds(m, pod, nsPols) {
			m = t.replay(m)
			memos[key] = m
			t.res.Endpoints[key] = m.ep
			continue
		}
		if !tr.once {
			t.rec = &endpointMemo{pod: pod, pols: nsPols}
		}
		ep := Endpoint{Namespace: pod.Namespace, Name: pod.Name, IP: ip}
		ep.Ingress = t.withAdminTiers(pod, t.direction(pod, nsPols, netv1.PolicyTypeIngress), true)
		ep.Egress = t.withAdminTiers(pod, t.direction(pod, nsPols, netv1.PolicyTypeEgress), false)
		if t.rec != nil {
			t.rec.ep = ep
			memos[key] = t.rec
			t.rec = nil
		}
		t.res.Endpoints[key] = ep
	}
	tr.memos = memos
	t.hostEndpoints(node)
	return t.res
}

// clusterNetworkPolicies are c's, with its AdminNetworkPolicies and
// BaselineAdminNetworkPolicies converted, each object once.
func (tr *Translator) clusterNetworkPolicies(c Cluster) []*npa.ClusterNetworkPolicy {
	out := slices.Clone(c.ClusterNetworkPolicies)
	generation := tr.parsed.generation
	convert := func(key any, f func() *npa.ClusterNetworkPolicy) {
		cv, ok := tr.converted[key]
		if !ok {
			cv.cnp = f()
		}
		cv.generation = generation
		tr.converted[key] = cv
		out = append(out, cv.cnp)
	}
	for _, p := range c.AdminNetworkPolicies {
		convert(p, func() *npa.ClusterNetworkPolicy { return ConvertANP(p) })
	}
	for _, p := range c.BaselineAdminNetworkPolicies {
		convert(p, func() *npa.ClusterNetworkPolicy { return ConvertBANP(p) })
	}
	for k, cv := range tr.converted {
		if cv.generation != generation {
			delete(tr.converted, k)
		}
	}
	return out
}

// nodesDigest digests what nodes peers read of the nodes (names, labels,
// addresses), in any order; 0 when no policy has a nodes peer, so that node
// changes cost nothing then.
func nodesDigest(cnps []*npa.ClusterNetworkPolicy, nodes []*v1.Node) uint64 {
	uses := slices.ContainsFunc(cnps, func(p *npa.ClusterNetworkPolicy) bool {
		return slices.ContainsFunc(p.Spec.Egress, func(r npa.ClusterNetworkPolicyEgressRule) bool {
			return slices.ContainsFunc(r.To, func(to npa.ClusterNetworkPolicyEgressPeer) bool { return to.Nodes != nil })
		})
	})
	if !uses {
		return 0
	}
	sum := uint64(1) // not 0, also with no node
	for _, n := range nodes {
		h := fnv.New64a()
		h.Write([]byte(n.Name))
		for _, k := range slices.Sorted(maps.Keys(n.Labels)) {
			fmt.Fprintf(h, "\x00%s=%s", k, n.Labels[k])
		}
		for _, a := range n.Status.Addresses {
			fmt.Fprintf(h, "\x01%s=%s", a.Type, a.Address)
		}
		sum += h.Sum64() // commutative: the nodes' order does not count
	}
	return sum
}
