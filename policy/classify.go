package policy

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
)

// A policy with more than IndexedRules rules is judged by the classifier
// (bpf/classify.c). Each rule is indexed by one of its conditions (groups):
// its destination port, its destination or its source CIDRs; rules with
// none of them are kept apart. A packet is checked, in rule order, only
// against the rules listed for its port and addresses and the rules kept
// apart, so its cost grows with how many rules can match it rather than
// with the policy's size. Smaller policies are compiled rule by rule, which
// is as fast at their size. A policy where some packet's list would hold
// more than clsMaxCandidates rules keeps its rule-by-rule programs too,
// for such packets.
const IndexedRules = 64

// The classifier's limits (bpf/classify.c): a rule with more CIDRs, IP sets
// or port ranges per condition than these, or a policy of more tiers, is
// compiled rule by rule.
const (
	clsNets           = 4
	clsSets           = 4
	clsPorts          = 4
	clsTiers          = 64
	clsMaxCandidates  = 64
	clsOverflow       = 0xffffffff
	clsOtherProtocols = 3 * 65536
)

// The classifier's rule flags (enum cls_flags).
const (
	clsProto = 1 << iota
	clsNotProto
	clsNotSrcNets
	clsNotDstNets
	clsNotSrcSets
	clsNotDstSets
	clsNotPorts
	clsICMP
	clsNotICMP
	clsICMPType
	clsICMPCode
)

// index is a policy's classifier tables, built in memory before any map.
type index struct {
	rules    []gen.ClassifyClsRule
	items    []uint32
	ports    []gen.ClassifyClsList                      // clsOtherProtocols+1 slots
	addr     [2][2]map[netip.Prefix]gen.ClassifyClsList // [source, destination][IPv4, IPv6]
	meta     gen.ClassifyClsMeta
	fallback bool // some packet's list overflows: the rule-by-rule programs follow
}

// indexable reports whether p fits the classifier, and why not.
func indexable(p *EndpointPolicy, scratch6 *ebpf.Map) error {
	if len(p.Tiers) > clsTiers {
		return fmt.Errorf("%d tiers, more than %d", len(p.Tiers), clsTiers)
	}
	if scratch6 == nil {
		return errors.New("no IPv6 scratch map")
	}
	for _, t := range p.Tiers {
		for _, pol := range t.Policies {
			for _, r := range pol.Rules {
				if len(r.SrcNets) > clsNets || len(r.DstNets) > clsNets || len(r.SrcIPSets) > clsSets ||
					len(r.DstIPSets) > clsSets || len(r.DstPorts) > clsPorts {
					return fmt.Errorf("rule %d has more than %d CIDRs, %d IP sets or %d port ranges in a condition", r.ID, clsNets, clsSets, clsPorts)
				}
				for _, n := range append(slices.Clip(r.SrcNets), r.DstNets...) {
					if !n.IsValid() {
						return fmt.Errorf("rule %d: %v is not a CIDR", r.ID, n)
					}
				}
			}
		}
	}
	return nil
}

func countRules(p *EndpointPolicy) int {
	n := 0
	for _, t := range p.Tiers {
		for _, pol := range t.Policies {
			n += len(pol.Rules)
		}
	}
	return n
}

// clsNet is n as the classifier compares it: address and mask as the
// network-order words a packet's address is read as.
func clsNet(n netip.Prefix) gen.ClassifyClsNet {
	var addr, mask [16]byte
	a := n.Masked().Addr()
	if a.Is6() {
		addr = a.As16()
	} else {
		b := a.As4()
		copy(addr[:], b[:])
	}
	for bit := range n.Bits() {
		mask[bit/8] |= 0x80 >> (bit % 8)
	}
	out := gen.ClassifyClsNet{}
	if a.Is6() {
		out.Ipv6 = 1
	}
	for w := range 4 {
		out.Addr[w] = binary.LittleEndian.Uint32(addr[4*w:])
		out.Mask[w] = binary.LittleEndian.Uint32(mask[4*w:])
	}
	return out
}

