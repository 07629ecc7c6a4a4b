package policy_test

import (
	"net/netip"
	"testing"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/policy"
)

// A protocol the datapath neither balances nor tracks (SCTP, GRE) is still
// judged by an isolated workload's policy, in both directions, through the
// real entry programs: a default deny drops it, rules without ports for the
// peer let it through, and rules with ports do not match it.
func TestOtherProtocolsAreJudgedAtWorkloads(t *testing.T) {
	e := newEnv(t)
	rt, err := policy.NewRuntime(e.maps, e.dp.Objs.SlPolicyVerdict, 0)
	if err != nil {
		t.Fatal(err)
	}
	peer := netip.MustParsePrefix("10.0.9.9/32")
	policies := map[string]*policy.EndpointPolicy{
		"deny all": {Tiers: []policy.Tier{{Name: "t", DefaultAction: policy.Deny}}},
		"allow the peer": {Tiers: []policy.Tier{{Name: "t", DefaultAction: policy.Deny, Policies: []policy.Policy{{Name: "p",
			Rules: []policy.Rule{{ID: 1, Action: policy.Allow, SrcNets: []netip.Prefix{peer}}, {ID: 3, Action: policy.Allow, DstNets: []netip.Prefix{peer}}}}}}}},
		"allow the peer on TCP 80": {Tiers: []policy.Tier{{Name: "t", DefaultAction: policy.Deny, Policies: []policy.Policy{{Name: "p",
			Rules: []policy.Rule{{ID: 2, Action: policy.Allow, Protocol: 6, DstPorts: []policy.PortRange{{First: 80, Last: 80}}, SrcNets: []netip.Prefix{peer}},
				{ID: 4, Action: policy.Allow, Protocol: 6, DstPorts: []policy.PortRange{{First: 80, Last: 80}}, DstNets: []netip.Prefix{peer}}}}}}}},
	}
	allowed := map[string]bool{"deny all": false, "allow the peer": true, "allow the peer on TCP 80": false}
	pod, other := netip.MustParseAddrPort("10.0.1.2:0"), netip.MustParseAddrPort("10.0.9.9:0")
	frame := func(src, dst netip.AddrPort, proto byte) []byte {
		f := bpftest.UDPPacket(src, dst, []byte("0123456789abcdef"))
		f[14+9] = proto // the same bytes, another protocol: what follows the IP header is not parsed
		return f
	}
	for name, p := range policies {
		slot, err := rt.Install(name, p)
		if err != nil {
			t.Fatal(err)
		}
		// BPF_PROG_TEST_RUN runs on the loopback device: it is the
		// workload's interface here, in both directions.
		e.dp.Put(e.dp.Objs.SlIfstateV1, gen.SluiceIfstateKey{Ifindex: 1},
			gen.SluiceIfstateValue{Flags: gen.SluiceIfstateFlagsIFS_WORKLOAD | gen.SluiceIfstateFlagsIFS_READY, IngressPolicy: slot, EgressPolicy: slot})
		for _, proto := range []struct {
			name   string
			number byte
		}{{"SCTP", 132}, {"GRE", 47}} {
			for _, dir := range []struct {
				name     string
				src, dst netip.AddrPort
				prog     string
			}{{"into the pod", other, pod, "to"}, {"out of the pod", pod, other, "from"}} {
				prog := e.dp.Objs.SlToWl
				if dir.prog == "from" {
					prog = e.dp.Objs.SlFromWl
				}
				ret, _ := e.dp.Run(prog, frame(dir.src, dir.dst, proto.number))
				if got := ret == bpftest.ActOK; got != allowed[name] {
					t.Errorf("%s, %s %s: verdict %d, want allowed %v", name, proto.name, dir.name, ret, allowed[name])
				}
			}
		}
		rt.Remove(slot)
	}
}
