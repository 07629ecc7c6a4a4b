package policy

import (
	"fmt"
	"net/netip"
)

// Action is what a matching rule does.
type Action uint8

// Actions.
const (
	Allow Action = iota
	Deny
	Pass
	Log
)

func (a Action) String() string { return [...]string{"allow", "deny", "pass", "log"}[a] }

// PortRange is an inclusive range of ports; First == Last for one port.
type PortRange struct{ First, Last uint16 }

// hasPorts: the protocols whose destination port a rule's DstPorts judge.
func hasPorts(proto uint8) bool { return proto == 6 || proto == 17 || proto == 132 }

// Rule is one rule. The zero value matches every packet.
type Rule struct {
	// ID identifies the rule in counters; it must be unique within an
	// endpoint's policy and not 0 (0 and IDs >= ImplicitRuleBase are the
	// implicit verdicts).
	ID     uint32
	Action Action

	Protocol    uint8 // 0: any
	NotProtocol bool

	// CIDRs of either family; a packet is only ever in those of its own
	// (a rule whose CIDRs are all of the other family never matches it,
	// and a negated list of them always does).
	SrcNets, DstNets       []netip.Prefix
	NotSrcNets, NotDstNets bool

	SrcIPSets, DstIPSets       []uint32 // IP set ids (IPSets)
	NotSrcIPSets, NotDstIPSets bool

	// DstPorts hold for the protocols with ports: TCP, UDP and SCTP
	// (hasPorts); a packet of another protocol is in none of them.
	DstPorts    []PortRange
	NotDstPorts bool
	// NamedPorts are resolved to DstPorts per endpoint (Resolve).
	NamedPorts []string

	// ICMPType and ICMPCode match ICMP for IPv4 packets and ICMPv6 for
	// IPv6 ones. nil: any.
	ICMPType, ICMPCode *uint8
	NotICMP            bool
}

// Policy is a named list of rules.
type Policy struct {
	Name  string
	Rules []Rule
}

// Tier is an ordered group of policies with a default action (Deny or Pass).
type Tier struct {
	Name          string
	Policies      []Policy
	DefaultAction Action
}

// EndpointPolicy is one direction of one endpoint's policy: its tiers in
// order, profiles as the last tier.
type EndpointPolicy struct {
	Tiers []Tier
}

// ImplicitRuleBase: rule IDs of implicit verdicts — a tier's default action is
// ImplicitRuleBase + the tier's index; the end of the policy is EndOfPolicyRule.
const (
	ImplicitRuleBase = 0xffff0000
	EndOfPolicyRule  = 0xffffffff
)

// Validate checks rule IDs and actions.
func (p *EndpointPolicy) Validate() error {
	seen := map[uint32]string{}
	for ti, t := range p.Tiers {
		if t.DefaultAction != Deny && t.DefaultAction != Pass {
			return fmt.Errorf("tier %q: default action %v: want deny or pass", t.Name, t.DefaultAction)
		}
		for _, pol := range t.Policies {
			for ri, r := range pol.Rules {
				where := fmt.Sprintf("tier %q policy %q rule %d", t.Name, pol.Name, ri)
				if r.ID == 0 || r.ID >= ImplicitRuleBase {
					return fmt.Errorf("%s: id %d: want 1..%d", where, r.ID, ImplicitRuleBase-1)
				}
				if other, dup := seen[r.ID]; dup {
					return fmt.Errorf("%s: id %d already used by %s", where, r.ID, other)
				}
				seen[r.ID] = where
				if r.Action > Log {
					return fmt.Errorf("%s: unknown action %d", where, r.Action)
				}
				if r.Action == Pass && ti == len(p.Tiers)-1 {
					continue // pass in the last tier ends the policy: deny
				}
				for _, n := range append(append([]netip.Prefix{}, r.SrcNets...), r.DstNets...) {
					if !n.IsValid() || n.Addr().Is4In6() || n.Addr().Zone() != "" {
						return fmt.Errorf("%s: %v is not an IPv4 or IPv6 CIDR", where, n)
					}
				}
				for _, pr := range r.DstPorts {
					if pr.First > pr.Last {
						return fmt.Errorf("%s: port range %d-%d is empty", where, pr.First, pr.Last)
					}
				}
				if len(r.NamedPorts) > 0 {
					return fmt.Errorf("%s: named ports %v are not resolved (Resolve)", where, r.NamedPorts)
				}
			}
		}
	}
	return nil
}

// Resolve returns a copy of p with named ports replaced by the endpoint's
// numbers (name -> port); a name the endpoint does not have matches nothing.
func (p *EndpointPolicy) Resolve(named map[string]uint16) EndpointPolicy {
	out := EndpointPolicy{Tiers: make([]Tier, len(p.Tiers))}
	for ti, t := range p.Tiers {
		nt := Tier{Name: t.Name, DefaultAction: t.DefaultAction, Policies: make([]Policy, len(t.Policies))}
		for pi, pol := range t.Policies {
			np := Policy{Name: pol.Name, Rules: make([]Rule, len(pol.Rules))}
			for ri, r := range pol.Rules {
				if len(r.NamedPorts) > 0 {
					ports := append([]PortRange{}, r.DstPorts...)
					resolved := false
					for _, n := range r.NamedPorts {
						if port, ok := named[n]; ok {
							ports = append(ports, PortRange{port, port})
							resolved = true
						}
					}
					if !resolved && len(r.DstPorts) == 0 {
						// No port of that name: the rule can match nothing.
						ports = append(ports, PortRange{0, 0})
					}
					r.DstPorts, r.NamedPorts = ports, nil
				}
				np.Rules[ri] = r
			}
			nt.Policies[pi] = np
		}
		out.Tiers[ti] = nt
	}
	return out
}