// unusedNet fills a rule's unused CIDR slots: of no packet's family.
var unusedNet = gen.ClassifyClsNet{Ipv6: 2}

func netUint32(id uint32) uint32 {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], id)
	return binary.LittleEndian.Uint32(b[:])
}

// clsRule is r as the classifier reads it.
func clsRule(r Rule, tier int) gen.ClassifyClsRule {
	c := gen.ClassifyClsRule{Id: r.ID, Action: uint8(r.Action), Tier: uint8(tier), Proto: r.Protocol}
	flag := func(on bool, f uint16) {
		if on {
			c.Flags |= f
		}
	}
	flag(r.Protocol != 0, clsProto)
	flag(r.NotProtocol, clsNotProto)
	flag(r.NotSrcNets, clsNotSrcNets)
	flag(r.NotDstNets, clsNotDstNets)
	flag(r.NotSrcIPSets, clsNotSrcSets)
	flag(r.NotDstIPSets, clsNotDstSets)
	flag(r.NotDstPorts, clsNotPorts)
	flag(r.ICMPType != nil || r.ICMPCode != nil, clsICMP)
	flag(r.NotICMP, clsNotICMP)
	if r.ICMPType != nil {
		c.Flags |= clsICMPType
		c.IcmpType = *r.ICMPType
	}
	if r.ICMPCode != nil {
		c.Flags |= clsICMPCode
		c.IcmpCode = *r.ICMPCode
	}
	for i := range c.Ports {
		c.Ports[i] = gen.ClassifyClsPortRange{First: 1, Last: 0} // empty: no port is in it
		if i < len(r.DstPorts) {
			c.Ports[i] = gen.ClassifyClsPortRange{First: r.DstPorts[i].First, Last: r.DstPorts[i].Last}
		}
	}
	c.N_ports = uint8(len(r.DstPorts))
	for i := range c.SrcNets {
		c.SrcNets[i], c.DstNets[i] = unusedNet, unusedNet
		if i < len(r.SrcNets) {
			c.SrcNets[i] = clsNet(r.SrcNets[i])
		}
		if i < len(r.DstNets) {
			c.DstNets[i] = clsNet(r.DstNets[i])
		}
	}
	c.N_srcNets = uint8(len(r.SrcNets))
	c.N_dstNets = uint8(len(r.DstNets))
	for i, id := range r.SrcIPSets {
		c.SrcSets[i] = netUint32(id)
	}
	c.N_srcSets = uint8(len(r.SrcIPSets))
	for i, id := range r.DstIPSets {
		c.DstSets[i] = netUint32(id)
	}
	c.N_dstSets = uint8(len(r.DstIPSets))
	return c
}

// lists stores candidate lists in items, each distinct list once.
type lists struct {
	items []uint32
	seen  map[string]gen.ClassifyClsList
}

// add stores rules (ascending rule numbers) and returns its list; more
// than clsMaxCandidates make an overflowing list.
func (l *lists) add(rules []uint32) gen.ClassifyClsList {
	if len(rules) > clsMaxCandidates {
		return gen.ClassifyClsList{Len: clsOverflow}
	}
	var key strings.Builder
	for _, r := range rules {
		key.WriteString(strconv.FormatUint(uint64(r), 36))
		key.WriteByte(',')
	}
	if got, ok := l.seen[key.String()]; ok {
		return got
	}
	out := gen.ClassifyClsList{Off: uint32(len(l.items)), Len: uint32(len(rules))}
	l.items = append(l.items, rules...)
	l.seen[key.String()] = out
	return out
}

