package k8s

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluice-net/sluice/policy"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	alpha "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	npa "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Cluster is what the translation reads.
type Cluster struct {
	Pods       []*v1.Pod
	Namespaces []*v1.Namespace
	Policies   []*netv1.NetworkPolicy
	// ClusterNetworkPolicies (policy.networking.k8s.io/v1beta1) of the Admin
	// and Baseline tiers around NetworkPolicy.
	ClusterNetworkPolicies []*npa.ClusterNetworkPolicy
	// AdminNetworkPolicies and BaselineAdminNetworkPolicies (v1alpha1), their
	// predecessors, converted to ClusterNetworkPolicies (ConvertANP).
	AdminNetworkPolicies         []*alpha.AdminNetworkPolicy
	BaselineAdminNetworkPolicies []*alpha.BaselineAdminNetworkPolicy
	// HostEndpoints put policy on the node's data interfaces.
	HostEndpoints []*HostEndpoint
	// Nodes are what a ClusterNetworkPolicy's nodes peers select: their
	// labels and addresses.
	Nodes []*v1.Node
}

// RuleInfo names a compiled rule for people (metrics, counters): the policy
// it came from, by kind ("networkpolicy ns/name", "clusternetworkpolicy
// name", "hostendpoint name") and the rule within it.
type RuleInfo struct {
	Policy string `json:"policy"`
	Rule   string `json:"rule"`
}

// Endpoint is one pod's compiled-ready policy, or a host endpoint's.
type Endpoint struct {
	Namespace, Name string
	IP              netip.Addr            // a pod's; none for a host endpoint
	Interface       string                // a host endpoint's interface name, or AllInterfaces
	Ingress, Egress policy.EndpointPolicy // no tiers: not isolated in that direction
}

// Result is a translation: endpoints by "namespace/name" (pods) and by
// HostEndpointID (host endpoints), and the IP sets the rules refer to.
type Result struct {
	Endpoints map[string]Endpoint
	IPSets    policy.IPSets
	// Rules describes each rule id for people (counters).
	Rules map[uint32]RuleInfo
	// Errors lists policies or peers that could not be translated (each
	// names the object); the rest is translated.
	Errors []error
}

