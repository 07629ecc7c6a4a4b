package k8s

// ClusterNetworkPolicy (policy.networking.k8s.io/v1beta1): the cluster
// administrator's tiers around NetworkPolicy. The older AdminNetworkPolicy and
// BaselineAdminNetworkPolicy (v1alpha1) are converted to it first (anp.go).

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluice-net/sluice/policy"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	npa "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Tier names in the compiled model, in evaluation order.
const (
	tierAdmin      = "admin"      // ClusterNetworkPolicy tier Admin
	tierKubernetes = "kubernetes" // NetworkPolicy
	tierBaseline   = "baseline"   // ClusterNetworkPolicy tier Baseline
	tierDefault    = "default"    // what no tier decided: allowed
)

// defaultAllowRule is the id of the rule that allows what no tier decided.
var defaultAllowRule = ruleID("default-allow")

// cnpKey names a policy in errors and rule descriptions, by the API it was
// written in.
func cnpKey(p *npa.ClusterNetworkPolicy) string {
	kind := "clusternetworkpolicy"
	if k := p.Annotations[convertedFrom]; k != "" {
		kind = strings.ToLower(k)
	}
	return kind + " " + p.Name
}

// sortedCNPs returns the policies of a tier in evaluation order: by priority,
// then by name (the API leaves ties to the implementation; a fixed order keeps
// the compiled programs stable).
func sortedCNPs(all []*npa.ClusterNetworkPolicy, tier npa.Tier) []*npa.ClusterNetworkPolicy {
	var out []*npa.ClusterNetworkPolicy
	for _, p := range all {
		if p.Spec.Tier == tier {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *npa.ClusterNetworkPolicy) int {
		return cmp.Or(cmp.Compare(a.Spec.Priority, b.Spec.Priority), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// selector parses a label selector; an invalid one is an error naming where.
func (t *translator) selector(where string, s *metav1.LabelSelector) (labels.Selector, bool) {
	sel, err := t.parse(s)
	if err != nil {
		t.err(fmt.Errorf("%s: %w", where, err))
		return nil, false
	}
	return sel, true
}

// namespacedPods lists the pods whose namespace matches nsSel and whose
// labels match podSel (nil: every pod of those namespaces). nsFrom and
// podFrom are the selectors as written, which name the question.
func (t *translator) namespacedPods(nsSel, podSel labels.Selector, nsFrom, podFrom *metav1.LabelSelector) []*v1.Pod {
	t.reads(podQuery{key: "cnp|" + t.text(nsFrom) + "|" + t.text(podFrom), nsSel: nsSel, podSel: podSel})
	var out []*v1.Pod
	for _, p := range t.pods.candidates(podSel, "") {
		if nsSel.Matches(t.nsLabel[p.Namespace]) && (podSel == nil || podSel.Matches(labels.Set(p.Labels))) && !p.Spec.HostNetwork {
			out = append(out, p)
		}
	}
	return out
}

// cnpSelects tells whether a policy's subject is the pod. A subject that does
// not parse selects nothing, so it changes nothing (reported).
func (t *translator) cnpSelects(p *npa.ClusterNetworkPolicy, pod *v1.Pod) bool {
	s := p.Spec.Subject
	switch {
	case s.Namespaces != nil:
		ns, ok := t.selector(cnpKey(p)+": subject namespaces", s.Namespaces)
		return ok && ns.Matches(t.nsLabel[pod.Namespace])
	case s.Pods != nil:
		ns, ok := t.selector(cnpKey(p)+": subject namespaceSelector", &s.Pods.NamespaceSelector)
		if !ok {
			return false
		}
		ps, ok := t.selector(cnpKey(p)+": subject podSelector", &s.Pods.PodSelector)
		return ok && ns.Matches(t.nsLabel[pod.Namespace]) && ps.Matches(labels.Set(pod.Labels))
	}
	t.err(fmt.Errorf("%s: subject selects neither namespaces nor pods; it applies to no pod", cnpKey(p)))
	return false
}

// cnpTier builds the tier of the pod's ClusterNetworkPolicies of one API tier
// for a direction; false when none applies. Each policy's rules keep their
// written order; the tier passes what its rules leave undecided.
func (t *translator) cnpTier(pod *v1.Pod, tier npa.Tier, ingress bool) (policy.Tier, bool) {
	name := tierAdmin
	if tier == npa.BaselineTier {
		name = tierBaseline
	}
	out := policy.Tier{Name: name, DefaultAction: policy.Pass}
	for _, p := range sortedCNPs(t.c.ClusterNetworkPolicies, tier) {
		if (ingress && len(p.Spec.Ingress) == 0) || (!ingress && len(p.Spec.Egress) == 0) || !t.cnpSelects(p, pod) {
			continue
		}
		out.Policies = append(out.Policies, t.cnpRules(p, pod, ingress))
	}
	return out, len(out.Policies) > 0
}

// cnpPeer is one peer of a rule, whichever direction: what it selects.
type cnpPeer struct {
	namespaces *metav1.LabelSelector
	pods       *npa.NamespacedPod
	nodes      *metav1.LabelSelector
	networks   []npa.CIDR
	domains    []npa.DomainName
}

// cnpRules translates one policy's rules of a direction for a pod.
func (t *translator) cnpRules(p *npa.ClusterNetworkPolicy, pod *v1.Pod, ingress bool) policy.Policy {
	out := policy.Policy{Name: cnpKey(p)}
	type rule struct {
		name      string
		action    npa.ClusterNetworkPolicyRuleAction
		peers     []cnpPeer
		protocols []npa.ClusterNetworkPolicyProtocol
	}
	var rules []rule
	dir := "egress"
	if ingress {
		dir = "ingress"
		for _, r := range p.Spec.Ingress {
			var peers []cnpPeer
			for _, f := range r.From {
				peers = append(peers, cnpPeer{namespaces: f.Namespaces, pods: f.Pods})
			}
			rules = append(rules, rule{r.Name, r.Action, peers, r.Protocols})
		}
	} else {
		for _, r := range p.Spec.Egress {
			var peers []cnpPeer
			for _, to := range r.To {
				peers = append(peers, cnpPeer{namespaces: to.Namespaces, pods: to.Pods, nodes: to.Nodes, networks: to.Networks, domains: to.DomainNames})
			}
			rules = append(rules, rule{r.Name, r.Action, peers, r.Protocols})
		}
	}
	for ri, r := range rules {
		ruleName := fmt.Sprintf("%s rule %d", dir, ri)
		if r.name != "" {
			ruleName += " (" + r.name + ")"
		}
		where := cnpKey(p) + " " + ruleName
		var action policy.Action
		switch r.action {
		case npa.ClusterNetworkPolicyRuleActionAccept:
			action = policy.Allow
		case npa.ClusterNetworkPolicyRuleActionDeny:
			action = policy.Deny
		case npa.ClusterNetworkPolicyRuleActionPass:
			action = policy.Pass
		default:
			// An action from a newer API: fail closed, as the API asks of
			// what it cannot read, by denying what the rule names.
			t.err(fmt.Errorf("%s: action %q unknown; the rule denies what it names", where, r.action))
			action = policy.Deny
		}
		for pi, peer := range r.peers {
			conds, ok := t.cnpPeerMatch(where, peer, ingress, action)
			if !ok {
				continue
			}
			protocols := r.protocols
			if len(protocols) == 0 {
				protocols = []npa.ClusterNetworkPolicyProtocol{{}}
			}
			for qi, proto := range protocols {
				for ci, cond := range conds {
					for _, rl := range t.cnpProtocol(where, cond, proto, pod, peer, ingress, action) {
						rl.Action = action
						rl.ID = ruleID("cnp", p.Name, dir, ri, pi, qi, ci, rl.Protocol, fmt.Sprint(rl.DstPorts), pod.Namespace, pod.Name)
						t.rule(rl.ID, RuleInfo{cnpKey(p), fmt.Sprintf("%s peer %d protocol %d", ruleName, pi, qi)})
						out.Rules = append(out.Rules, rl)
					}
				}
			}
		}
	}
	return out
}

// cnpPeerMatch turns a peer into the address conditions of rules (several
// when the peer names several kinds; any of them matches). A peer that cannot
// be read fails closed as the API asks: an Accept rule matches nothing, a
// Deny or Pass rule matches everything.
func (t *translator) cnpPeerMatch(where string, peer cnpPeer, ingress bool, action policy.Action) ([]policy.Rule, bool) {
	failClosed := func(err error) ([]policy.Rule, bool) {
		if action == policy.Allow {
			t.err(fmt.Errorf("%s: %w; the rule accepts nothing", where, err))
			return nil, false
		}
		t.err(fmt.Errorf("%s: %w; the rule applies to every peer", where, err))
		return []policy.Rule{{}}, true
	}
	set := func(pods []*v1.Pod) policy.Rule {
		id := t.ipSet(members(pods))
		if ingress {
			return policy.Rule{SrcIPSets: []uint32{id}}
		}
		return policy.Rule{DstIPSets: []uint32{id}}
	}
	switch {
	case peer.namespaces != nil:
		ns, ok := t.selector(where+": peer namespaces", peer.namespaces)
		if !ok {
			return failClosed(fmt.Errorf("peer namespaces do not parse"))
		}
		return []policy.Rule{set(t.namespacedPods(ns, nil, peer.namespaces, nil))}, true
	case peer.pods != nil:
		ns, ok1 := t.selector(where+": peer namespaceSelector", &peer.pods.NamespaceSelector)
		ps, ok2 := t.selector(where+": peer podSelector", &peer.pods.PodSelector)
		if !ok1 || !ok2 {
			return failClosed(fmt.Errorf("peer pods do not parse"))
		}
		return []policy.Rule{set(t.namespacedPods(ns, ps, &peer.pods.NamespaceSelector, &peer.pods.PodSelector))}, true
	case len(peer.networks) > 0:
		var nets []netip.Prefix
		for _, n := range peer.networks {
			p, err := netip.ParsePrefix(string(n))
			if err != nil {
				return failClosed(fmt.Errorf("network %q: %w", n, err))
			}
			nets = append(nets, p.Masked())
		}
		return []policy.Rule{{DstNets: nets}}, true
	case peer.nodes != nil:
		sel, ok := t.selector(where+": peer nodes", peer.nodes)
		if !ok {
			return failClosed(fmt.Errorf("peer nodes do not parse"))
		}
		nets := t.nodeAddresses(sel)
		if len(nets) == 0 {
			return nil, true // no node matches: the peer is no one
		}
		return []policy.Rule{{DstNets: nets}}, true
	case len(peer.domains) > 0:
		return failClosed(fmt.Errorf("domainNames peers (experimental) are not supported"))
	}
	return failClosed(fmt.Errorf("a peer with no field set (a newer API?)"))
}

// nodeAddresses are the addresses (InternalIP and ExternalIP, one host
// prefix each) of the nodes whose labels match sel, in the cluster's order.
func (t *translator) nodeAddresses(sel labels.Selector) []netip.Prefix {
	var out []netip.Prefix
	for _, n := range t.c.Nodes {
		if !sel.Matches(labels.Set(n.Labels)) {
			continue
		}
		for _, a := range n.Status.Addresses {
			if a.Type != v1.NodeInternalIP && a.Type != v1.NodeExternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				ip = ip.Unmap()
				out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
	}
	return out
}

// cnpProtocol adds one protocol entry's conditions to a peer's: TCP or UDP
// with an optional port or range, or a destination named port (the subject
// pod's own for ingress, each peer pod's own for egress).
func (t *translator) cnpProtocol(where string, cond policy.Rule, proto npa.ClusterNetworkPolicyProtocol,
	pod *v1.Pod, peer cnpPeer, ingress bool, action policy.Action) []policy.Rule {
	withPort := func(number uint8, port *npa.Port) []policy.Rule {
		r := cond
		r.Protocol = number
		switch {
		case port == nil:
		case port.Range != nil:
			r.DstPorts = []policy.PortRange{{First: uint16(port.Range.Start), Last: uint16(port.Range.End)}}
		default:
			r.DstPorts = []policy.PortRange{{First: uint16(port.Number), Last: uint16(port.Number)}}
		}
		return []policy.Rule{r}
	}
	switch {
	case proto.TCP != nil:
		return withPort(6, proto.TCP.DestinationPort)
	case proto.UDP != nil:
		return withPort(17, proto.UDP.DestinationPort)
	case proto.SCTP != nil:
		return withPort(132, proto.SCTP.DestinationPort)
	case proto.DestinationNamedPort != "":
		return t.cnpNamedPort(cond, proto.DestinationNamedPort, pod, peer, ingress)
	}
	return []policy.Rule{cond}
}

// cnpNamedPort resolves a destination named port, on each protocol a
// container declares it with.
func (t *translator) cnpNamedPort(cond policy.Rule, name string, pod *v1.Pod, peer cnpPeer, ingress bool) []policy.Rule {
	var out []policy.Rule
	protos := []struct {
		api    v1.Protocol
		number uint8
	}{{v1.ProtocolTCP, 6}, {v1.ProtocolUDP, 17}, {v1.ProtocolSCTP, 132}}
	if ingress {
		for _, pr := range protos {
			r := cond
			r.Protocol = pr.number
			for _, n := range namedPort(pod, name, pr.api) {
				r.DstPorts = append(r.DstPorts, policy.PortRange{First: n, Last: n})
			}
			if len(r.DstPorts) > 0 {
				out = append(out, r)
			}
		}
		return out
	}
	// Egress: the destination's own number, for the peer's pods only (a
	// named port exists only on pods: a networks peer matches none).
	var pods []*v1.Pod
	switch {
	case peer.namespaces != nil:
		if ns, err := t.parse(peer.namespaces); err == nil {
			pods = t.namespacedPods(ns, nil, peer.namespaces, nil)
		}
	case peer.pods != nil:
		ns, err1 := t.parse(&peer.pods.NamespaceSelector)
		ps, err2 := t.parse(&peer.pods.PodSelector)
		if err1 == nil && err2 == nil {
			pods = t.namespacedPods(ns, ps, &peer.pods.NamespaceSelector, &peer.pods.PodSelector)
		}
	}
	for _, pr := range protos {
		byNumber := map[uint16][]netip.Prefix{}
		for _, p := range pods {
			for _, n := range namedPort(p, name, pr.api) {
				byNumber[n] = append(byNumber[n], members([]*v1.Pod{p})...)
			}
		}
		for _, n := range slices.Sorted(maps.Keys(byNumber)) {
			out = append(out, policy.Rule{Protocol: pr.number, DstIPSets: []uint32{t.ipSet(byNumber[n])},
				DstPorts: []policy.PortRange{{First: n, Last: n}}})
		}
	}
	return out
}

// withAdminTiers wraps a pod's NetworkPolicy result for a direction in the
// ClusterNetworkPolicy tiers: Admin first, then NetworkPolicy (which decides
// for the pods it isolates), then Baseline, then allow. Without any
// ClusterNetworkPolicy for the pod the NetworkPolicy result stands alone.
func (t *translator) withAdminTiers(pod *v1.Pod, np policy.EndpointPolicy, ingress bool) policy.EndpointPolicy {
	admin, hasAdmin := t.cnpTier(pod, npa.AdminTier, ingress)
	baseline, hasBaseline := t.cnpTier(pod, npa.BaselineTier, ingress)
	if !hasAdmin && !hasBaseline {
		return np
	}
	var out policy.EndpointPolicy
	if hasAdmin {
		out.Tiers = append(out.Tiers, admin)
	}
	out.Tiers = append(out.Tiers, np.Tiers...)
	if hasBaseline {
		out.Tiers = append(out.Tiers, baseline)
	}
	out.Tiers = append(out.Tiers, policy.Tier{Name: tierDefault, DefaultAction: policy.Deny,
		Policies: []policy.Policy{{Name: "default-allow", Rules: []policy.Rule{{ID: defaultAllowRule, Action: policy.Allow}}}}})
	t.rule(defaultAllowRule, RuleInfo{"default", "allowed: no tier decided"})
	return out
}
