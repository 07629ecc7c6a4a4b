package policy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/sluice-net/sluice/gen"
)

// Maps the compiled programs use (the pinned maps from package maps).
type Maps struct {
	Programs     *ebpf.Map // sl_polprog_v1: slot 0 holds sl_policy_verdict
	IPSets       *ebpf.Map // sl_ipset_v1
	RuleCounters *ebpf.Map // sl_rulectr_v1
	// IPSets6 (sl_ipset6_v1) holds the IPv6 members of the IP sets, and
	// Scratch6 (sl_scratch6_v1) the addresses of the IPv6 packet being
	// judged. Without them a policy denies every IPv6 packet.
	IPSets6  *ebpf.Map
	Scratch6 *ebpf.Map
}

// DefaultRulesPerProgram bounds one program; larger tiers are split across
// programs chained by tail calls. The kernel allows 33 tail calls per packet,
// one for the datapath's hand-off and one for the verdict, so a policy may
// span 31 programs: 15,500 rules per endpoint and direction at the default.
const DefaultRulesPerProgram = 500

// MaxPrograms is how many programs one endpoint direction may compile to.
const MaxPrograms = 31

// Compiler turns an EndpointPolicy into programs.
type Compiler struct {
	Maps            Maps
	RulesPerProgram int
	// RuleByRule compiles every policy rule by rule, never to the
	// classifier (see IndexedRules).
	RuleByRule bool
}

// The policy hand-off in skb->cb (bpf/include/policy.h).
const (
	cbOffset     = 48 // offsetof(struct __sk_buff, cb)
	cbSaddr      = cbOffset
	cbDaddr      = cbOffset + 4
	cbPorts      = cbOffset + 8
	cbMeta       = cbOffset + 12
	cbRule       = cbOffset + 16
	dirShift     = 24      // cb[3]: direction << dirShift (1: ingress)
	familyIPv6   = 1 << 27 // cb[3]: POLICY_IPV6
	verdictAllow = 1 << 28
	verdictDeny  = 1 << 29
	tcActOK      = 0
	tcActShot    = 2
)

// The IP-set lookup key on the stack, laid out as struct ipset_key (its
// generated Go type gives the offsets): {prefixlen, set id, address}.
var ipsetKey gen.SluiceIpsetKey

const (
	ipsetKeyBase      = -16
	ipsetKeyPrefixlen = ipsetKeyBase + int16(unsafe.Offsetof(ipsetKey.Prefixlen))
	ipsetKeySetID     = ipsetKeyBase + int16(unsafe.Offsetof(ipsetKey.SetId))
	ipsetKeyAddr      = ipsetKeyBase + int16(unsafe.Offsetof(ipsetKey.Addr))
)

// The IPv6 IP-set lookup key on the stack, struct ipset6_key.
var ipset6Key gen.SluiceIpset6Key

const (
	ipset6KeyBase      = -40
	ipset6KeyPrefixlen = ipset6KeyBase + int16(unsafe.Offsetof(ipset6Key.Prefixlen))
	ipset6KeySetID     = ipset6KeyBase + int16(unsafe.Offsetof(ipset6Key.SetId))
	ipset6KeyAddr      = ipset6KeyBase + int16(unsafe.Offsetof(ipset6Key.Addr))
)

// Where an IPv6 packet's addresses are in the scratch map's value.
var scratch gen.SluiceCt6Scratch

const (
	scratchSaddr = int32(unsafe.Offsetof(scratch.Pol) + unsafe.Offsetof(scratch.Pol.Saddr))
	scratchDaddr = int32(unsafe.Offsetof(scratch.Pol) + unsafe.Offsetof(scratch.Pol.Daddr))
)

// Registers: r6 the context, r7 the source and r8 the destination address
// (host order; for an IPv6 packet, pointers to the addresses in the scratch
// map), r9 the destination port (host order); r1-r5 are scratch.
const (
	rCtx   = asm.R6
	rSrc   = asm.R7
	rDst   = asm.R8
	rDport = asm.R9
)

// chunk is one program: a run of one tier's rules.
type chunk struct {
	tier            int
	rules           []Rule
	tierEnd         bool
	nextTierProgram int // index of the program starting the next tier, -1 if none
}

