package k8s

// HostEndpoint (sluice.dev/v1alpha1): policy on a node's own interfaces, a
// kind of Sluice's own in the shape of a NetworkPolicy.

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/sluice-net/sluice/policy"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// SchemeGroupVersion is the API group and version of Sluice's own kinds.
var SchemeGroupVersion = schema.GroupVersion{Group: "sluice.dev", Version: "v1alpha1"}

// AddToScheme registers HostEndpoint, for decoding manifests.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &HostEndpoint{})
	return nil
}

// hostEndpointNamespace is the namespace a HostEndpoint's rules are
// translated in: one no pod has, so a bare podSelector selects nothing.
const hostEndpointNamespace = "hostendpoint"

// AllInterfaces, as a HostEndpoint's interface name, binds it to every data
// interface of its node that no HostEndpoint names.
const AllInterfaces = "*"

// HostEndpoint puts policy on a node's data interface: on new flows to the
// node itself and, judged before DNAT, to Services through it (ingress), and
// on new flows the node itself starts through it (egress). Traffic the node
// forwards to or from pods is judged by the pods' policies, not here. The
// failsafe ports (--failsafe-ports) are never judged, so no HostEndpoint can
// lock the node out.
type HostEndpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              HostEndpointSpec `json:"spec"`
}

// HostEndpointSpec says which interface, and the rules, as a NetworkPolicy's:
// isolated for ingress (default deny) unless PolicyTypes says otherwise, for
// egress when it has egress rules or PolicyTypes names Egress; a rule allows
// traffic from (to) any of its peers — ipBlock, or pods by namespaceSelector
// and podSelector — on any of its ports.
type HostEndpointSpec struct {
	// Node is the node's name; "" means every node.
	Node string `json:"node,omitempty"`
	// InterfaceName is a data interface's name, or "*" for every data
	// interface of the node that no other HostEndpoint names.
	InterfaceName string                           `json:"interfaceName"`
	PolicyTypes   []netv1.PolicyType               `json:"policyTypes,omitempty"`
	Ingress       []netv1.NetworkPolicyIngressRule `json:"ingress,omitempty"`
	Egress        []netv1.NetworkPolicyEgressRule  `json:"egress,omitempty"`
}

// DeepCopyObject implements runtime.Object.
func (h *HostEndpoint) DeepCopyObject() runtime.Object {
	out := &HostEndpoint{TypeMeta: h.TypeMeta, ObjectMeta: *h.ObjectMeta.DeepCopy(), Spec: h.Spec}
	out.Spec.PolicyTypes = slices.Clone(h.Spec.PolicyTypes)
	out.Spec.Ingress, out.Spec.Egress = nil, nil
	for _, r := range h.Spec.Ingress {
		out.Spec.Ingress = append(out.Spec.Ingress, *r.DeepCopy())
	}
	for _, r := range h.Spec.Egress {
		out.Spec.Egress = append(out.Spec.Egress, *r.DeepCopy())
	}
	return out
}

// HostEndpointID is the endpoint id a node interface's host policy has in a
// Result: by the interface's name, or AllInterfaces.
func HostEndpointID(iface string) string { return "host:" + iface }

// hostEndpoints translates the HostEndpoints of node into endpoints keyed by
// HostEndpointID. Two naming one interface: the first by name wins, and the
// other is reported.
func (t *translator) hostEndpoints(node string) {
	heps := slices.Clone(t.c.HostEndpoints)
	slices.SortFunc(heps, func(a, b *HostEndpoint) int { return cmp.Compare(a.Name, b.Name) })
	for _, h := range heps {
		if h.Spec.Node != "" && node != "" && h.Spec.Node != node {
			continue
		}
		if h.Spec.InterfaceName == "" {
			t.err(fmt.Errorf("hostendpoint %s: no interfaceName (a data interface's name, or %q)", h.Name, AllInterfaces))
			continue
		}
		id := HostEndpointID(h.Spec.InterfaceName)
		if prev, dup := t.res.Endpoints[id]; dup {
			t.err(fmt.Errorf("hostendpoint %s: interface %s is hostendpoint %s's; this one is ignored", h.Name, h.Spec.InterfaceName, prev.Name))
			continue
		}
		// The rules are a NetworkPolicy's, of a "pod" that is the node's
		// interface: no namespace of its own, no container ports.
		np := &netv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: h.Name, Namespace: hostEndpointNamespace},
			Spec: netv1.NetworkPolicySpec{PolicyTypes: h.Spec.PolicyTypes, Ingress: h.Spec.Ingress, Egress: h.Spec.Egress}}
		if len(np.Spec.PolicyTypes) == 0 {
			np.Spec.PolicyTypes = []netv1.PolicyType{netv1.PolicyTypeIngress}
			if len(h.Spec.Egress) > 0 {
				np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, netv1.PolicyTypeEgress)
			}
		}
		self := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: hostEndpointNamespace, Name: h.Name}}
		ep := Endpoint{Namespace: hostEndpointNamespace, Name: h.Name, Interface: h.Spec.InterfaceName}
		for _, typ := range []netv1.PolicyType{netv1.PolicyTypeIngress, netv1.PolicyTypeEgress} {
			if !slices.Contains(np.Spec.PolicyTypes, typ) {
				continue
			}
			tier := policy.Tier{Name: "host", DefaultAction: policy.Deny, Policies: []policy.Policy{t.rules(self, np, typ)}}
			if typ == netv1.PolicyTypeIngress {
				ep.Ingress = policy.EndpointPolicy{Tiers: []policy.Tier{tier}}
			} else {
				ep.Egress = policy.EndpointPolicy{Tiers: []policy.Tier{tier}}
			}
		}
		t.res.Endpoints[id] = ep
	}
}
