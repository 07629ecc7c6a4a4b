package policy_test

import (
	"flag"

	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-net/sluice/policy"
)

var seed = flag.Uint64("policy-seed", 0, "seed of the differential test (0: a fixed default)")

// A small address space of each family so random rules and packets meet
// often; IPv6 addresses differ in the words the compiled code compares
// one at a time (the first, a middle one, the last).
func randAddr(r *rand.Rand, ipv6 bool) netip.Addr {
	if ipv6 {
		var b [16]byte
		b[0], b[1] = 0xfd, byte(r.IntN(2))
		b[7] = byte(r.IntN(4))
		b[15] = byte(r.IntN(8))
		return netip.AddrFrom16(b)
	}
	return netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(4)), byte(r.IntN(8))})
}

func randPrefix(r *rand.Rand) netip.Prefix {
	if r.IntN(2) == 0 {
		return netip.PrefixFrom(randAddr(r, true), []int{0, 8, 16, 50, 56, 64, 100, 126, 128}[r.IntN(9)]).Masked()
	}
	return netip.PrefixFrom(randAddr(r, false), []int{0, 8, 16, 24, 30, 32}[r.IntN(6)]).Masked()
}

func randRule(r *rand.Rand, id uint32) policy.Rule {
	rule := policy.Rule{ID: id, Action: policy.Action(r.IntN(4))}
	if r.IntN(3) == 0 {
		rule.Protocol = []uint8{1, 6, 17, 58}[r.IntN(4)]
		rule.NotProtocol = r.IntN(4) == 0
	}
	if r.IntN(3) == 0 {
		for range 1 + r.IntN(3) {
			rule.SrcNets = append(rule.SrcNets, randPrefix(r))
		}
		rule.NotSrcNets = r.IntN(4) == 0
	}
	if r.IntN(3) == 0 {
		rule.DstNets = []netip.Prefix{randPrefix(r)}
		rule.NotDstNets = r.IntN(4) == 0
	}
	if r.IntN(4) == 0 {
		rule.SrcIPSets = []uint32{uint32(1 + r.IntN(3))}
		rule.NotSrcIPSets = r.IntN(4) == 0
	}
	if r.IntN(4) == 0 {
		rule.DstIPSets = []uint32{uint32(1 + r.IntN(3)), uint32(1 + r.IntN(3))}
		rule.NotDstIPSets = r.IntN(4) == 0
	}
	if r.IntN(3) == 0 {
		for range 1 + r.IntN(2) {
			lo := uint16(r.IntN(100))
			rule.DstPorts = append(rule.DstPorts, policy.PortRange{lo, lo + uint16(r.IntN(20))})
		}
		rule.NotDstPorts = r.IntN(4) == 0
	}
	if r.IntN(6) == 0 {
		t := uint8(r.IntN(4))
		rule.ICMPType = &t
		if r.IntN(2) == 0 {
			c := uint8(r.IntN(2))
			rule.ICMPCode = &c
		}
		rule.NotICMP = r.IntN(4) == 0
	}
	return rule
}

func randPolicy(r *rand.Rand, maxRules int) *policy.EndpointPolicy {
	p := &policy.EndpointPolicy{}
	id := uint32(1)
	for t := range 1 + r.IntN(3) {
		tier := policy.Tier{Name: string(rune('a' + t)), DefaultAction: []policy.Action{policy.Deny, policy.Pass}[r.IntN(2)]}
		for range 1 + r.IntN(3) {
			pol := policy.Policy{}
			for range r.IntN(maxRules/6 + 1) {
				pol.Rules = append(pol.Rules, randRule(r, id))
				id++
			}
			tier.Policies = append(tier.Policies, pol)
		}
		p.Tiers = append(p.Tiers, tier)
	}
	return p
}

// randSetup seeds a differential test (-policy-seed, or the test's own
// default) and writes three random IP sets to e's maps.
func randSetup(e *env, defaultSeed uint64) (uint64, *rand.Rand, policy.IPSets) {
	s := *seed
	if s == 0 {
		s = defaultSeed
	}
	r := rand.New(rand.NewPCG(s, s))
	sets := policy.IPSets{}
	for id := uint32(1); id <= 3; id++ {
		for range 1 + r.IntN(4) {
			sets[id] = append(sets[id], randPrefix(r))
		}
	}
	e.setIPSets(sets)
	return s, r, sets
}

func randPacket(r *rand.Rand) policy.Packet {
	ipv6 := r.IntN(2) == 0
	icmp := uint8(1)
	if ipv6 {
		icmp = 58
	}
	p := policy.Packet{Src: randAddr(r, ipv6), Dst: randAddr(r, ipv6), Protocol: []uint8{icmp, 6, 17}[r.IntN(3)]}
	if p.Protocol == icmp {
		p.ICMPType, p.ICMPCode = uint8(r.IntN(4)), uint8(r.IntN(2))
	} else {
		p.SrcPort, p.DstPort = uint16(r.IntN(65536)), uint16(r.IntN(120))
	}
	return p
}