func (c *Compiler) chunks(p *EndpointPolicy) []chunk {
	per := c.RulesPerProgram
	if per <= 0 {
		per = DefaultRulesPerProgram
	}
	var out []chunk
	var tierStarts []int
	for ti, t := range p.Tiers {
		tierStarts = append(tierStarts, len(out))
		var rules []Rule
		for _, pol := range t.Policies {
			rules = append(rules, pol.Rules...)
		}
		for len(rules) > per {
			out = append(out, chunk{tier: ti, rules: rules[:per]})
			rules = rules[per:]
		}
		out = append(out, chunk{tier: ti, rules: rules, tierEnd: true})
	}
	for i := range out {
		out[i].nextTierProgram = -1
		if t := out[i].tier + 1; t < len(tierStarts) {
			out[i].nextTierProgram = tierStarts[t]
		}
	}
	return out
}

// plan is how a policy compiles: its rule-by-rule programs, and its
// classifier tables when the classifier judges it.
type plan struct {
	chunks []chunk
	index  *index
}

// programs is how many consecutive slots the policy takes.
func (pl *plan) programs() int {
	switch {
	case pl.index == nil:
		return len(pl.chunks)
	case pl.index.fallback:
		return 1 + len(pl.chunks)
	}
	return 1
}

func (c *Compiler) plan(name string, p *EndpointPolicy) (*plan, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("policy %s: %w", name, err)
	}
	if len(p.Tiers) == 0 {
		return nil, fmt.Errorf("policy %s: no tiers (an endpoint without policy needs no program)", name)
	}
	pl := &plan{chunks: c.chunks(p)}
	if !c.RuleByRule && countRules(p) > IndexedRules && indexable(p, c.Maps.Scratch6) == nil {
		pl.index = buildIndex(p)
	}
	if n := pl.programs(); n > MaxPrograms {
		return nil, fmt.Errorf("policy %s: needs %d programs, more than the %d tail calls allow (at most %d rules per endpoint and direction, or the classifier's: at most %d rules match any one port and address)",
			name, n, MaxPrograms, MaxPrograms*max(c.RulesPerProgram, DefaultRulesPerProgram), clsMaxCandidates)
	}
	return pl, nil
}

// Compile returns the programs of p, to be placed in consecutive slots of
// Maps.Programs starting at firstSlot; the first is the entry. A policy the
// classifier judges comes with maps of its own, which the programs hold
// once loaded.
func (c *Compiler) Compile(name string, p *EndpointPolicy, firstSlot uint32) ([]*ebpf.ProgramSpec, error) {
	pl, err := c.plan(name, p)
	if err != nil {
		return nil, err
	}
	specs, _, err := c.build(name, p, pl, firstSlot, false)
	return specs, err
}

// build makes pl's programs for firstSlot. With namesOnly a classifier is
// only named, and no map is made. release closes this side's handles on the
// classifier's maps.
func (c *Compiler) build(name string, p *EndpointPolicy, pl *plan, firstSlot uint32, namesOnly bool) (specs []*ebpf.ProgramSpec, release func(), err error) {
	release = func() {}
	linearSlot := firstSlot
	if pl.index != nil {
		linearSlot = firstSlot + 1
		var cls *ebpf.ProgramSpec
		if namesOnly {
			cls = &ebpf.ProgramSpec{Name: pl.index.name(linearSlot)}
		} else if cls, release, err = c.classifier(pl.index, linearSlot); err != nil {
			return nil, nil, fmt.Errorf("policy %s: %w", name, err)
		}
		specs = append(specs, cls)
		if !pl.index.fallback {
			return specs, release, nil
		}
	}
	for i, ch := range pl.chunks {
		e := &emitter{c: c, maps: c.Maps, carriers: map[string]bool{}}
		e.prologue()
		// Each program holds its rules twice: for IPv4 packets, then for
		// IPv6 ones, each with the conditions of its family (a CIDR of
		// the other family never holds).
		ipv6 := e.label()
		e.emit(asm.LoadMem(asm.R1, rCtx, cbMeta, asm.Word), asm.JSet.Imm32(asm.R1, familyIPv6, ipv6))
		e.section(p, ch, i, linearSlot, false)
		e.mark(ipv6)
		if c.Maps.Scratch6 == nil {
			e.verdict(false, EndOfPolicyRule) // fail closed: no IPv6 tuple to judge
		} else {
			e.prologue6()
			e.section(p, ch, i, linearSlot, true)
		}
		if err := e.err; err != nil {
			release()
			return nil, nil, fmt.Errorf("policy %s: %w", name, err)
		}
		specs = append(specs, &ebpf.ProgramSpec{
			Name: fmt.Sprintf("slpol_%d", i), Type: ebpf.SchedCLS, License: "Dual BSD/GPL",
			Instructions: e.finish(),
		})
	}
	return specs, release, nil
}