// merged returns the union of two ascending lists, stopping once it holds
// more than clsMaxCandidates.
func merged(a, b []uint32) []uint32 {
	out := make([]uint32, 0, min(len(a)+len(b), clsMaxCandidates+1))
	for len(a)+len(b) > 0 && len(out) <= clsMaxCandidates {
		switch {
		case len(b) == 0 || len(a) > 0 && a[0] < b[0]:
			out, a = append(out, a[0]), a[1:]
		case len(a) == 0 || b[0] < a[0]:
			out, b = append(out, b[0]), b[1:]
		default:
			out, a, b = append(out, a[0]), a[1:], b[1:]
		}
	}
	return out
}

// portClass is the cls_ports class of a protocol: 0 TCP, 1 UDP, 2 SCTP, 3
// any other.
func portClass(proto uint8) int {
	switch proto {
	case 6:
		return 0
	case 17:
		return 1
	case 132:
		return 2
	}
	return 3
}

// The groups of rules (enum cls_group): each rule is indexed by one of its
// conditions, and a packet's candidates are its list in each group.
const (
	byPort = iota
	byDst
	bySrc
	wild
)

// groups assigns each rule the condition it is indexed by: of its
// unnegated port, destination and source conditions, the one whose values
// the fewest other rules share, so that a crowd of rules on one port (or
// one CIDR) is indexed by its other condition where it has one.
func groups(flat []Rule) []int {
	type portKey struct{ first, last uint16 }
	ports := map[portKey]int{}
	nets := [2]map[netip.Prefix]int{{}, {}}
	for _, r := range flat {
		if len(r.DstPorts) > 0 && !r.NotDstPorts {
			for _, pr := range r.DstPorts {
				ports[portKey{pr.First, pr.Last}]++
			}
		}
		if len(r.DstNets) > 0 && !r.NotDstNets {
			for _, n := range r.DstNets {
				nets[0][n.Masked()]++
			}
		}
		if len(r.SrcNets) > 0 && !r.NotSrcNets {
			for _, n := range r.SrcNets {
				nets[1][n.Masked()]++
			}
		}
	}
	out := make([]int, len(flat))
	for i, r := range flat {
		out[i] = wild
		crowd := -1
		consider := func(g, c int) {
			if crowd < 0 || c < crowd {
				out[i], crowd = g, c
			}
		}
		if len(r.DstPorts) > 0 && !r.NotDstPorts {
			c := 0
			for _, pr := range r.DstPorts {
				c = max(c, ports[portKey{pr.First, pr.Last}]+int(pr.Last-pr.First))
			}
			consider(byPort, c)
		}
		if len(r.DstNets) > 0 && !r.NotDstNets {
			c := 0
			for _, n := range r.DstNets {
				c = max(c, nets[0][n.Masked()])
			}
			consider(byDst, c)
		}
		if len(r.SrcNets) > 0 && !r.NotSrcNets {
			c := 0
			for _, n := range r.SrcNets {
				c = max(c, nets[1][n.Masked()])
			}
			consider(bySrc, c)
		}
	}
	return out
}

// buildIndex flattens p's tiers into numbered rules and indexes them.
func buildIndex(p *EndpointPolicy) *index {
	x := &index{ports: make([]gen.ClassifyClsList, clsOtherProtocols+1)}
	var flat []Rule
	next := uint8(clsTiers)
	for ti := range x.meta.NextDeny {
		ti = len(x.meta.NextDeny) - 1 - ti
		if ti < len(p.Tiers) && p.Tiers[ti].DefaultAction == Deny {
			next = uint8(ti)
		}
		x.meta.NextDeny[ti] = next
	}
	for ti, t := range p.Tiers {
		for _, pol := range t.Policies {
			for _, r := range pol.Rules {
				x.rules = append(x.rules, clsRule(r, ti))
				flat = append(flat, r)
			}
		}
	}
	x.meta.Tiers = uint32(len(p.Tiers))
	group := groups(flat)
	l := &lists{seen: map[string]gen.ClassifyClsList{}}
	var unindexed []uint32
	for i, g := range group {
		if g == wild {
			unindexed = append(unindexed, uint32(i))
		}
	}
	x.meta.Wild = l.add(unindexed)
	overflow := x.meta.Wild.Len == clsOverflow
	overflow = x.indexPorts(flat, group, l) || overflow
	for side := range 2 {
		for fam := range 2 {
			var over bool
			x.addr[side][fam], over = indexAddrs(flat, group, side == 1, fam == 1, l)
			overflow = overflow || over
			if len(x.addr[side][fam]) > 0 {
				x.meta.Tries |= 1 << (2*fam + side) // CLS_HAS_*
			}
		}
	}
	x.items = l.items
	x.fallback = overflow
	return x
}

