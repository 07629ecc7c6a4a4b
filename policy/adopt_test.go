package policy_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/policy"
)

// A runtime started over a pinned program array a previous one filled (an
// agent restart) keeps the slots live interfaces point to: new policies go
// elsewhere, an unchanged policy is recognised by its code and kept, and
// programs nothing points to are removed (those right after a policy in use
// are taken as its own, and go with it).
func TestRuntimeAdoptsTheSlotsInUse(t *testing.T) {
	dp := bpftest.NewDatapath(t, netip.MustParseAddr("10.210.0.1"))
	maps := policy.Maps{Programs: dp.Objs.SlPolprogV1, IPSets: dp.Objs.SlIpsetV1, RuleCounters: dp.Objs.SlRulectrV1}
	allow := func(port uint16) *policy.EndpointPolicy {
		return &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "default", DefaultAction: policy.Deny,
			Policies: []policy.Policy{{Name: "p", Rules: []policy.Rule{{ID: 1, Action: policy.Allow, Protocol: 6,
				DstPorts: []policy.PortRange{{First: port, Last: port}}}}}}}}}
	}
	before, err := policy.NewRuntime(maps, dp.Objs.SlPolicyVerdict, 1)
	if err != nil {
		t.Fatal(err)
	}
	a, err := before.Install("a", allow(80))
	if err != nil {
		t.Fatal(err)
	}
	gone, err := before.Install("gone", allow(79))
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := before.Install("orphan", allow(81))
	if err != nil {
		t.Fatal(err)
	}
	b, err := before.Install("b", allow(82))
	if err != nil {
		t.Fatal(err)
	}
	before.Remove(gone) // an empty slot before orphan: a run of its own

	// The restart: a new runtime on the same array, told which entry slots
	// the interfaces use (a and b; nothing points to orphan any more).
	after, err := policy.NewRuntime(maps, dp.Objs.SlPolicyVerdict, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := after.Adopt([]uint32{a, b}); err != nil {
		t.Fatal(err)
	}
	var id uint32
	if err := maps.Programs.Lookup(orphan, &id); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("the orphan policy's slot %d: %v, want it emptied", orphan, err)
	}
	if !after.Matches("a", allow(80), a) || !after.Matches("b", allow(82), b) {
		t.Fatal("unchanged policies not recognised in their adopted slots")
	}
	if after.Matches("a", allow(8080), a) || after.Matches("b", allow(80), b) {
		t.Fatal("a changed policy matched the programs of the old one")
	}
	c, err := after.Install("c", allow(83))
	if err != nil {
		t.Fatal(err)
	}
	if c == a || c == b {
		t.Fatalf("a new policy took slot %d, still used by an interface (a %d, b %d)", c, a, b)
	}
	// The freed orphan slot is reused; a's slot is freed once released.
	after.Remove(a)
	if err := maps.Programs.Lookup(a, &id); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("slot %d after Remove: %v", a, err)
	}
}

// A restarted agent recognises a policy the classifier judges, as it does a
// rule-by-rule one: its program is named after its tables, built the same
// way each time; a changed policy is not taken for it.
func TestRuntimeRecognisesAClassifierPolicy(t *testing.T) {
	dp := bpftest.NewDatapath(t, netip.MustParseAddr("10.210.0.1"))
	maps := policy.Maps{Programs: dp.Objs.SlPolprogV1, IPSets: dp.Objs.SlIpsetV1, RuleCounters: dp.Objs.SlRulectrV1,
		IPSets6: dp.Objs.SlIpset6V1, Scratch6: dp.Objs.SlScratch6V1}
	big := func(lastPort uint16) *policy.EndpointPolicy {
		var rules []policy.Rule
		for i := range 500 {
			// Rules by destination CIDR (many prefixes: the trie's order
			// must not follow map iteration) and by port.
			r := policy.Rule{ID: uint32(i + 1), Action: policy.Allow, Protocol: 6}
			if i%2 == 0 {
				r.DstNets = []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)}
			} else {
				r.DstPorts = []policy.PortRange{{First: uint16(1000 + i), Last: uint16(1000 + i)}}
			}
			rules = append(rules, r)
		}
		rules[len(rules)-1].DstPorts = []policy.PortRange{{First: lastPort, Last: lastPort}}
		return oneTier(rules...)
	}
	before, err := policy.NewRuntime(maps, dp.Objs.SlPolicyVerdict, 0)
	if err != nil {
		t.Fatal(err)
	}
	slot, err := before.Install("big", big(80))
	if err != nil {
		t.Fatal(err)
	}
	after, err := policy.NewRuntime(maps, dp.Objs.SlPolicyVerdict, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := after.Adopt([]uint32{slot}); err != nil {
		t.Fatal(err)
	}
	if !after.Matches("big", big(80), slot) {
		t.Fatal("the unchanged classifier policy was not recognised")
	}
	if after.Matches("big", big(81), slot) {
		t.Fatal("a changed classifier policy matched the old one's program")
	}
}