// section emits a chunk's rules for one family, then what happens when
// none decided.
func (e *emitter) section(p *EndpointPolicy, ch chunk, i int, firstSlot uint32, ipv6 bool) {
	e.ipv6 = ipv6
	decided := false
	for _, r := range ch.rules {
		if decided = e.rule(r, ch, firstSlot); decided {
			break // later rules could never be reached, and the verifier refuses dead code
		}
	}
	switch {
	case decided:
	case !ch.tierEnd:
		e.tailCall(firstSlot+uint32(i)+1, tcActShot)
	case p.Tiers[ch.tier].DefaultAction == Deny:
		e.verdict(false, ImplicitRuleBase+uint32(ch.tier))
	case ch.nextTierProgram >= 0:
		e.tailCall(firstSlot+uint32(ch.nextTierProgram), tcActShot)
	default:
		e.verdict(false, EndOfPolicyRule)
	}
}

type emitter struct {
	c        *Compiler
	maps     Maps
	insns    asm.Instructions
	labels   int
	carriers map[string]bool // labels placed on a no-op of their own
	err      error
	ipv6     bool // emitting the IPv6 section
}

// finish drops label carriers no jump refers to.
func (e *emitter) finish() asm.Instructions {
	refs := map[string]bool{}
	for _, ins := range e.insns {
		if r := ins.Reference(); r != "" {
			refs[r] = true
		}
	}
	out := e.insns[:0]
	for _, ins := range e.insns {
		if s := ins.Symbol(); s != "" && e.carriers[s] && !refs[s] {
			continue
		}
		out = append(out, ins)
	}
	return out
}

func (e *emitter) emit(ins ...asm.Instruction) { e.insns = append(e.insns, ins...) }

func (e *emitter) label() string {
	e.labels++
	return fmt.Sprintf("l%d", e.labels)
}

// mark places a label on the next instruction (r1 = 0: r1 is scratch and
// dead at every label).
func (e *emitter) mark(label string) {
	e.carriers[label] = true
	e.emit(asm.Mov.Imm(asm.R1, 0).WithSymbol(label))
}

func (e *emitter) mapPtr(reg asm.Register, m *ebpf.Map) asm.Instruction {
	ins := asm.LoadMapPtr(reg, 0)
	if m == nil {
		e.err = errors.New("a map the policy needs is missing")
		return ins
	}
	if err := ins.AssociateMap(m); err != nil {
		e.err = err
	}
	return ins
}

func (e *emitter) prologue() {
	e.emit(
		asm.Mov.Reg(rCtx, asm.R1),
		asm.LoadMem(rSrc, rCtx, cbSaddr, asm.Word),
		asm.HostTo(asm.BE, rSrc, asm.Word),
		asm.LoadMem(rDst, rCtx, cbDaddr, asm.Word),
		asm.HostTo(asm.BE, rDst, asm.Word),
		asm.LoadMem(rDport, rCtx, cbPorts, asm.Word),
		asm.RSh.Imm32(rDport, 16),
		asm.HostTo(asm.BE, rDport, asm.Half),
	)
}

// prologue6 points r7 and r8 at the IPv6 packet's addresses in the
// scratch map (a per-CPU array: the hand-off wrote them on this CPU).
func (e *emitter) prologue6() {
	missing := e.label()
	e.emit(
		asm.StoreImm(asm.RFP, -8, 0, asm.Word),
		e.mapPtr(asm.R1, e.maps.Scratch6),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, missing),
		asm.Mov.Reg(rSrc, asm.R0),
		asm.Add.Imm(rSrc, scratchSaddr),
		asm.Mov.Reg(rDst, asm.R0),
		asm.Add.Imm(rDst, scratchDaddr),
	)
	ok := e.label()
	e.emit(asm.Ja.Label(ok))
	e.mark(missing)
	e.emit(asm.Mov.Imm(asm.R0, tcActShot), asm.Return())
	e.mark(ok)
}

// meta loads cb[3] masked and shifted into r1.
func (e *emitter) meta(shift int32) {
	e.emit(asm.LoadMem(asm.R1, rCtx, cbMeta, asm.Word))
	if shift > 0 {
		e.emit(asm.RSh.Imm32(asm.R1, shift))
	}
	e.emit(asm.And.Imm32(asm.R1, 0xff))
}

func hostOrder(a netip.Addr) int32 {
	b := a.As4()
	return int32(binary.BigEndian.Uint32(b[:]))
}