// indexPorts fills x.ports with the lists of the rules indexed by port: for
// each protocol class and port, those whose port and protocol conditions
// hold. It reports whether a list overflows.
func (x *index) indexPorts(flat []Rule, group []int, l *lists) bool {
	overflow := false
	empty := l.add(nil)
	x.ports[clsOtherProtocols] = empty // port conditions hold for TCP, UDP and SCTP only
	for class := range 3 {
		type event struct {
			port int // the range starts here (start) or ends just before (end)
			rule uint32
			end  bool
		}
		var events []event
		for i, r := range flat {
			if group[i] != byPort || r.Protocol != 0 && !r.NotProtocol && portClass(r.Protocol) != class {
				continue
			}
			for _, pr := range r.DstPorts {
				events = append(events, event{int(pr.First), uint32(i), false}, event{int(pr.Last) + 1, uint32(i), true})
			}
		}
		slices.SortFunc(events, func(a, b event) int { return cmp.Compare(a.port, b.port) })
		active := map[uint32]int{} // rule -> ranges of it covering the port
		list := empty
		next := 0
		for port := 0; port <= 65535; {
			changed := false
			for next < len(events) && events[next].port == port {
				e := events[next]
				if e.end {
					if active[e.rule]--; active[e.rule] == 0 {
						delete(active, e.rule)
					}
				} else {
					active[e.rule]++
				}
				changed = true
				next++
			}
			if changed {
				if len(active) > clsMaxCandidates {
					list = gen.ClassifyClsList{Len: clsOverflow}
				} else {
					covering := make([]uint32, 0, len(active))
					for r := range active {
						covering = append(covering, r)
					}
					slices.Sort(covering)
					list = l.add(covering)
				}
			}
			end := 65536
			if next < len(events) {
				end = min(end, events[next].port)
			}
			for ; port < end; port++ {
				x.ports[class*65536+port] = list
			}
			overflow = overflow || list.Len == clsOverflow
		}
	}
	return overflow
}

