package policy

import (
	"net/netip"
	"slices"
)

// Packet is what a policy sees of a packet: the tuple as the destination sees
// it (after DNAT and SNAT).
type Packet struct {
	Src, Dst         netip.Addr
	Protocol         uint8
	SrcPort, DstPort uint16
	ICMPType         uint8
	ICMPCode         uint8
}

// IPSets maps an IP set id to its members.
type IPSets map[uint32][]netip.Prefix

func (s IPSets) contains(id uint32, a netip.Addr) bool {
	return slices.ContainsFunc(s[id], func(p netip.Prefix) bool { return p.Contains(a) })
}

// Verdict is the result of evaluating a policy.
type Verdict struct {
	Allow  bool
	RuleID uint32   // the deciding rule (or an implicit verdict's id)
	Logged []uint32 // Log rules that matched on the way
}

// Evaluate is the reference evaluator (see the package documentation).
func Evaluate(p *EndpointPolicy, sets IPSets, pkt Packet) Verdict {
	var v Verdict
	if len(p.Tiers) == 0 {
		v.Allow = true
		return v
	}
tiers:
	for ti, t := range p.Tiers {
		for _, pol := range t.Policies {
			for _, r := range pol.Rules {
				if !r.matches(sets, pkt) {
					continue
				}
				switch r.Action {
				case Allow, Deny:
					v.Allow, v.RuleID = r.Action == Allow, r.ID
					return v
				case Pass:
					continue tiers
				case Log:
					v.Logged = append(v.Logged, r.ID)
				}
			}
		}
		if t.DefaultAction == Deny {
			v.RuleID = ImplicitRuleBase + uint32(ti)
			return v
		}
	}
	v.RuleID = EndOfPolicyRule
	return v
}

func anyNet(nets []netip.Prefix, a netip.Addr) bool {
	return slices.ContainsFunc(nets, func(p netip.Prefix) bool { return p.Contains(a) })
}

func (r *Rule) matches(sets IPSets, p Packet) bool {
	cond := func(present, match, negate bool) bool { return !present || match != negate }
	l4 := hasPorts(p.Protocol)
	inPorts := l4 && slices.ContainsFunc(r.DstPorts, func(pr PortRange) bool { return p.DstPort >= pr.First && p.DstPort <= pr.Last })
	icmp := (p.Protocol == 1 && p.Src.Is4() || p.Protocol == 58 && p.Src.Is6()) && (r.ICMPType == nil || *r.ICMPType == p.ICMPType) && (r.ICMPCode == nil || *r.ICMPCode == p.ICMPCode)
	return cond(r.Protocol != 0, p.Protocol == r.Protocol, r.NotProtocol) &&
		cond(len(r.SrcNets) > 0, anyNet(r.SrcNets, p.Src), r.NotSrcNets) &&
		cond(len(r.DstNets) > 0, anyNet(r.DstNets, p.Dst), r.NotDstNets) &&
		cond(len(r.SrcIPSets) > 0, slices.ContainsFunc(r.SrcIPSets, func(id uint32) bool { return sets.contains(id, p.Src) }), r.NotSrcIPSets) &&
		cond(len(r.DstIPSets) > 0, slices.ContainsFunc(r.DstIPSets, func(id uint32) bool { return sets.contains(id, p.Dst) }), r.NotDstIPSets) &&
		cond(len(r.DstPorts) > 0, inPorts, r.NotDstPorts) &&
		cond(r.ICMPType != nil || r.ICMPCode != nil, icmp, r.NotICMP)
}