func maskOf(p netip.Prefix) int32 {
	if p.Bits() == 0 {
		return 0
	}
	return int32(^uint32(0) << (32 - p.Bits()))
}

// rule emits one rule: every condition that fails jumps to the next rule. It
// reports whether the rule decides every packet (no condition, a deciding
// action), after which nothing more is reachable.
func (e *emitter) rule(r Rule, ch chunk, firstSlot uint32) bool {
	if !possible(r.SrcNets, r.NotSrcNets, e.ipv6) || !possible(r.DstNets, r.NotDstNets, e.ipv6) {
		return false // only CIDRs of the other family: it never holds in this section
	}
	fail := e.label()
	start := len(e.insns)
	if r.Protocol != 0 {
		e.meta(0)
		if r.NotProtocol {
			e.emit(asm.JEq.Imm32(asm.R1, int32(r.Protocol), fail))
		} else {
			e.emit(asm.JNE.Imm32(asm.R1, int32(r.Protocol), fail))
		}
	}
	// Conditions are ANDed: cheapest first, map lookups (IP sets) last.
	if len(r.DstPorts) > 0 {
		l4 := hasPorts(r.Protocol) && !r.NotProtocol
		e.ports(r.DstPorts, r.NotDstPorts, l4, fail)
	}
	if r.ICMPType != nil || r.ICMPCode != nil {
		e.icmp(r, fail)
	}
	if e.ipv6 {
		e.nets6(rSrc, r.SrcNets, r.NotSrcNets, fail)
		e.nets6(rDst, r.DstNets, r.NotDstNets, fail)
		e.sets6(rSrc, r.SrcIPSets, r.NotSrcIPSets, fail)
		e.sets6(rDst, r.DstIPSets, r.NotDstIPSets, fail)
	} else {
		e.nets(rSrc, r.SrcNets, r.NotSrcNets, fail)
		e.nets(rDst, r.DstNets, r.NotDstNets, fail)
		e.sets(cbSaddr, r.SrcIPSets, r.NotSrcIPSets, fail)
		e.sets(cbDaddr, r.DstIPSets, r.NotDstIPSets, fail)
	}
	switch r.Action {
	case Allow, Deny:
		e.verdict(r.Action == Allow, r.ID)
	case Pass:
		if ch.nextTierProgram >= 0 {
			e.tailCall(firstSlot+uint32(ch.nextTierProgram), tcActShot)
		} else {
			e.verdict(false, EndOfPolicyRule)
		}
	case Log:
		e.count(r.ID)
	}
	conditional := false
	for _, ins := range e.insns[start:] {
		if ins.Reference() == fail {
			conditional = true
		}
	}
	if !conditional && r.Action != Log {
		return true
	}
	e.mark(fail)
	return false
}

// ofFamily keeps the CIDRs of one family.
func ofFamily(nets []netip.Prefix, ipv6 bool) []netip.Prefix {
	var out []netip.Prefix
	for _, n := range nets {
		if n.Addr().Is6() == ipv6 {
			out = append(out, n)
		}
	}
	return out
}

// possible: a CIDR condition can hold for a packet of the family: no CIDR,
// some of the family, or (negated) any.
func possible(nets []netip.Prefix, negate, ipv6 bool) bool {
	return len(nets) == 0 || negate || len(ofFamily(nets, ipv6)) > 0
}

// nets: the address in reg is in one of the IPv4 CIDRs (or, negated, in
// none; CIDRs of the other family never hold, so a negated list of them
// always does).
func (e *emitter) nets(reg asm.Register, all []netip.Prefix, negate bool, fail string) {
	nets := ofFamily(all, false)
	if len(nets) == 0 {
		return
	}
	ok := e.label()
	for _, n := range nets {
		e.emit(asm.Mov.Reg32(asm.R1, reg), asm.And.Imm32(asm.R1, maskOf(n)))
		target := ok
		if negate {
			target = fail
		}
		e.emit(asm.JEq.Imm32(asm.R1, hostOrder(n.Masked().Addr())&maskOf(n), target))
	}
	if !negate {
		e.emit(asm.Ja.Label(fail))
	}
	e.mark(ok)
}

