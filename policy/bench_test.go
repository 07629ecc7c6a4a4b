package policy_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/policy"
)

// worstCase: n rules, only the last of which matches port 80, so a new flow
// to port 80 walks them all. With IP sets each rule also looks its
// destination up in a set.
func worstCase(n int, ipsets bool) *policy.EndpointPolicy {
	rules := make([]policy.Rule, n)
	for i := range n - 1 {
		rules[i] = policy.Rule{ID: uint32(i + 1), Action: policy.Allow, Protocol: 6,
			DstPorts: []policy.PortRange{{uint16(1000 + i%30000), uint16(1000 + i%30000)}}}
		if ipsets {
			rules[i].DstIPSets = []uint32{uint32(1 + i%16)}
		} else {
			rules[i].DstNets = []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.%d.0.0/16", i%250))}
		}
	}
	rules[n-1] = policy.Rule{ID: uint32(n), Action: policy.Allow, Protocol: 6, DstPorts: []policy.PortRange{{80, 80}}}
	return oneTier(rules...)
}

// BenchmarkNewFlowPolicy: ns per new flow's first packet through sl_from_wl
// (conntrack miss, identity flow, egress policy, verdict recorded), for
// policies of 10 to 100,000 rules, beside the same packets with no policy.
// Policies above policy.IndexedRules rules are judged by the classifier;
// the "rule-by-rule" cases are the same policies compiled without it, up to
// 10,000 rules (its programs cannot hold 100,000).
func BenchmarkNewFlowPolicy(b *testing.B) {
	var noPolicy float64
	run := func(b *testing.B, n int, ipsets, ruleByRule bool) {
		e := newEnv(b)
		sets := policy.IPSets{}
		for id := uint32(1); id <= 16; id++ {
			sets[id] = []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("172.%d.0.0/16", 16+id))}
		}
		e.setIPSets(sets)
		if n > 0 {
			rt, err := policy.NewRuntime(e.maps, e.dp.Objs.SlPolicyVerdict, 0)
			if err != nil {
				b.Fatal(err)
			}
			pol := worstCase(n, ipsets)
			c := policy.Compiler{Maps: e.maps, RuleByRule: ruleByRule}
			start := time.Now()
			slot := uint32(1)
			if ruleByRule {
				e.loadWith(c, pol, slot)
			} else if slot, err = rt.Install("bench", pol); err != nil {
				b.Fatal(err)
			}
			installed := time.Since(start)
			st, err := c.Stats("bench", pol)
			if err != nil {
				b.Fatal(err)
			}
			// After the timed loop, which resets what was reported before it.
			defer func() {
				b.ReportMetric(float64(installed.Milliseconds()), "install-ms")
				b.ReportMetric(float64(st.IndexBytes)/1e6, "index-MB")
				b.ReportMetric(float64(st.Programs), "programs")
			}()
			// BPF_PROG_TEST_RUN runs on the loopback device: ifindex 1.
			e.dp.Put(e.dp.Objs.SlIfstateV1, gen.SluiceIfstateKey{Ifindex: 1},
				gen.SluiceIfstateValue{Flags: gen.SluiceIfstateFlagsIFS_WORKLOAD, IngressPolicy: 0xffffffff, EgressPolicy: slot})
		}
		tmpl := bpftest.TCPPacket(netip.MustParseAddrPort("10.200.0.2:1000"), netip.MustParseAddrPort("10.201.0.2:80"), bpftest.SYN)
		var total time.Duration
		i := 0
		for b.Loop() {
			f := tmpl
			f[14+13], f[14+14], f[14+15] = byte(i>>16), byte(i>>8), byte(i)
			ret, dur, err := e.dp.Objs.SlFromWl.Benchmark(f, 1, nil)
			if err != nil || ret != 0 {
				b.Fatalf("verdict %d: %v", ret, err)
			}
			total += dur
			i++
		}
		ns := float64(total.Nanoseconds()) / float64(i)
		b.ReportMetric(ns, "ns/packet")
		if n == 0 {
			noPolicy = ns
		} else if noPolicy > 0 {
			b.ReportMetric(ns/noPolicy, "x-no-policy")
		}
	}
	b.Run("no-policy", func(b *testing.B) { run(b, 0, false, false) })
	for _, n := range []int{10, 100, 1000, 10000, 100000} {
		b.Run(fmt.Sprintf("rules=%d/cidr", n), func(b *testing.B) { run(b, n, false, false) })
		b.Run(fmt.Sprintf("rules=%d/ipsets", n), func(b *testing.B) { run(b, n, true, false) })
		if n > policy.IndexedRules && n <= 10000 {
			b.Run(fmt.Sprintf("rules=%d/cidr-rule-by-rule", n), func(b *testing.B) { run(b, n, false, true) })
			b.Run(fmt.Sprintf("rules=%d/ipsets-rule-by-rule", n), func(b *testing.B) { run(b, n, true, true) })
		}
	}
}
