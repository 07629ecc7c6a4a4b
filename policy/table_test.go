package policy_test

import (
	"net/netip"
	"testing"

	"github.com/sluice-net/sluice/policy"
)

func u8(v uint8) *uint8 { return &v }

func pfx(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func tcp(src, dst string, dport uint16) policy.Packet {
	return policy.Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Protocol: 6, SrcPort: 40000, DstPort: dport}
}

func udp(src, dst string, dport uint16) policy.Packet {
	p := tcp(src, dst, dport)
	p.Protocol = 17
	return p
}

func icmp(src, dst string, typ, code uint8) policy.Packet {
	return policy.Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Protocol: 1, ICMPType: typ, ICMPCode: code}
}

func oneTier(rules ...policy.Rule) *policy.EndpointPolicy {
	return &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "default", DefaultAction: policy.Deny,
		Policies: []policy.Policy{{Name: "p", Rules: rules}}}}}
}

var sets = policy.IPSets{
	7: pfx("10.1.0.0/16", "192.0.2.5/32"),
	8: pfx("172.16.0.0/12"),
}

// The table: each case's policy and packet, the expected verdict and rule;
// the reference evaluator must agree with it too.
func TestPolicyTable(t *testing.T) {
	e := newEnv(t)
	e.setIPSets(sets)
	tiered := &policy.EndpointPolicy{Tiers: []policy.Tier{
		{Name: "security", DefaultAction: policy.Pass, Policies: []policy.Policy{{Name: "sec", Rules: []policy.Rule{
			{ID: 1, Action: policy.Deny, SrcNets: pfx("203.0.113.0/24")},
			{ID: 2, Action: policy.Pass, DstPorts: []policy.PortRange{{8000, 8999}}},
			{ID: 3, Action: policy.Log, Protocol: 17},
		}}}},
		{Name: "app", DefaultAction: policy.Pass, Policies: []policy.Policy{
			{Name: "web", Rules: []policy.Rule{{ID: 10, Action: policy.Allow, Protocol: 6, DstPorts: []policy.PortRange{{80, 80}, {443, 443}}}}},
			{Name: "dns", Rules: []policy.Rule{{ID: 11, Action: policy.Allow, Protocol: 17, DstPorts: []policy.PortRange{{53, 53}}}}},
		}},
		{Name: "profile", DefaultAction: policy.Deny, Policies: []policy.Policy{{Name: "prof", Rules: []policy.Rule{
			{ID: 20, Action: policy.Allow, DstPorts: []policy.PortRange{{8080, 8080}}},
		}}}},
	}}
	cases := []struct {
		name  string
		pol   *policy.EndpointPolicy
		pkt   policy.Packet
		allow bool
		rule  uint32
	}{
		{"empty rule matches all", oneTier(policy.Rule{ID: 1}), tcp("10.0.0.1", "10.0.0.2", 1), true, 1},
		{"deny rule", oneTier(policy.Rule{ID: 1, Action: policy.Deny}), tcp("10.0.0.1", "10.0.0.2", 1), false, 1},
		{"no match: tier default deny", oneTier(policy.Rule{ID: 1, Protocol: 17}), tcp("10.0.0.1", "10.0.0.2", 1), false, policy.ImplicitRuleBase},
		{"protocol tcp", oneTier(policy.Rule{ID: 1, Protocol: 6}), tcp("10.0.0.1", "10.0.0.2", 1), true, 1},
		{"protocol not tcp, tcp packet", oneTier(policy.Rule{ID: 1, Protocol: 6, NotProtocol: true}), tcp("10.0.0.1", "10.0.0.2", 1), false, policy.ImplicitRuleBase},
		{"protocol not tcp, udp packet", oneTier(policy.Rule{ID: 1, Protocol: 6, NotProtocol: true}), udp("10.0.0.1", "10.0.0.2", 1), true, 1},
		{"source CIDR in", oneTier(policy.Rule{ID: 1, SrcNets: pfx("10.0.0.0/8")}), tcp("10.9.9.9", "1.1.1.1", 1), true, 1},
		{"source CIDR out", oneTier(policy.Rule{ID: 1, SrcNets: pfx("10.0.0.0/8")}), tcp("11.0.0.1", "1.1.1.1", 1), false, policy.ImplicitRuleBase},
		{"source CIDR list, second", oneTier(policy.Rule{ID: 1, SrcNets: pfx("10.0.0.0/8", "192.168.0.0/16")}), tcp("192.168.3.4", "1.1.1.1", 1), true, 1},
		{"source /32", oneTier(policy.Rule{ID: 1, SrcNets: pfx("192.0.2.7/32")}), tcp("192.0.2.7", "1.1.1.1", 1), true, 1},
		{"source /32 neighbour", oneTier(policy.Rule{ID: 1, SrcNets: pfx("192.0.2.7/32")}), tcp("192.0.2.8", "1.1.1.1", 1), false, policy.ImplicitRuleBase},
		{"source 0/0", oneTier(policy.Rule{ID: 1, SrcNets: pfx("0.0.0.0/0")}), tcp("255.1.2.3", "1.1.1.1", 1), true, 1},
		{"high-bit addresses", oneTier(policy.Rule{ID: 1, DstNets: pfx("224.0.0.0/4")}), udp("10.0.0.1", "239.1.2.3", 5), true, 1},
		{"not source CIDR, inside", oneTier(policy.Rule{ID: 1, SrcNets: pfx("10.0.0.0/8"), NotSrcNets: true}), tcp("10.1.1.1", "1.1.1.1", 1), false, policy.ImplicitRuleBase},
		{"not source CIDR, outside", oneTier(policy.Rule{ID: 1, SrcNets: pfx("10.0.0.0/8"), NotSrcNets: true}), tcp("11.1.1.1", "1.1.1.1", 1), true, 1},
		{"destination CIDR", oneTier(policy.Rule{ID: 1, DstNets: pfx("10.96.0.0/12")}), tcp("1.1.1.1", "10.100.0.1", 1), true, 1},
		{"destination CIDR out", oneTier(policy.Rule{ID: 1, DstNets: pfx("10.96.0.0/12")}), tcp("1.1.1.1", "10.112.0.1", 1), false, policy.ImplicitRuleBase},
		{"source IP set", oneTier(policy.Rule{ID: 1, SrcIPSets: []uint32{7}}), tcp("10.1.200.1", "1.1.1.1", 1), true, 1},
		{"source IP set /32 member", oneTier(policy.Rule{ID: 1, SrcIPSets: []uint32{7}}), tcp("192.0.2.5", "1.1.1.1", 1), true, 1},
		{"source IP set miss", oneTier(policy.Rule{ID: 1, SrcIPSets: []uint32{7}}), tcp("192.0.2.6", "1.1.1.1", 1), false, policy.ImplicitRuleBase},
		{"IP set of another id", oneTier(policy.Rule{ID: 1, SrcIPSets: []uint32{8}}), tcp("10.1.0.1", "1.1.1.1", 1), false, policy.ImplicitRuleBase},
		{"either of two IP sets", oneTier(policy.Rule{ID: 1, SrcIPSets: []uint32{8, 7}}), tcp("10.1.0.1", "1.1.1.1", 1), true, 1},
		{"not in IP set", oneTier(policy.Rule{ID: 1, DstIPSets: []uint32{8}, NotDstIPSets: true}), tcp("1.1.1.1", "172.20.0.1", 1), false, policy.ImplicitRuleBase},
		{"not in IP set, outside", oneTier(policy.Rule{ID: 1, DstIPSets: []uint32{8}, NotDstIPSets: true}), tcp("1.1.1.1", "8.8.8.8", 1), true, 1},
		{"unknown IP set matches nothing", oneTier(policy.Rule{ID: 1, DstIPSets: []uint32{99}}), tcp("1.1.1.1", "8.8.8.8", 1), false, policy.ImplicitRuleBase},
		{"port", oneTier(policy.Rule{ID: 1, DstPorts: []policy.PortRange{{80, 80}}}), tcp("1.1.1.1", "2.2.2.2", 80), true, 1},
		{"port miss", oneTier(policy.Rule{ID: 1, DstPorts: []policy.PortRange{{80, 80}}}), tcp("1.1.1.1", "2.2.2.2", 81), false, policy.ImplicitRuleBase},
		{"port range low edge", oneTier(policy.Rule{ID: 1, DstPorts: []policy.PortRange{{8000, 8999}}}), tcp("1.1.1.1", "2.2.2.2", 8000), true, 1},
		{"port range high edge", oneTier(policy.Rule{ID: 1, DstPorts: []policy.PortRange{{8000, 8999}}}), udp("1.1.1.1", "2.2.2.2", 8999), true, 1},
		{"port range above", oneTier(policy.Rule{ID: 1, DstPorts: []policy.PortRange{{8000, 8999}}}), tcp("1.1.1.1", "2.2.2.2", 9000), false, policy.ImplicitRuleBase},
		{"port above 32767", oneTier(policy.Rule{ID: 1, DstPorts: []policy.PortRange{{60000, 65535}}}), tcp("1.1.1.1", "2.2.2.2", 65535), true, 1},
		{"ports never match ICMP", oneTier(policy.Rule{ID: 1, DstPorts: []policy.PortRange{{0, 65535}}}), icmp("1.1.1.1", "2.2.2.2", 8, 0), false, policy.ImplicitRuleBase},
		{"not ports: ICMP passes", oneTier(policy.Rule{ID: 1, DstPorts: []policy.PortRange{{80, 80}}, NotDstPorts: true}), icmp("1.1.1.1", "2.2.2.2", 8, 0), true, 1},
		{"not ports: port inside", oneTier(policy.Rule{ID: 1, DstPorts: []policy.PortRange{{80, 80}}, NotDstPorts: true}), tcp("1.1.1.1", "2.2.2.2", 80), false, policy.ImplicitRuleBase},
		{"ICMP type", oneTier(policy.Rule{ID: 1, ICMPType: u8(8)}), icmp("1.1.1.1", "2.2.2.2", 8, 0), true, 1},
		{"ICMP type miss", oneTier(policy.Rule{ID: 1, ICMPType: u8(8)}), icmp("1.1.1.1", "2.2.2.2", 0, 0), false, policy.ImplicitRuleBase},
		{"ICMP type and code", oneTier(policy.Rule{ID: 1, ICMPType: u8(3), ICMPCode: u8(4)}), icmp("1.1.1.1", "2.2.2.2", 3, 4), true, 1},
		{"ICMP code miss", oneTier(policy.Rule{ID: 1, ICMPType: u8(3), ICMPCode: u8(4)}), icmp("1.1.1.1", "2.2.2.2", 3, 3), false, policy.ImplicitRuleBase},
		{"not ICMP echo, TCP packet", oneTier(policy.Rule{ID: 1, ICMPType: u8(8), NotICMP: true}), tcp("1.1.1.1", "2.2.2.2", 1), true, 1},
		{"all conditions", oneTier(policy.Rule{ID: 5, Protocol: 6, SrcNets: pfx("10.0.0.0/8"), DstIPSets: []uint32{8}, DstPorts: []policy.PortRange{{443, 443}}}),
			tcp("10.2.3.4", "172.16.5.6", 443), true, 5},
		{"all conditions, one fails", oneTier(policy.Rule{ID: 5, Protocol: 6, SrcNets: pfx("10.0.0.0/8"), DstIPSets: []uint32{8}, DstPorts: []policy.PortRange{{443, 443}}}),
			tcp("10.2.3.4", "172.16.5.6", 444), false, policy.ImplicitRuleBase},
		{"first matching rule wins", oneTier(policy.Rule{ID: 1, Action: policy.Deny, DstPorts: []policy.PortRange{{22, 22}}}, policy.Rule{ID: 2}), tcp("1.1.1.1", "2.2.2.2", 22), false, 1},
		{"later rule", oneTier(policy.Rule{ID: 1, Action: policy.Deny, DstPorts: []policy.PortRange{{22, 22}}}, policy.Rule{ID: 2}), tcp("1.1.1.1", "2.2.2.2", 23), true, 2},
		{"tiers: security deny", tiered, tcp("203.0.113.9", "2.2.2.2", 80), false, 1},
		{"tiers: pass skips to the next tier", tiered, tcp("1.1.1.1", "2.2.2.2", 8080), true, 20},
		{"tiers: security default pass, app allows", tiered, tcp("1.1.1.1", "2.2.2.2", 443), true, 10},
		{"tiers: log then allow", tiered, udp("1.1.1.1", "2.2.2.2", 53), true, 11},
		{"tiers: app default pass, profile default deny", tiered, tcp("1.1.1.1", "2.2.2.2", 22), false, policy.ImplicitRuleBase + 2},
		{"tiers: pass, profile default deny", tiered, tcp("1.1.1.1", "2.2.2.2", 8081), false, policy.ImplicitRuleBase + 2},
		{"pass in the last tier ends in deny", oneTier(policy.Rule{ID: 1, Action: policy.Pass}), tcp("1.1.1.1", "2.2.2.2", 1), false, policy.EndOfPolicyRule},
		{"tier default pass then end of policy", &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "t", DefaultAction: policy.Pass}}},
			tcp("1.1.1.1", "2.2.2.2", 1), false, policy.EndOfPolicyRule},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ref := policy.Evaluate(c.pol, sets, c.pkt)
			if ref.Allow != c.allow || ref.RuleID != c.rule {
				t.Fatalf("reference evaluator: allow %v rule %#x, want %v %#x", ref.Allow, ref.RuleID, c.allow, c.rule)
			}
			prog := e.load(c.pol, 0)
			allow, rule := e.run(prog, c.pkt, false)
			if allow != c.allow || rule != c.rule {
				t.Fatalf("compiled: allow %v rule %#x, want %v %#x", allow, rule, c.allow, c.rule)
			}
		})
	}
	if len(cases) < 40 {
		t.Fatalf("only %d cases", len(cases))
	}
}