// nets6: nets for an IPv6 address, which reg points at: each CIDR is
// compared a 32-bit word at a time, the last one masked.
func (e *emitter) nets6(reg asm.Register, all []netip.Prefix, negate bool, fail string) {
	nets := ofFamily(all, true)
	if len(nets) == 0 {
		return
	}
	ok := e.label()
	for _, n := range nets {
		next := e.label()
		addr := n.Masked().Addr().As16()
		for w := 0; w*32 < n.Bits(); w++ {
			bits := min(32, n.Bits()-w*32)
			mask := int32(^uint32(0) << (32 - bits))
			want := int32(binary.BigEndian.Uint32(addr[4*w:])) & mask
			e.emit(asm.LoadMem(asm.R1, reg, int16(4*w), asm.Word), asm.HostTo(asm.BE, asm.R1, asm.Word))
			if bits < 32 {
				e.emit(asm.And.Imm32(asm.R1, mask))
			}
			e.emit(asm.JNE.Imm32(asm.R1, want, next))
		}
		target := ok
		if negate {
			target = fail
		}
		if n.Bits() == 0 {
			// ::/0 holds every address; a conditional jump as nets uses,
			// since what follows an unconditional one would be code the
			// verifier refuses as unreachable.
			e.emit(asm.Mov.Imm(asm.R1, 0), asm.JEq.Imm32(asm.R1, 0, target))
		} else {
			e.emit(asm.Ja.Label(target))
		}
		e.mark(next)
	}
	if !negate {
		e.emit(asm.Ja.Label(fail))
	}
	e.mark(ok)
}

// sets: the address at ctx offset off is in one of the IP sets (LPM lookup of
// {64, set id, address} in sl_ipset_v1); negated, in none.
func (e *emitter) sets(off int16, ids []uint32, negate bool, fail string) {
	e.setLookups(ids, negate, fail, e.maps.IPSets, ipsetKeyBase, func(id int64) {
		e.emit(
			asm.StoreImm(asm.RFP, ipsetKeyPrefixlen, 64, asm.Word),
			asm.StoreImm(asm.RFP, ipsetKeySetID, id, asm.Word),
			asm.LoadMem(asm.R1, rCtx, off, asm.Word),
			asm.StoreMem(asm.RFP, ipsetKeyAddr, asm.R1, asm.Word),
		)
	})
}

// sets6: sets for an IPv6 address, which reg points at ({32 + 128, set id,
// address} in sl_ipset6_v1).
func (e *emitter) sets6(reg asm.Register, ids []uint32, negate bool, fail string) {
	e.setLookups(ids, negate, fail, e.maps.IPSets6, ipset6KeyBase, func(id int64) {
		e.emit(
			asm.StoreImm(asm.RFP, ipset6KeyPrefixlen, 32+128, asm.Word),
			asm.StoreImm(asm.RFP, ipset6KeySetID, id, asm.Word),
		)
		for w := int16(0); w < 4; w++ {
			e.emit(asm.LoadMem(asm.R1, reg, 4*w, asm.Word), asm.StoreMem(asm.RFP, ipset6KeyAddr+4*w, asm.R1, asm.Word))
		}
	})
}

// setLookups emits one LPM lookup in m per set id, the key built at the
// stack offset keyBase by key (given the set id as the network-order word
// the key holds): the rule goes on when one holds (negated: when none does).
func (e *emitter) setLookups(ids []uint32, negate bool, fail string, m *ebpf.Map, keyBase int16, key func(id int64)) {
	if len(ids) == 0 {
		return
	}
	ok := e.label()
	for _, id := range ids {
		var be [4]byte
		binary.BigEndian.PutUint32(be[:], id)
		key(int64(int32(binary.LittleEndian.Uint32(be[:]))))
		e.emit(
			e.mapPtr(asm.R1, m),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, int32(keyBase)),
			asm.FnMapLookupElem.Call(),
		)
		if negate {
			e.emit(asm.JNE.Imm(asm.R0, 0, fail))
		} else {
			e.emit(asm.JNE.Imm(asm.R0, 0, ok))
		}
	}
	if !negate {
		e.emit(asm.Ja.Label(fail))
	}
	e.mark(ok)
}

// ports: TCP, UDP or SCTP with the destination port in a range; negated,
// anything else. knownL4: the rule already required one of them.
func (e *emitter) ports(ranges []PortRange, negate, knownL4 bool, fail string) {
	in, out := e.label(), e.label()
	if !knownL4 {
		check := e.label()
		e.meta(0)
		e.emit(asm.JEq.Imm32(asm.R1, 6, check), asm.JEq.Imm32(asm.R1, 17, check), asm.JEq.Imm32(asm.R1, 132, check),
			asm.Ja.Label(out))
		e.mark(check)
	}
	for _, pr := range ranges {
		if pr.First == pr.Last {
			e.emit(asm.JEq.Imm32(rDport, int32(pr.First), in))
			continue
		}
		next := e.label()
		e.emit(asm.JLT.Imm32(rDport, int32(pr.First), next), asm.JLE.Imm32(rDport, int32(pr.Last), in))
		e.mark(next)
	}
	e.emit(asm.Ja.Label(out))
	e.settle(in, out, fail, negate)
}