// Random policies (up to hundreds of rules, random IP sets, split across
// programs; CIDRs and set members of both families) and random packets of
// both families: the compiled verdict and deciding rule equal the reference
// evaluator's on every packet. Reproduce a failure with
// -policy-seed.
func TestCompiledEqualsReference(t *testing.T) {
	e := newEnv(t)
	s, r, sets := randSetup(e, 20261129)
	cases := 0
	indexed := 0
	for i := range 60 {
		p := randPolicy(r, []int{12, 60, 300}[i%3])
		perProgram := []int{0, 7, 40}[i%3] // small chunks force tail-call chains
		// Each policy both ways: rule by rule, and (above
		// policy.IndexedRules rules) by the classifier.
		byRule := e.loadWith(policy.Compiler{Maps: e.maps, RulesPerProgram: perProgram, RuleByRule: true}, p, 1)
		progs := map[string]*ebpf.Program{"rule by rule": byRule}
		if countRules(p) > policy.IndexedRules {
			// Past the rule-by-rule programs' slots (and with its own
			// for the rule-by-rule programs it falls back to).
			progs["classifier"] = e.loadWith(policy.Compiler{Maps: e.maps, RulesPerProgram: perProgram}, p, 200)
			indexed++
		}
		for range 60 {
			pkt := randPacket(r)
			want := policy.Evaluate(p, sets, pkt)
			for how, prog := range progs {
				allow, rule := e.run(prog, pkt, false)
				if allow != want.Allow || rule != want.RuleID {
					t.Fatalf("seed %d policy %d (%s): packet %+v: compiled allow %v rule %#x, reference allow %v rule %#x\npolicy: %+v",
						s, i, how, pkt, allow, rule, want.Allow, want.RuleID, p)
				}
			}
			cases++
		}
	}
	if indexed == 0 {
		t.Fatal("no policy was large enough for the classifier")
	}
	t.Logf("seed %d: %d packets agreed (%d of 60 policies also by the classifier)", s, cases, indexed)
}

func countRules(p *policy.EndpointPolicy) int {
	n := 0
	for _, t := range p.Tiers {
		for _, pol := range t.Policies {
			n += len(pol.Rules)
		}
	}
	return n
}