// indexAddrs builds one address trie of the rules indexed by that address:
// for each CIDR of the family they name, and for /0 when they name CIDRs of
// the family, the rules whose condition holds for an address in it. It is
// empty when none of them names a CIDR of the family. It reports whether a
// list overflows.
func indexAddrs(flat []Rule, group []int, dst, ipv6 bool, l *lists) (map[netip.Prefix]gen.ClassifyClsList, bool) {
	want := bySrc
	if dst {
		want = byDst
	}
	at := map[netip.Prefix][]uint32{}
	for i, r := range flat {
		if group[i] != want {
			continue
		}
		nets := r.SrcNets
		if dst {
			nets = r.DstNets
		}
		for _, n := range nets {
			if n.Addr().Is6() == ipv6 {
				n = n.Masked()
				if rs := at[n]; len(rs) == 0 || rs[len(rs)-1] != uint32(i) {
					at[n] = append(rs, uint32(i))
				}
			}
		}
	}
	if len(at) == 0 {
		return nil, false
	}
	root := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	if ipv6 {
		root = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	if _, ok := at[root]; !ok {
		at[root] = nil
	}
	out := make(map[netip.Prefix]gen.ClassifyClsList, len(at))
	overflow := false
	// In a fixed order: the lists' places in the items, and so the
	// program's name (index.name), must not depend on map iteration, or a
	// restarted agent would not know its own classifier (Runtime.Matches).
	prefixes := slices.SortedFunc(maps.Keys(at), func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	for _, n := range prefixes {
		var rules []uint32
		for bits := 0; bits <= n.Bits() && len(rules) <= clsMaxCandidates; bits++ {
			if rs, ok := at[netip.PrefixFrom(n.Addr(), bits).Masked()]; ok {
				rules = merged(rules, rs)
			}
		}
		out[n] = l.add(rules)
		overflow = overflow || out[n].Len == clsOverflow
	}
	return out, overflow
}

// name names the classifier program of x whose fallback programs start at
// fallbackSlot after its tables, as codeName names a program after its
// instructions: the classifier's code is the same for every policy, its
// tables are not.
func (x *index) name(fallbackSlot uint32) string {
	h := sha256.New()
	w := func(v any) { _ = binary.Write(h, binary.LittleEndian, v) }
	w(x.metaAt(fallbackSlot))
	w(x.rules)
	w(x.items)
	w(x.ports)
	for side := range 2 {
		for fam := range 2 {
			keys := make([]netip.Prefix, 0, len(x.addr[side][fam]))
			for n := range x.addr[side][fam] {
				keys = append(keys, n)
			}
			slices.SortFunc(keys, func(a, b netip.Prefix) int {
				return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
			})
			for _, n := range keys {
				b, _ := n.MarshalBinary()
				h.Write(b)
				w(x.addr[side][fam][n])
			}
		}
	}
	return classifierPrefix + hex.EncodeToString(h.Sum(nil))[:12]
}

// named is meta carrying name.
func named(meta gen.ClassifyClsMeta, name string) gen.ClassifyClsMeta {
	gen.PutCString(meta.Name[:], name)
	return meta
}

// classifierPrefix starts a classifier program's name (index.name).
const classifierPrefix = "slc"

// classifierName reads the name a loaded classifier's tables carry
// (cls_meta.name), "" when info is not a classifier's.
func classifierName(info *ebpf.ProgramInfo) string {
	ids, ok := info.MapIDs()
	if !ok {
		return ""
	}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		mi, err := m.Info()
		var meta gen.ClassifyClsMeta
		if err == nil && mi.Name == gen.ClassifyMapClsMetaMap {
			err = m.Lookup(uint32(0), &meta)
		}
		m.Close()
		if err == nil && mi.Name == gen.ClassifyMapClsMetaMap {
			return gen.CString(meta.Name[:])
		}
	}
	return ""
}

// metaAt is x's meta map value with the fallback programs at slot, without
// its name.
func (x *index) metaAt(slot uint32) gen.ClassifyClsMeta {
	m := x.meta
	if x.fallback {
		m.FallbackSlot = slot
	}
	return m
}

// mapBytes estimates the kernel memory of the index's maps: their keys and
// values (the kernel's per-entry overhead comes on top).
func (x *index) mapBytes() int {
	n := len(x.rules)*binary.Size(gen.ClassifyClsRule{}) + 4*len(x.items) + 8*len(x.ports)
	for side := range 2 {
		n += len(x.addr[side][0]) * (8 + 8)
		n += len(x.addr[side][1]) * (20 + 8)
	}
	return n
}

// classifier makes the program judging by x: fresh maps filled from x,
// the datapath's own for the rest. close releases this side's handles on
// the maps (the loaded program keeps them).
func (c *Compiler) classifier(x *index, fallbackSlot uint32) (*ebpf.ProgramSpec, func(), error) {
	spec, err := gen.LoadClassify()
	if err != nil {
		return nil, nil, err
	}
	var made []*ebpf.Map
	closeAll := func() {
		for _, m := range made {
			m.Close()
		}
	}
	newMap := func(name string, entries int) (*ebpf.Map, error) {
		ms := spec.Maps[name].Copy()
		if ms.Type != ebpf.Array || entries > int(ms.MaxEntries) {
			ms.MaxEntries = uint32(max(entries, 1))
		}
		m, err := ebpf.NewMap(ms)
		if err != nil {
			return nil, fmt.Errorf("classifier map %s (%d entries): %w", name, entries, err)
		}
		made = append(made, m)
		return m, nil
	}
	own := map[string]*ebpf.Map{}
	fill := func(name string, entries int, put func(m *ebpf.Map) error) error {
		m, err := newMap(name, entries)
		if err != nil {
			return err
		}
		own[name] = m
		if err := put(m); err != nil {
			return fmt.Errorf("classifier map %s: %w", name, err)
		}
		return nil
	}
	arr := func(vals any, n int) func(m *ebpf.Map) error {
		return func(m *ebpf.Map) error {
			if n == 0 {
				return nil
			}
			keys := make([]uint32, n)
			for i := range keys {
				keys[i] = uint32(i)
			}
			_, err := m.BatchUpdate(keys, vals, nil)
			return err
		}
	}
	// trie fills an address trie, its keys made by key (one family's).
	trie := func(t map[netip.Prefix]gen.ClassifyClsList, key func(netip.Prefix) any) func(m *ebpf.Map) error {
		return func(m *ebpf.Map) error {
			for n, v := range t {
				if err := m.Put(key(n), v); err != nil {
					return err
				}
			}
			return nil
		}
	}
	key4 := func(n netip.Prefix) any {
		return gen.ClassifyClsAddr4Key{Prefixlen: uint32(n.Bits()), Addr: n.Addr().As4()}
	}
	key6 := func(n netip.Prefix) any {
		return gen.ClassifyClsAddr6Key{Prefixlen: uint32(n.Bits()), Addr: n.Addr().As16()}
	}
	err = errors.Join(
		fill(gen.ClassifyMapClsMetaMap, 1, arr([]gen.ClassifyClsMeta{named(x.metaAt(fallbackSlot), x.name(fallbackSlot))}, 1)),
		fill(gen.ClassifyMapClsRulesMap, len(x.rules), arr(x.rules, len(x.rules))),
		fill(gen.ClassifyMapClsItems, len(x.items), arr(x.items, len(x.items))),
		fill(gen.ClassifyMapClsPorts, len(x.ports), arr(x.ports, len(x.ports))),
		fill(gen.ClassifyMapClsSrc4, len(x.addr[0][0]), trie(x.addr[0][0], key4)),
		fill(gen.ClassifyMapClsDst4, len(x.addr[1][0]), trie(x.addr[1][0], key4)),
		fill(gen.ClassifyMapClsSrc6, len(x.addr[0][1]), trie(x.addr[0][1], key6)),
		fill(gen.ClassifyMapClsDst6, len(x.addr[1][1]), trie(x.addr[1][1], key6)),
	)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	shared := map[string]*ebpf.Map{
		gen.ClassifyMapSlPolprogV1:  c.Maps.Programs,
		gen.ClassifyMapSlRulectrV1:  c.Maps.RuleCounters,
		gen.ClassifyMapSlIpsetV1:    c.Maps.IPSets,
		gen.ClassifyMapSlIpset6V1:   c.Maps.IPSets6,
		gen.ClassifyMapSlScratch6V1: c.Maps.Scratch6,
	}
	prog := spec.Programs[gen.ClassifyProgSlPolicyClassify].Copy()
	for i := range prog.Instructions {
		ins := &prog.Instructions[i]
		if !ins.IsLoadFromMap() {
			continue
		}
		ref := ins.Reference()
		m := own[ref]
		if m == nil {
			m = shared[ref]
		}
		if m == nil {
			closeAll()
			return nil, nil, fmt.Errorf("classifier: no map for %q", ref)
		}
		if err := ins.AssociateMap(m); err != nil {
			closeAll()
			return nil, nil, err
		}
	}
	prog.Name = x.name(fallbackSlot)
	return prog, closeAll, nil
}