// settle ends a condition whose code jumps to in when it holds and to out
// when it does not: the rule fails on out, or on in when the condition is
// negated; otherwise evaluation goes on past it.
func (e *emitter) settle(in, out, fail string, negate bool) {
	if negate {
		in, out = out, in
	}
	e.mark(out)
	e.emit(asm.Ja.Label(fail))
	e.mark(in)
}

// icmp: an ICMP packet with the type (and code); negated, anything else.
func (e *emitter) icmp(r Rule, fail string) {
	in, out := e.label(), e.label()
	proto := int32(1) // ICMP; its IPv6 section matches ICMPv6's types
	if e.ipv6 {
		proto = 58
	}
	e.meta(0)
	e.emit(asm.JNE.Imm32(asm.R1, proto, out))
	if r.ICMPType != nil {
		e.meta(8)
		e.emit(asm.JNE.Imm32(asm.R1, int32(*r.ICMPType), out))
	}
	if r.ICMPCode != nil {
		e.meta(16)
		e.emit(asm.JNE.Imm32(asm.R1, int32(*r.ICMPCode), out))
	}
	e.emit(asm.Ja.Label(in))
	e.settle(in, out, fail, r.NotICMP)
}

// verdict records the decision in cb and hands over to the verdict program;
// if slot 0 is empty the program returns the verdict itself.
func (e *emitter) verdict(allow bool, ruleID uint32) {
	bit, ret := int32(verdictDeny), int32(tcActShot)
	if allow {
		bit, ret = verdictAllow, tcActOK
	}
	e.emit(
		asm.StoreImm(rCtx, cbRule, int64(int32(ruleID)), asm.Word),
		asm.LoadMem(asm.R1, rCtx, cbMeta, asm.Word),
		asm.Or.Imm32(asm.R1, bit),
		asm.StoreMem(rCtx, cbMeta, asm.R1, asm.Word),
	)
	e.tailCall(0, ret)
}

// tailCall jumps to the program in slot; if it is empty, returns fallback.
func (e *emitter) tailCall(slot uint32, fallback int32) {
	e.emit(
		asm.Mov.Reg(asm.R1, rCtx),
		e.mapPtr(asm.R2, e.maps.Programs),
		asm.Mov.Imm(asm.R3, int32(slot)),
		asm.FnTailCall.Call(),
		asm.Mov.Imm(asm.R0, fallback),
		asm.Return(),
	)
}

// count adds one to the rule's per-CPU counter (the Log action).
func (e *emitter) count(ruleID uint32) {
	create, done := e.label(), e.label()
	e.emit(
		asm.LoadImm(asm.R1, int64(ruleID), asm.DWord),
		asm.StoreMem(asm.RFP, -24, asm.R1, asm.DWord),
		e.mapPtr(asm.R1, e.maps.RuleCounters),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -24),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, create),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Ja.Label(done),
	)
	e.mark(create)
	e.emit(
		asm.Mov.Imm(asm.R1, 1), // (StoreImm of a double word encodes an invalid opcode)
		asm.StoreMem(asm.RFP, -32, asm.R1, asm.DWord),
		e.mapPtr(asm.R1, e.maps.RuleCounters),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -24),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -32),
		asm.Mov.Imm(asm.R4, 1), // BPF_NOEXIST
		asm.FnMapUpdateElem.Call(),
	)
	e.mark(done)
}

// PlanStats tells how a policy compiles.
type PlanStats struct {
	Programs int  // slots it takes
	Indexed  bool // judged by the classifier
	// IndexBytes is the keys and values of the classifier's maps (the
	// kernel's per-entry overhead comes on top); 0 without the classifier.
	IndexBytes int
}

// Stats plans p as Compile would and tells how it compiles.
func (c *Compiler) Stats(name string, p *EndpointPolicy) (PlanStats, error) {
	pl, err := c.plan(name, p)
	if err != nil {
		return PlanStats{}, err
	}
	st := PlanStats{Programs: pl.programs(), Indexed: pl.index != nil}
	if pl.index != nil {
		st.IndexBytes = pl.index.mapBytes()
	}
	return st, nil
}
