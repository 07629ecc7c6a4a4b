package policy_test

import (
	"net/netip"
	"testing"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/policy"
)

// A protocol the datapath neither balances nor tracks (GRE, ESP) is still
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
		}{{"GRE", 47}, {"ESP", 50}} {
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

// SCTP rules with ports match ports, as TCP's and UDP's do, in the compiled
// rules and in the classifier alike (a policy of more rules than
// IndexedRules takes it): an SCTP packet to the port is allowed, one to
// another port and a TCP one to the port are not. Each packet starts a
// flow of its own (conntrack emptied), so no earlier verdict answers it.
func TestSCTPRulePortsMatchPorts(t *testing.T) {
	e := newEnv(t)
	rt, err := policy.NewRuntime(e.maps, e.dp.Objs.SlPolicyVerdict, 0)
	if err != nil {
		t.Fatal(err)
	}
	peer := netip.MustParsePrefix("10.0.9.9/32")
	pod := netip.MustParseAddr("10.0.1.2")
	allowDiameter := policy.Rule{ID: 1, Action: policy.Allow, Protocol: 132, DstPorts: []policy.PortRange{{First: 3868, Last: 3868}}, SrcNets: []netip.Prefix{peer}}
	small := []policy.Rule{allowDiameter}
	large := []policy.Rule{allowDiameter}
	for i := range policy.IndexedRules + 8 {
		// Rules on other ports and peers, to make the policy classified.
		large = append(large, policy.Rule{ID: uint32(10 + i), Action: policy.Allow, Protocol: 6,
			DstPorts: []policy.PortRange{{First: uint16(20000 + i), Last: uint16(20000 + i)}}, SrcNets: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}})
	}
	for name, rules := range map[string][]policy.Rule{"compiled": small, "classified": large} {
		t.Run(name, func(t *testing.T) {
			slot, err := rt.Install(name, &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "t", DefaultAction: policy.Deny,
				Policies: []policy.Policy{{Name: "p", Rules: rules}}}}})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Remove(slot)
			e.dp.Put(e.dp.Objs.SlIfstateV1, gen.SluiceIfstateKey{Ifindex: 1},
				gen.SluiceIfstateValue{Flags: gen.SluiceIfstateFlagsIFS_WORKLOAD | gen.SluiceIfstateFlagsIFS_READY, IngressPolicy: slot, EgressPolicy: slot})
			src := netip.AddrPortFrom(peer.Addr(), 40000)
			for _, c := range []struct {
				what  string
				frame []byte
				allow bool
			}{
				{"SCTP to 3868", bpftest.SCTPPacket(src, netip.AddrPortFrom(pod, 3868), bpftest.SCTPInit, make([]byte, 16)), true},
				{"SCTP to 3869", bpftest.SCTPPacket(src, netip.AddrPortFrom(pod, 3869), bpftest.SCTPInit, make([]byte, 16)), false},
				{"TCP to 3868", bpftest.TCPPacket(src, netip.AddrPortFrom(pod, 3868), bpftest.SYN), false},
			} {
				e.dp.ClearConntrack()
				ret, _ := e.dp.Run(e.dp.Objs.SlToWl, c.frame)
				if got := ret == bpftest.ActOK; got != c.allow {
					t.Errorf("%s: verdict %d, want allowed %v", c.what, ret, c.allow)
				}
			}
		})
	}
}