// podIPs are a pod's addresses, both families (status.podIP and podIPs).
func podIPs(p *v1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, s := range append([]v1.PodIP{{IP: p.Status.PodIP}}, p.Status.PodIPs...) {
		if a, err := netip.ParseAddr(s.IP); err == nil && !slices.Contains(out, a.Unmap()) {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// podIP is the address an endpoint is known by (its interface is found by
// it): the pod's IPv4 address, else its IPv6 one.
func podIP(p *v1.Pod) (netip.Addr, bool) {
	ips := podIPs(p)
	for _, a := range ips {
		if a.Is4() {
			return a, true
		}
	}
	if len(ips) > 0 {
		return ips[0], true
	}
	return netip.Addr{}, false
}

// members are the host prefixes of pods' addresses, both families.
func members(pods []*v1.Pod) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range pods {
		for _, a := range podIPs(p) {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return out
}

type translator struct {
	c       Cluster
	pods    *podIndex
	nsLabel map[string]labels.Set
	// peerSets: the IP set of each peer selector seen (peerSet).
	peerSets map[string]setUse
	res      *Result
	setIDs   map[string]uint32
	parsed   *selectorCache
	// rec, while an endpoint is translated, records what its translation
	// read and wrote besides the endpoint (translator.go).
	rec *endpointMemo
	// changedPods changed since the last translation (before and after);
	// answersChanged tells, by question, whether one of them matches it.
	changedPods    []*v1.Pod
	answersChanged map[string]bool
}

// Translate computes the policies of the pods on node (every pod if node is
// "") with an address; a pod's policy judges both of its families.
func Translate(c Cluster, node string) *Result {
	tr := NewTranslator(node)
	tr.once = true
	return tr.Translate(c)
}

// selectorCache keeps label selectors parsed, by the selector object; a
// selector no translation used is forgotten after it.
type selectorCache struct {
	m          map[*metav1.LabelSelector]parsedSelector
	generation uint64
}

type parsedSelector struct {
	sel        labels.Selector
	err        error
	text       string // its content, spelt out (text)
	generation uint64
}

// get returns s's entry, made once per selector object.
func (c *selectorCache) get(s *metav1.LabelSelector) parsedSelector {
	p, ok := c.m[s]
	if !ok {
		p.sel, p.err = metav1.LabelSelectorAsSelector(s)
		p.text = s.String()
	}
	if !ok || p.generation != c.generation {
		p.generation = c.generation
		c.m[s] = p
	}
	return p
}

// parse is metav1.LabelSelectorAsSelector, once per selector object.
func (t *translator) parse(s *metav1.LabelSelector) (labels.Selector, error) {
	p := t.cached(s)
	return p.sel, p.err
}

// cached is s's entry in the cache, which an endpoint's record notes (a
// replay keeps it cached).
func (t *translator) cached(s *metav1.LabelSelector) parsedSelector {
	if t.rec != nil && !slices.Contains(t.rec.selectors, s) {
		t.rec.selectors = append(t.rec.selectors, s)
	}
	return t.parsed.get(s)
}

// text spells out a selector's content (what tells equal selectors of
// different objects alike), once per selector object; "nil" for none.
func (t *translator) text(s *metav1.LabelSelector) string {
	if s == nil {
		return "nil"
	}
	return t.cached(s).text
}

func hasType(p *netv1.NetworkPolicy, typ netv1.PolicyType) bool {
	if len(p.Spec.PolicyTypes) == 0 {
		return typ == netv1.PolicyTypeIngress || len(p.Spec.Egress) > 0
	}
	return slices.Contains(p.Spec.PolicyTypes, typ)
}

func (t *translator) direction(pod *v1.Pod, pols []*netv1.NetworkPolicy, typ netv1.PolicyType) policy.EndpointPolicy {
	tier := policy.Tier{Name: tierKubernetes, DefaultAction: policy.Deny}
	for _, np := range pols {
		if np.Namespace != pod.Namespace || !hasType(np, typ) {
			continue
		}
		sel, err := t.parse(&np.Spec.PodSelector)
		if err != nil {
			// Which pods it isolates is unknown: fail closed, as if it
			// selected every pod of its namespace and allowed nothing.
			t.err(fmt.Errorf("networkpolicy %s/%s: podSelector: %w (it isolates every pod of its namespace and allows nothing until fixed)",
				np.Namespace, np.Name, err))
			tier.Policies = append(tier.Policies, policy.Policy{Name: np.Namespace + "/" + np.Name})
			continue
		}
		if !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		tier.Policies = append(tier.Policies, t.rules(pod, np, typ))
	}
	if len(tier.Policies) == 0 {
		return policy.EndpointPolicy{}
	}
	return policy.EndpointPolicy{Tiers: []policy.Tier{tier}}
}

// err records a translation error once, however many pods it concerns.
func (t *translator) err(err error) {
	if t.rec != nil {
		t.rec.errs = append(t.rec.errs, err)
	}
	if !slices.ContainsFunc(t.res.Errors, func(e error) bool { return e.Error() == err.Error() }) {
		t.res.Errors = append(t.res.Errors, err)
	}
}

// ruleID is stable for a rule's position, so counters survive recompiles.
func ruleID(parts ...any) uint32 {
	h := fnv.New32a()
	fmt.Fprint(h, parts...)
	id := h.Sum32() % (policy.ImplicitRuleBase - 1)
	return id + 1
}

func (t *translator) rules(pod *v1.Pod, np *netv1.NetworkPolicy, typ netv1.PolicyType) policy.Policy {
	out := policy.Policy{Name: np.Namespace + "/" + np.Name}
	type rule struct {
		peers []netv1.NetworkPolicyPeer
		ports []netv1.NetworkPolicyPort
	}
	var rules []rule
	if typ == netv1.PolicyTypeIngress {
		for _, r := range np.Spec.Ingress {
			rules = append(rules, rule{r.From, r.Ports})
		}
	} else {
		for _, r := range np.Spec.Egress {
			rules = append(rules, rule{r.To, r.Ports})
		}
	}
	for ri, r := range rules {
		peers := r.peers
		if len(peers) == 0 {
			peers = []netv1.NetworkPolicyPeer{{}} // everyone
		}
		for pi, peer := range peers {
			base, ok := t.peerMatch(np, peer, typ)
			if !ok {
				continue
			}
			ports := r.ports
			if len(ports) == 0 {
				ports = []netv1.NetworkPolicyPort{{}}
			}
			for qi, port := range ports {
				where := fmt.Sprintf("%s rule %d peer %d port %d", strings.ToLower(string(typ)), ri, pi, qi)
				kind := "networkpolicy " + np.Namespace + "/" + np.Name
				if np.Namespace == hostEndpointNamespace {
					kind = "hostendpoint " + np.Name
				}
				if proto, _, ok := portProtocol(port); !ok {
					t.err(fmt.Errorf("networkpolicy %s/%s: %s port of protocol %s: ports are TCP, UDP or SCTP; it allows nothing (a rule without ports allows every protocol)",
						np.Namespace, np.Name, strings.ToLower(string(typ)), proto))
					continue
				}
				if typ == netv1.PolicyTypeEgress && port.Port != nil && port.Port.Type == intstr.String {
					// A named port of the destination: one rule per number
					// the peer's pods give the name, each to those pods only.
					for _, rl := range t.namedEgress(np, peer, port) {
						rl.ID = ruleID(np.Namespace, np.Name, typ, ri, pi, qi, pod.Namespace, pod.Name, rl.DstPorts[0].First)
						t.rule(rl.ID, RuleInfo{kind, fmt.Sprintf("%s (%s=%d)", where, port.Port.StrVal, rl.DstPorts[0].First)})
						out.Rules = append(out.Rules, rl)
					}
					continue
				}
				rl := base
				rl.Action = policy.Allow
				rl.ID = ruleID(np.Namespace, np.Name, typ, ri, pi, qi, pod.Namespace, pod.Name)
				if !applyPort(&rl, pod, port) {
					continue
				}
				t.rule(rl.ID, RuleInfo{kind, where})
				out.Rules = append(out.Rules, rl)
			}
		}
	}
	return out
}

// peerMatch turns a peer into the address conditions of a rule.
func (t *translator) peerMatch(np *netv1.NetworkPolicy, peer netv1.NetworkPolicyPeer, typ netv1.PolicyType) (policy.Rule, bool) {
	var r policy.Rule
	setNets := func(nets []netip.Prefix) {
		if typ == netv1.PolicyTypeIngress {
			r.SrcNets = nets
		} else {
			r.DstNets = nets
		}
	}
	setSets := func(ids []uint32, negate bool) {
		if typ == netv1.PolicyTypeIngress {
			r.SrcIPSets, r.NotSrcIPSets = ids, negate
		} else {
			r.DstIPSets, r.NotDstIPSets = ids, negate
		}
	}
	switch {
	case peer.IPBlock != nil:
		cidr, err := netip.ParsePrefix(peer.IPBlock.CIDR)
		if err != nil {
			t.err(fmt.Errorf("networkpolicy %s/%s: ipBlock %q: %w", np.Namespace, np.Name, peer.IPBlock.CIDR, err))
			return r, false
		}
		setNets([]netip.Prefix{cidr.Masked()})
		if len(peer.IPBlock.Except) > 0 {
			var except []netip.Prefix
			for _, e := range peer.IPBlock.Except {
				p, err := netip.ParsePrefix(e)
				if err != nil {
					t.err(fmt.Errorf("networkpolicy %s/%s: ipBlock except %q: %w", np.Namespace, np.Name, e, err))
					return r, false
				}
				except = append(except, p.Masked())
			}
			if len(except) > 0 {
				setSets([]uint32{t.ipSet(except)}, true)
			}
		}
		return r, true
	case peer.PodSelector == nil && peer.NamespaceSelector == nil:
		return r, true // everyone
	}
	setSets([]uint32{t.peerSet(np, peer)}, false)
	return r, true
}

// peerSet returns the IP set of the pods a selector peer names. Peers with
// the same selectors (in the same namespace, without a namespace selector)
// name the same pods: the set is made once per translation.
func (t *translator) peerSet(np *netv1.NetworkPolicy, peer netv1.NetworkPolicyPeer) uint32 {
	key := t.peerKey(np, peer)
	if u, ok := t.peerSets[key]; ok {
		// What the set was made from is read, and its error found, again
		// here: the endpoint's record must hold them without the one that
		// made the set.
		if u.read.key != "" {
			t.reads(u.read)
		}
		if u.err != nil { // this policy's own: a selector that does not parse
			_, _, err := t.selectPods(np, peer)
			t.err(err)
		}
		return t.useSet(u)
	}
	pods, read, err := t.selectPods(np, peer)
	if err != nil {
		t.err(err)
	}
	u := setOf(members(pods))
	u.peer, u.read, u.err = key, read, err
	u.id = t.useSet(u)
	t.peerSets[key] = u
	return u.id
}

// peerKey names the pods a selector peer names: its selectors, and its
// policy's namespace unless it has a namespace selector.
func (t *translator) peerKey(np *netv1.NetworkPolicy, peer netv1.NetworkPolicyPeer) string {
	if peer.NamespaceSelector != nil {
		return "|" + t.text(peer.PodSelector) + "|" + t.text(peer.NamespaceSelector)
	}
	return np.Namespace + "|" + t.text(peer.PodSelector) + "|" + t.text(peer.NamespaceSelector)
}

// selectPods returns the pods a pod/namespace selector peer names and the
// question it asked of the pods, or none and the error of a selector that
// does not parse.
func (t *translator) selectPods(np *netv1.NetworkPolicy, peer netv1.NetworkPolicyPeer) ([]*v1.Pod, podQuery, error) {
	podSel, nsSel := labels.Everything(), labels.Nothing()
	// A selector that does not parse selects nothing (fail closed): the peer
	// lets no pod in or out.
	if peer.PodSelector != nil {
		s, err := t.parse(peer.PodSelector)
		if err != nil {
			return nil, podQuery{}, fmt.Errorf("networkpolicy %s/%s: peer podSelector: %w (the peer matches no pod until fixed)", np.Namespace, np.Name, err)
		}
		podSel = s
	}
	if peer.NamespaceSelector != nil {
		s, err := t.parse(peer.NamespaceSelector)
		if err != nil {
			return nil, podQuery{}, fmt.Errorf("networkpolicy %s/%s: peer namespaceSelector: %w (the peer matches no pod until fixed)", np.Namespace, np.Name, err)
		}
		nsSel = s
	}
	var out []*v1.Pod
	var candidates []*v1.Pod
	read := podQuery{key: t.peerKey(np, peer), ns: np.Namespace, podSel: podSel}
	if peer.NamespaceSelector == nil {
		candidates = t.pods.candidates(podSel, np.Namespace) // the policy's own namespace
	} else {
		read.ns, read.nsSel = "", nsSel
		candidates = t.pods.inNamespaces(nsSel, t.c.Namespaces, podSel)
	}
	t.reads(read)
	for _, p := range candidates {
		inNS := p.Namespace == np.Namespace
		if peer.NamespaceSelector != nil {
			inNS = nsSel.Matches(t.nsLabel[p.Namespace])
		}
		if inNS && podSel.Matches(labels.Set(p.Labels)) {
			out = append(out, p)
		}
	}
	return out, read, nil
}

// ipSet returns the id of the set with these members, creating it once.
// An empty set is a valid set that matches nothing.
func (t *translator) ipSet(members []netip.Prefix) uint32 { return t.useSet(setOf(members)) }

// setUse is a set an endpoint's rules refer to: its members, sorted, and
// the text that tells equal sets alike; the id it had; the peer selector
// it is the set of (peerSet's key) and the question that selected its
// pods, if any.
type setUse struct {
	key     string
	members []netip.Prefix
	id      uint32
	peer    string
	read    podQuery // what the peer's set was made from
	err     error    // why the peer selects nothing, if it does not parse
}

// setOf sorts members and spells them out.
func setOf(members []netip.Prefix) setUse {
	slices.SortFunc(members, func(a, b netip.Prefix) int { return cmp.Or(a.Addr().Compare(b.Addr()), a.Bits()-b.Bits()) })
	members = slices.Compact(members)
	return setUse{key: fmt.Sprint(members), members: members}
}

// useSet returns the id of u's set, numbering sets in the order they are
// first used, and records the use.
func (t *translator) useSet(u setUse) uint32 {
	id, ok := t.setIDs[u.key]
	if !ok {
		id = uint32(len(t.setIDs) + 1)
		t.setIDs[u.key] = id
		t.res.IPSets[id] = u.members
	}
	if t.rec != nil {
		u.id = id
		t.rec.sets = append(t.rec.sets, u)
	}
	return id
}

// rule describes a rule id.
func (t *translator) rule(id uint32, info RuleInfo) {
	t.res.Rules[id] = info
	if t.rec != nil {
		t.rec.rules = append(t.rec.rules, ruleUse{id, info})
	}
}

// portProtocol is a NetworkPolicyPort's protocol number (TCP when unset);
// false for a protocol without ports.
func portProtocol(port netv1.NetworkPolicyPort) (v1.Protocol, uint8, bool) {
	proto := v1.ProtocolTCP
	if port.Protocol != nil {
		proto = *port.Protocol
	}
	switch proto {
	case v1.ProtocolTCP:
		return proto, 6, true
	case v1.ProtocolUDP:
		return proto, 17, true
	case v1.ProtocolSCTP:
		return proto, 132, true
	}
	return proto, 0, false
}

// namedPort lists the numbers a pod's containers give a port name for a
// protocol. A container port without a protocol is TCP, as the API server
// defaults it (manifests read from a folder are not defaulted).
func namedPort(p *v1.Pod, name string, proto v1.Protocol) []uint16 {
	var out []uint16
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			cpProto := cp.Protocol
			if cpProto == "" {
				cpProto = v1.ProtocolTCP
			}
			if cp.Name == name && cpProto == proto && !slices.Contains(out, uint16(cp.ContainerPort)) {
				out = append(out, uint16(cp.ContainerPort))
			}
		}
	}
	return out
}

// applyPort adds a port condition to an ingress rule, or an egress rule with
// a numbered port; false when it can match nothing (a protocol the datapath
// does not carry, a named port the pod does not have). An ingress rule's
// named port is the selected pod's own.
func applyPort(r *policy.Rule, pod *v1.Pod, port netv1.NetworkPolicyPort) bool {
	if port.Port == nil && port.Protocol == nil {
		return true
	}
	proto, number, ok := portProtocol(port)
	if !ok {
		return false
	}
	r.Protocol = number
	switch {
	case port.Port == nil:
		return true
	case port.Port.Type == intstr.String:
		for _, n := range namedPort(pod, port.Port.StrVal, proto) {
			r.DstPorts = append(r.DstPorts, policy.PortRange{First: n, Last: n})
		}
		return len(r.DstPorts) > 0
	}
	last := port.Port.IntVal
	if port.EndPort != nil {
		last = *port.EndPort
	}
	r.DstPorts = []policy.PortRange{{First: uint16(port.Port.IntVal), Last: uint16(last)}}
	return true
}

// namedEgress turns an egress port given by name into rules: a named port
// exists only on pods, so each rule allows the pods the peer reaches (any
// namespace its selectors name; for an ipBlock, the pods inside it; for no
// selector, every pod) on the number they give the name. Pods that give the
// name different numbers each get theirs only.
func (t *translator) namedEgress(np *netv1.NetworkPolicy, peer netv1.NetworkPolicyPeer, port netv1.NetworkPolicyPort) []policy.Rule {
	proto, number, ok := portProtocol(port)
	if !ok {
		return nil
	}
	var pods []*v1.Pod
	switch {
	case peer.IPBlock != nil:
		cidr, err := netip.ParsePrefix(peer.IPBlock.CIDR)
		if err != nil {
			return nil // reported by peerMatch
		}
		var except []netip.Prefix
		for _, e := range peer.IPBlock.Except {
			if p, err := netip.ParsePrefix(e); err == nil {
				except = append(except, p)
			}
		}
		t.reads(podQuery{key: "*", all: true})
		for _, p := range t.c.Pods {
			if slices.ContainsFunc(podIPs(p), func(ip netip.Addr) bool {
				return cidr.Contains(ip) && !slices.ContainsFunc(except, func(e netip.Prefix) bool { return e.Contains(ip) })
			}) {
				pods = append(pods, p)
			}
		}
	case peer.PodSelector == nil && peer.NamespaceSelector == nil:
		t.reads(podQuery{key: "*", all: true})
		pods = t.c.Pods
	default:
		var err error
		if pods, _, err = t.selectPods(np, peer); err != nil {
			t.err(err)
		}
	}
	byNumber := map[uint16][]netip.Prefix{}
	for _, p := range pods {
		for _, n := range namedPort(p, port.Port.StrVal, proto) {
			byNumber[n] = append(byNumber[n], members([]*v1.Pod{p})...)
		}
	}
	var out []policy.Rule
	for _, n := range slices.Sorted(maps.Keys(byNumber)) {
		out = append(out, policy.Rule{Action: policy.Allow, Protocol: number,
			DstIPSets: []uint32{t.ipSet(byNumber[n])}, DstPorts: []policy.PortRange{{First: n, Last: n}}})
	}
	return out
}