// Thousands of rules per endpoint: split across programs chained by tail
// calls; the last rule still decides.
func TestLargePolicySplitsAcrossPrograms(t *testing.T) {
	e := newEnv(t)
	const n = 6000
	var rules []policy.Rule
	for i := range n {
		rules = append(rules, policy.Rule{ID: uint32(i + 1), Action: policy.Allow, Protocol: 6,
			DstPorts: []policy.PortRange{{uint16(i + 1), uint16(i + 1)}}})
	}
	p := oneTier(rules...)
	c := policy.Compiler{Maps: e.maps, RuleByRule: true}
	specs, err := c.Compile("big", p, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != n/policy.DefaultRulesPerProgram {
		t.Fatalf("%d programs for %d rules", len(specs), n)
	}
	prog := e.loadWith(c, p, 1)
	if allow, rule := e.run(prog, tcp("1.1.1.1", "2.2.2.2", n), false); !allow || rule != n {
		t.Fatalf("last rule: allow %v rule %d", allow, rule)
	}
	if allow, rule := e.run(prog, tcp("1.1.1.1", "2.2.2.2", n+1), false); allow || rule != policy.ImplicitRuleBase {
		t.Fatalf("no match: allow %v rule %#x", allow, rule)
	}
	// Beyond the tail-call limit the compiler says so.
	for i := n; i < policy.MaxPrograms*policy.DefaultRulesPerProgram+1; i++ {
		rules = append(rules, policy.Rule{ID: uint32(i + 1), Protocol: 6})
	}
	if _, err := c.Compile("huge", oneTier(rules...), 1); err == nil {
		t.Fatal("a policy beyond the tail-call limit compiled")
	}
	// The classifier takes 20,000 rules in one program, as no packet can
	// match more than its limit of them (one port each).
	rules = rules[:0]
	for i := range 20_000 {
		rules = append(rules, policy.Rule{ID: uint32(i + 1), Action: policy.Allow, Protocol: 6,
			DstPorts: []policy.PortRange{{uint16(i + 1), uint16(i + 1)}}})
	}
	c.RuleByRule = false
	specs, err = c.Compile("huge", oneTier(rules...), 1)
	if err != nil || len(specs) != 1 {
		t.Fatalf("classifier: %d programs, %v", len(specs), err)
	}
	prog = e.loadWith(c, oneTier(rules...), 1)
	if allow, rule := e.run(prog, tcp("1.1.1.1", "2.2.2.2", 20_000), false); !allow || rule != 20_000 {
		t.Fatalf("classifier, last rule: allow %v rule %d", allow, rule)
	}
	if allow, rule := e.run(prog, tcp("1.1.1.1", "2.2.2.2", 20_001), false); allow || rule != policy.ImplicitRuleBase {
		t.Fatalf("classifier, no match: allow %v rule %#x", allow, rule)
	}
}

// The classifier at the scale: policies of 100,000 rules in three
// tiers, each rule selective by one condition — a destination port (or a
// short range), a destination CIDR or a source CIDR, of either family, as
// NetworkPolicy rules name them — and otherwise as random as in
// TestCompiledEqualsReference, plus a few rules with no such condition;
// judged in one program. Random packets, half of them made to meet one
// rule's selective condition, agree with the reference evaluator.
func TestClassifierEqualsReferenceAt100kRules(t *testing.T) {
	e := newEnv(t)
	s, r, sets := randSetup(e, 20261201)
	const n, unindexed = 100_000, 30
	p := &policy.EndpointPolicy{}
	for ti := range 3 {
		p.Tiers = append(p.Tiers, policy.Tier{Name: string(rune('a' + ti)), DefaultAction: []policy.Action{policy.Pass, policy.Deny}[r.IntN(2)],
			Policies: []policy.Policy{{Name: "p"}}})
	}
	// A CIDR in a wide space of either family, so few rules share one.
	wideNet := func() netip.Prefix {
		if r.IntN(2) == 0 {
			var b [16]byte
			b[0], b[1], b[2], b[3], b[4] = 0xfd, 0, byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))
			return netip.PrefixFrom(netip.AddrFrom16(b), 40+r.IntN(89)).Masked()
		}
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))}), 16+r.IntN(17)).Masked()
	}
	var all []policy.Rule
	for i := range n {
		rule := randRule(r, uint32(i+1))
		switch {
		case i%(n/unindexed) == 0:
			// Unindexed, and (as an ICMP condition) matching a few
			// packets only, or they would decide every packet.
			three := uint8(3)
			rule.DstPorts, rule.DstNets, rule.SrcNets = nil, nil, nil
			rule.ICMPType, rule.NotICMP = &three, false
		case i%3 == 0:
			lo := uint16(r.IntN(65536 - 4))
			rule.DstPorts, rule.NotDstPorts = []policy.PortRange{{lo, lo + uint16(r.IntN(3))}}, false
			if rule.Protocol != 0 && !rule.NotProtocol && rule.Protocol != 6 && rule.Protocol != 17 {
				rule.Protocol = 6
			}
		case i%3 == 1:
			rule.DstNets, rule.NotDstNets = []netip.Prefix{wideNet()}, false
		default:
			rule.SrcNets, rule.NotSrcNets = []netip.Prefix{wideNet(), wideNet()}, false
		}
		all = append(all, rule)
		pol := &p.Tiers[i*3/n].Policies[0]
		pol.Rules = append(pol.Rules, rule)
	}
	c := policy.Compiler{Maps: e.maps}
	st, err := c.Stats("huge", p)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Indexed || st.Programs != 1 {
		t.Fatalf("%+v for %d rules: want the classifier alone", st, n)
	}
	prog := e.loadWith(c, p, 1)
	// inside returns an address of n's family in n.
	inside := func(n netip.Prefix) netip.Addr {
		b := n.Addr().AsSlice()
		for bit := n.Bits(); bit < len(b)*8; bit++ {
			if r.IntN(2) == 1 {
				b[bit/8] |= 0x80 >> (bit % 8)
			}
		}
		a, _ := netip.AddrFromSlice(b)
		return a
	}
	decided, deciding := 0, map[uint32]bool{}
	for range 4000 {
		pkt := randPacket(r)
		if pkt.Protocol == 6 || pkt.Protocol == 17 {
			pkt.DstPort = uint16(r.IntN(65536))
		}
		if rule := all[r.IntN(n)]; r.IntN(2) == 0 {
			switch {
			case len(rule.DstPorts) > 0 && (pkt.Protocol == 6 || pkt.Protocol == 17):
				pkt.DstPort = rule.DstPorts[0].First
			case len(rule.DstNets) > 0 && rule.DstNets[0].Addr().Is6() == pkt.Src.Is6():
				pkt.Dst = inside(rule.DstNets[0])
			case len(rule.SrcNets) > 0 && rule.SrcNets[0].Addr().Is6() == pkt.Src.Is6():
				pkt.Src = inside(rule.SrcNets[0])
			}
		}
		want := policy.Evaluate(p, sets, pkt)
		allow, rule := e.run(prog, pkt, false)
		if allow != want.Allow || rule != want.RuleID {
			t.Fatalf("seed %d: packet %+v: classifier allow %v rule %#x, reference allow %v rule %#x", s, pkt, allow, rule, want.Allow, want.RuleID)
		}
		if rule < policy.ImplicitRuleBase {
			decided++
			deciding[rule] = true
		}
	}
	if len(deciding) < 150 {
		t.Fatalf("%d packets of 4000 were decided by only %d rules: the test does not reach the rules", decided, len(deciding))
	}
	t.Logf("seed %d: 4000 packets agreed, %d decided by %d different rules of %d; classifier maps %.1f MB", s, decided, len(deciding), n, float64(st.IndexBytes)/1e6)
}
