package policy_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/policy"
)

// TestHostEndpointPolicyOnADataInterface over IPv6: the same host policies
// judge the external host's IPv6 traffic to the node and to an IPv6
// NodePort (before DNAT), the failsafe port, and the node's own IPv6
// connections.
func TestIPv6HostEndpointPolicyOnADataInterface(t *testing.T) {
	p := newPolicyTraffic(t)
	dp, topo := p.dp, p.topo
	topo.EnableIPv6(t)
	node, ext := topo.Node, topo.External
	const failsafePort = 2222
	dp.Put(dp.Objs.SlFailsafeV1, gen.SluiceFailsafeKey{Proto: 6, Port: gen.NetPort(failsafePort)}, gen.SluiceFailsafeValue{})
	bpftest.ServeTCP(t, node, "node", "[fd00:210::1]:8080")
	bpftest.ServeTCP(t, node, "node", "[fd00:210::1]:2222")
	bpftest.ServeTCP(t, ext, "ext", "[::]:8080")
	bpftest.ServeTCP(t, ext, "ext", "[::]:9090")
	bpftest.ServeTCP(t, topo.Pods["server"], "server6", "[::]:8080")
	np := netip.MustParseAddrPort("[fd00:210::1]:30080")
	dp.AddService(bpftest.Service{ID: 7, Front: np, Proto: bpftest.ProtoTCP, Flags: gen.SluiceFeFlagsFE_EXTERNAL,
		Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(topo.PodIP6["server"], 8080), Local: true}}})
	dataIf := gen.SluiceIfstateKey{Ifindex: ifindex(t, node, "sldata0")}
	hostSlots := func(hostIngress, hostEgress uint32) {
		dp.Put(dp.Objs.SlIfstateV1, dataIf, gen.SluiceIfstateValue{Flags: gen.SluiceIfstateFlagsIFS_DATA | gen.SluiceIfstateFlagsIFS_READY,
			IngressPolicy: hostEgress, EgressPolicy: hostIngress})
	}
	reach := func(ns *bpftest.NetNS, addr string) bool {
		c, err := dial(ns, addr)
		if err != nil {
			return false
		}
		defer c.Close()
		return ask(c) == nil
	}
	check := func(what string, got, want bool) {
		t.Helper()
		if got != want {
			t.Errorf("%s: reached %v, want %v", what, got, want)
		}
	}
	server6 := "[" + topo.PodIP6["server"].String() + "]:8080"

	kept, err := dialWithin(ext, "[fd00:210::1]:8080", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()

	hostSlots(p.install(t, "host-deny", denyAll()), noSlot)
	check("external to the node's own port under a deny-all", reach(ext, "[fd00:210::1]:8080"), false)
	check("external to the failsafe port under a deny-all", reach(ext, "[fd00:210::1]:2222"), true)
	check("external to an IPv6 NodePort under a deny-all (judged before DNAT)", reach(ext, np.String()), false)
	check("external straight to a pod (forwarded: not the host's)", reach(ext, server6), true)
	if err := ask(kept); err != nil {
		t.Errorf("a connection from before the host policy was cut: %v", err)
	}

	preDNAT := &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "host", DefaultAction: policy.Deny, Policies: []policy.Policy{{Name: "np",
		Rules: []policy.Rule{{ID: 30, Action: policy.Allow, Protocol: 6, DstPorts: []policy.PortRange{{First: 30080, Last: 30080}}}}}}}}}
	hostSlots(p.install(t, "host-nodeport", preDNAT), noSlot)
	check("external to the IPv6 NodePort allowed by its own port", reach(ext, np.String()), true)
	check("external to the node's 8080", reach(ext, "[fd00:210::1]:8080"), false)

	noNine := &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "host", DefaultAction: policy.Deny, Policies: []policy.Policy{{Name: "out",
		Rules: []policy.Rule{{ID: 40, Action: policy.Allow, Protocol: 6, DstPorts: []policy.PortRange{{First: 8080, Last: 8080}}}}}}}}}
	hostSlots(p.install(t, "host-deny-2", denyAll()), p.install(t, "host-out", noNine))
	check("the node to an allowed port, replies under an ingress deny-all", reach(node, "[fd00:210::2]:8080"), true)
	check("the node to a port its egress policy does not allow", reach(node, "[fd00:210::2]:9090"), false)
}
