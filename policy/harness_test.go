package policy_test

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/policy"
)

type env struct {
	tb   testing.TB
	dp   *bpftest.Datapath
	maps policy.Maps
}

func newEnv(tb testing.TB) *env {
	dp := bpftest.NewDatapath(tb, netip.MustParseAddr("10.0.0.1"))
	return &env{tb: tb, dp: dp, maps: policy.Maps{Programs: dp.Objs.SlPolprogV1, IPSets: dp.Objs.SlIpsetV1, RuleCounters: dp.Objs.SlRulectrV1,
		IPSets6: dp.Objs.SlIpset6V1, Scratch6: dp.Objs.SlScratch6V1}}
}

// load compiles p into slots 1.. and returns the entry program (a policy of
// more than policy.IndexedRules rules: the classifier).
func (e *env) load(p *policy.EndpointPolicy, perProgram int) *ebpf.Program {
	e.tb.Helper()
	return e.loadWith(policy.Compiler{Maps: e.maps, RulesPerProgram: perProgram}, p, 1)
}

// loadWith is load with a compiler of the test's, into slots first...
func (e *env) loadWith(c policy.Compiler, p *policy.EndpointPolicy, first uint32) *ebpf.Program {
	e.tb.Helper()
	specs, err := c.Compile("test", p, first)
	if err != nil {
		e.tb.Fatal(err)
	}
	var entry *ebpf.Program
	for i, s := range specs {
		prog, err := ebpf.NewProgram(s)
		if err != nil {
			e.tb.Fatalf("load program %d: %v", i, err)
		}
		if err := e.maps.Programs.Put(first+uint32(i), prog); err != nil {
			e.tb.Fatal(err)
		}
		if i == 0 {
			entry = prog
			e.tb.Cleanup(func() { entry.Close() })
		} else {
			prog.Close()
		}
	}
	return entry
}

func (e *env) setIPSets(sets policy.IPSets) {
	for id, members := range sets {
		for _, m := range members {
			if m.Addr().Is6() {
				k := gen.SluiceIpset6Key{Prefixlen: 32 + uint32(m.Bits()), SetId: gen.NetUint32(id), Addr: gen.NetAddr6(m.Masked().Addr())}
				e.dp.Put(e.dp.Objs.SlIpset6V1, k, gen.SluiceIpsetValue{})
				continue
			}
			k := gen.SluiceIpsetKey{Prefixlen: 32 + uint32(m.Bits()), SetId: gen.NetUint32(id), Addr: gen.NetAddr(m.Masked().Addr())}
			e.dp.Put(e.dp.Objs.SlIpsetV1, k, gen.SluiceIpsetValue{})
		}
	}
}

// run evaluates pkt with prog and returns (allowed, rule id).
func (e *env) run(prog *ebpf.Program, pkt policy.Packet, ingress bool) (bool, uint32) {
	e.tb.Helper()
	allowed, rule, err := e.maps.Run(prog, pkt, ingress)
	if err != nil {
		e.tb.Fatal(err)
	}
	return allowed, rule
}
