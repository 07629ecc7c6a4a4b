package k8s

// AdminNetworkPolicy and BaselineAdminNetworkPolicy (v1alpha1), the
// predecessors of ClusterNetworkPolicy, are translated by converting them:
// an AdminNetworkPolicy is a ClusterNetworkPolicy of the Admin tier (Allow is
// Accept), the BaselineAdminNetworkPolicy one of the Baseline tier.

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	alpha "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	npa "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// convertedFrom annotates a converted policy with the kind it was written as,
// so errors and rule descriptions name what the user wrote.
const convertedFrom = "sluice.dev/converted-from"

func convertedMeta(kind string, m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Annotations: map[string]string{convertedFrom: kind}}
}

func convertSubject(s alpha.AdminNetworkPolicySubject) npa.ClusterNetworkPolicySubject {
	out := npa.ClusterNetworkPolicySubject{Namespaces: s.Namespaces}
	if s.Pods != nil {
		out.Pods = &npa.NamespacedPod{NamespaceSelector: s.Pods.NamespaceSelector, PodSelector: s.Pods.PodSelector}
	}
	return out
}

func convertPods(p *alpha.NamespacedPod) *npa.NamespacedPod {
	if p == nil {
		return nil
	}
	return &npa.NamespacedPod{NamespaceSelector: p.NamespaceSelector, PodSelector: p.PodSelector}
}

// convertPorts turns v1alpha1 ports (each with its protocol) into protocol
// entries. No ports: nil, every protocol and port.
func convertPorts(ports *[]alpha.AdminNetworkPolicyPort) []npa.ClusterNetworkPolicyProtocol {
	if ports == nil {
		return nil
	}
	entry := func(proto v1.Protocol, port npa.Port) npa.ClusterNetworkPolicyProtocol {
		switch proto {
		case v1.ProtocolUDP:
			return npa.ClusterNetworkPolicyProtocol{UDP: &npa.ClusterNetworkPolicyProtocolUDP{DestinationPort: &port}}
		case v1.ProtocolSCTP:
			return npa.ClusterNetworkPolicyProtocol{SCTP: &npa.ClusterNetworkPolicyProtocolSCTP{DestinationPort: &port}}
		}
		return npa.ClusterNetworkPolicyProtocol{TCP: &npa.ClusterNetworkPolicyProtocolTCP{DestinationPort: &port}} // TCP, the default
	}
	var out []npa.ClusterNetworkPolicyProtocol
	for _, p := range *ports {
		switch {
		case p.PortNumber != nil:
			out = append(out, entry(p.PortNumber.Protocol, npa.Port{Number: p.PortNumber.Port}))
		case p.PortRange != nil:
			out = append(out, entry(p.PortRange.Protocol, npa.Port{Range: &npa.PortRange{Start: p.PortRange.Start, End: p.PortRange.End}}))
		case p.NamedPort != nil:
			out = append(out, npa.ClusterNetworkPolicyProtocol{DestinationNamedPort: *p.NamedPort})
		}
	}
	return out
}

func convertNetworks(in []alpha.CIDR) []npa.CIDR {
	var out []npa.CIDR
	for _, c := range in {
		out = append(out, npa.CIDR(c))
	}
	return out
}

func convertDomains(in []alpha.DomainName) []npa.DomainName {
	var out []npa.DomainName
	for _, d := range in {
		out = append(out, npa.DomainName(d))
	}
	return out
}

func convertIngressPeers(in []alpha.AdminNetworkPolicyIngressPeer) []npa.ClusterNetworkPolicyIngressPeer {
	var out []npa.ClusterNetworkPolicyIngressPeer
	for _, p := range in {
		out = append(out, npa.ClusterNetworkPolicyIngressPeer{Namespaces: p.Namespaces, Pods: convertPods(p.Pods)})
	}
	return out
}

// convertIngressRule converts an ingress rule, of either v1alpha1 kind.
func convertIngressRule(name, action string, from []alpha.AdminNetworkPolicyIngressPeer, ports *[]alpha.AdminNetworkPolicyPort) npa.ClusterNetworkPolicyIngressRule {
	return npa.ClusterNetworkPolicyIngressRule{Name: name, Action: convertAction(action), From: convertIngressPeers(from), Protocols: convertPorts(ports)}
}

// convertAction maps v1alpha1's Allow to Accept; Deny and Pass keep their
// names (an unknown action stays unknown, and fails closed).
func convertAction(a string) npa.ClusterNetworkPolicyRuleAction {
	if a == "Allow" {
		return npa.ClusterNetworkPolicyRuleActionAccept
	}
	return npa.ClusterNetworkPolicyRuleAction(a)
}

// ConvertANP turns an AdminNetworkPolicy into the ClusterNetworkPolicy of the
// Admin tier that means the same.
func ConvertANP(p *alpha.AdminNetworkPolicy) *npa.ClusterNetworkPolicy {
	out := &npa.ClusterNetworkPolicy{ObjectMeta: convertedMeta("AdminNetworkPolicy", p.ObjectMeta), Spec: npa.ClusterNetworkPolicySpec{
		Tier: npa.AdminTier, Priority: p.Spec.Priority, Subject: convertSubject(p.Spec.Subject)}}
	for _, r := range p.Spec.Ingress {
		out.Spec.Ingress = append(out.Spec.Ingress, convertIngressRule(r.Name, string(r.Action), r.From, r.Ports))
	}
	for _, r := range p.Spec.Egress {
		var to []npa.ClusterNetworkPolicyEgressPeer
		for _, e := range r.To {
			to = append(to, npa.ClusterNetworkPolicyEgressPeer{Namespaces: e.Namespaces, Pods: convertPods(e.Pods), Nodes: e.Nodes,
				Networks: convertNetworks(e.Networks), DomainNames: convertDomains(e.DomainNames)})
		}
		out.Spec.Egress = append(out.Spec.Egress, npa.ClusterNetworkPolicyEgressRule{Name: r.Name,
			Action: convertAction(string(r.Action)), To: to, Protocols: convertPorts(r.Ports)})
	}
	return out
}

// ConvertBANP turns the BaselineAdminNetworkPolicy into the
// ClusterNetworkPolicy of the Baseline tier that means the same.
func ConvertBANP(p *alpha.BaselineAdminNetworkPolicy) *npa.ClusterNetworkPolicy {
	out := &npa.ClusterNetworkPolicy{ObjectMeta: convertedMeta("BaselineAdminNetworkPolicy", p.ObjectMeta), Spec: npa.ClusterNetworkPolicySpec{
		Tier: npa.BaselineTier, Subject: convertSubject(p.Spec.Subject)}}
	for _, r := range p.Spec.Ingress {
		out.Spec.Ingress = append(out.Spec.Ingress, convertIngressRule(r.Name, string(r.Action), r.From, r.Ports))
	}
	for _, r := range p.Spec.Egress {
		var to []npa.ClusterNetworkPolicyEgressPeer
		for _, e := range r.To {
			to = append(to, npa.ClusterNetworkPolicyEgressPeer{Namespaces: e.Namespaces, Pods: convertPods(e.Pods), Nodes: e.Nodes,
				Networks: convertNetworks(e.Networks)})
		}
		out.Spec.Egress = append(out.Spec.Egress, npa.ClusterNetworkPolicyEgressRule{Name: r.Name,
			Action: convertAction(string(r.Action)), To: to, Protocols: convertPorts(r.Ports)})
	}
	return out
}
