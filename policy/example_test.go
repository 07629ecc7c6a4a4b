package policy_test

import (
	"fmt"
	"log"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/policy"
)

// Compile a policy and judge a packet with the compiled program through
// BPF_PROG_TEST_RUN, the same code the datapath tail-calls for a new flow.
// The programs go in the program array from slot 1 (slot 0 is the
// datapath's verdict program). It needs BPF privileges.
func ExampleRun() {
	objs, err := gen.Load(gen.LoadOptions{}) // the datapath, with private maps
	if err != nil {
		log.Fatal(err)
	}
	defer objs.Close()
	maps := policy.Maps{Programs: objs.SlPolprogV1, IPSets: objs.SlIpsetV1, RuleCounters: objs.SlRulectrV1}
	web := &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "default", DefaultAction: policy.Deny,
		Policies: []policy.Policy{{Name: "http-from-clients", Rules: []policy.Rule{{ID: 7, Action: policy.Allow,
			Protocol: 6, SrcNets: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")},
			DstPorts: []policy.PortRange{{First: 8080, Last: 8080}}}}}}}}}
	specs, err := (&policy.Compiler{Maps: maps}).Compile("web", web, 1)
	if err != nil {
		log.Fatal(err)
	}
	var entry *ebpf.Program
	for i, spec := range specs {
		prog, err := ebpf.NewProgram(spec)
		if err != nil {
			log.Fatal(err)
		}
		defer prog.Close()
		if err := maps.Programs.Put(uint32(1+i), prog); err != nil {
			log.Fatal(err)
		}
		if i == 0 {
			entry = prog
		}
	}
	for _, src := range []string{"10.200.0.2", "10.99.0.2"} {
		allowed, rule, err := policy.Run(entry, policy.Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr("10.201.0.2"),
			Protocol: 6, SrcPort: 40000, DstPort: 8080}, true)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("from %s: allowed %v by rule %#x\n", src, allowed, rule)
	}
}

// The example, run and checked (it needs privileges, so it is no Go example
// with an Output comment).
func TestExampleRun(t *testing.T) {
	bpftest.Require(t)
	got := bpftest.Stdout(t, ExampleRun)
	want := "from 10.200.0.2: allowed true by rule 0x7\nfrom 10.99.0.2: allowed false by rule 0xffff0000\n"
	if got != want {
		t.Fatalf("the example printed\n%s\nwant\n%s", got, want)
	}
}
