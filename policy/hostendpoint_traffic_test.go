package policy_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/policy"
)

// Host endpoint policy on a data interface, on real traffic between an
// external host and the node: ingress judged for the node's own sockets and,
// before DNAT, for a NodePort; traffic forwarded to a pod is the pod's
// business; a deny-all cannot close the failsafe port; egress judged for the
// node's own connections, whose replies pass.
func TestHostEndpointPolicyOnADataInterface(t *testing.T) {
	p := newPolicyTraffic(t)
	dp, topo := p.dp, p.topo
	node, ext := topo.Node, topo.External
	const failsafePort = 2222
	dp.Put(dp.Objs.SlFailsafeV1, gen.SluiceFailsafeKey{Proto: 6, Port: gen.NetPort(failsafePort)}, gen.SluiceFailsafeValue{})
	bpftest.ServeTCP(t, node, "node", "10.210.0.1:8080")
	bpftest.ServeTCP(t, node, "node", "10.210.0.1:2222")
	bpftest.ServeTCP(t, ext, "ext", ":8080")
	bpftest.ServeTCP(t, ext, "ext", ":9090")
	np := netip.MustParseAddrPort("10.210.0.1:30080")
	dp.AddService(bpftest.Service{ID: 7, Front: np, Proto: bpftest.ProtoTCP, Flags: gen.SluiceFeFlagsFE_EXTERNAL,
		Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(topo.PodIP["server"], 8080), Local: true}}})
	dataIf := gen.SluiceIfstateKey{Ifindex: ifindex(t, node, "sldata0")}
	// ifstate names slots from a workload's side (ifstate.h): for a data
	// interface "egress" is the host endpoint's ingress, "ingress" its egress.
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

	// Established before any host policy: kept.
	kept, err := dialWithin(ext, "10.210.0.1:8080", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()

	hostSlots(p.install(t, "host-deny", denyAll()), noSlot)
	check("external to the node's own port under a deny-all", reach(ext, "10.210.0.1:8080"), false)
	check("external to the failsafe port under a deny-all", reach(ext, "10.210.0.1:2222"), true)
	check("external to a NodePort under a deny-all (judged before DNAT)", reach(ext, np.String()), false)
	check("external straight to a pod (forwarded: not the host's)", reach(ext, p.server+":8080"), true)
	if err := ask(kept); err != nil {
		t.Errorf("a connection from before the host policy was cut: %v", err)
	}
	if dp.Counter(gen.SluiceCounterCNT_DROP_POLICY) == 0 {
		t.Error("host policy drops not counted")
	}

	// Allowing the NodePort's own port admits it: the rule sees 30080, the
	// port the client sent to, not the backend's 8080.
	preDNAT := &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "host", DefaultAction: policy.Deny, Policies: []policy.Policy{{Name: "np",
		Rules: []policy.Rule{{ID: 30, Action: policy.Allow, Protocol: 6, DstPorts: []policy.PortRange{{First: 30080, Last: 30080}}}}}}}}}
	hostSlots(p.install(t, "host-nodeport", preDNAT), noSlot)
	check("external to the NodePort allowed by its own port", reach(ext, np.String()), true)
	check("external to the node's 8080, which only the backend listens behind", reach(ext, "10.210.0.1:8080"), false)

	// Egress: the node may reach the external host on 8080, not 9090; the
	// replies of what it may reach pass although ingress denies everything.
	noNine := &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "host", DefaultAction: policy.Deny, Policies: []policy.Policy{{Name: "out",
		Rules: []policy.Rule{{ID: 40, Action: policy.Allow, Protocol: 6, DstPorts: []policy.PortRange{{First: 8080, Last: 8080}}}}}}}}}
	hostSlots(p.install(t, "host-deny-2", denyAll()), p.install(t, "host-out", noNine))
	check("the node to an allowed port, replies under an ingress deny-all", reach(node, "10.210.0.2:8080"), true)
	check("the node to a port its egress policy does not allow", reach(node, "10.210.0.2:9090"), false)
}
