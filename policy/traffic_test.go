package policy_test

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/policy"
)

func ifindex(t *testing.T, ns *bpftest.NetNS, name string) uint32 {
	var idx int
	if err := ns.Do(func() error {
		ifc, err := net.InterfaceByName(name)
		if ifc != nil {
			idx = ifc.Index
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return uint32(idx)
}

func dial(ns *bpftest.NetNS, addr string) (net.Conn, error) {
	return dialWithin(ns, addr, 400*time.Millisecond)
}

// dialWithin dials with a timeout of its own. A connection that must be
// made (the first in a new topology, under CI's load) gets long enough for
// a retransmitted SYN; one a policy may drop keeps dial's short wait.
func dialWithin(ns *bpftest.NetNS, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() (err error) { c, err = net.DialTimeout("tcp", addr, timeout); return err })
	return c, err
}

func ask(c net.Conn) error {
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprintln(c, "hi"); err != nil {
		return err
	}
	buf := make([]byte, 128)
	_, err := c.Read(buf)
	return err
}

// policyTraffic is a node with a client and a server pod behind veths, the
// datapath attached, and a policy runtime on its maps. The server listens
// on 8080 and 9090.
type policyTraffic struct {
	dp                 *bpftest.Datapath
	topo               *bpftest.Topology
	rt                 *policy.Runtime
	client             *bpftest.NetNS
	server             string
	serverIf, clientIf gen.SluiceIfstateKey
}

const noSlot = 0xffffffff

func newPolicyTraffic(t *testing.T) *policyTraffic {
	dp := bpftest.NewDatapath(t, netip.MustParseAddr("10.210.0.1"))
	topo := bpftest.NewTopology(t, dp, "client", "server")
	maps := policy.Maps{Programs: dp.Objs.SlPolprogV1, IPSets: dp.Objs.SlIpsetV1, RuleCounters: dp.Objs.SlRulectrV1,
		IPSets6: dp.Objs.SlIpset6V1, Scratch6: dp.Objs.SlScratch6V1}
	rt, err := policy.NewRuntime(maps, dp.Objs.SlPolicyVerdict, 0)
	if err != nil {
		t.Fatal(err)
	}
	bpftest.ServeTCP(t, topo.Pods["server"], "server", ":8080")
	bpftest.ServeTCP(t, topo.Pods["server"], "server", ":9090")
	return &policyTraffic{dp: dp, topo: topo, rt: rt, client: topo.Pods["client"], server: topo.PodIP["server"].String(),
		serverIf: gen.SluiceIfstateKey{Ifindex: ifindex(t, topo.Node, topo.PodIface["server"])},
		clientIf: gen.SluiceIfstateKey{Ifindex: ifindex(t, topo.Node, topo.PodIface["client"])}}
}

// setSlots points an interface at policy slots (noSlot: none).
func (p *policyTraffic) setSlots(k gen.SluiceIfstateKey, ingress, egress uint32) {
	p.dp.Put(p.dp.Objs.SlIfstateV1, k, gen.SluiceIfstateValue{Flags: gen.SluiceIfstateFlagsIFS_WORKLOAD | gen.SluiceIfstateFlagsIFS_READY,
		IngressPolicy: ingress, EgressPolicy: egress})
}

// install installs a policy and fails the test if it cannot.
func (p *policyTraffic) install(t *testing.T, name string, ep *policy.EndpointPolicy) uint32 {
	t.Helper()
	slot, err := p.rt.Install(name, ep)
	if err != nil {
		t.Fatal(err)
	}
	return slot
}

func denyAll() *policy.EndpointPolicy {
	return &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "default", DefaultAction: policy.Deny}}}
}

// A default deny refuses new connections and counts the drops; a flow keeps
// the verdict it was given when it started (documented), whether a policy
// judged it or there was none: every flow is tracked from its first packet.
func TestDefaultDenyRefusesNewFlowsKeepsStartedOnes(t *testing.T) {
	p := newPolicyTraffic(t)
	before, err := dial(p.client, p.server+":9090") // no policy to judge it
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	allowAll := &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "default", DefaultAction: policy.Deny,
		Policies: []policy.Policy{{Name: "all", Rules: []policy.Rule{{ID: 1, Action: policy.Allow}}}}}}}
	slot0 := p.install(t, "server-ingress-all", allowAll)
	p.setSlots(p.serverIf, slot0, noSlot)
	judged, err := dial(p.client, p.server+":9090") // judged and allowed
	if err != nil {
		t.Fatal(err)
	}
	defer judged.Close()
	if err := ask(judged); err != nil {
		t.Fatal(err)
	}

	p.setSlots(p.serverIf, p.install(t, "server-ingress-deny", denyAll()), noSlot)
	p.rt.Remove(slot0)
	delivered := p.dp.Counter(gen.SluiceCounterCNT_LOCAL_DELIVERED)
	if c, err := dial(p.client, p.server+":8080"); err == nil {
		c.Close()
		t.Fatal("default deny let a new connection through")
	}
	if p.dp.Counter(gen.SluiceCounterCNT_DROP_POLICY) == 0 {
		t.Fatal("policy drops not counted")
	}
	// The SYNs were handed to the server's interface by the datapath, past
	// the node's stack (local delivery), and its ingress policy still
	// judged them there.
	if p.dp.Counter(gen.SluiceCounterCNT_LOCAL_DELIVERED) == delivered {
		t.Fatal("the denied SYNs did not go by local delivery")
	}
	if err := ask(judged); err != nil {
		t.Fatalf("allowed connection cut by a later policy: %v", err)
	}
	if err := ask(before); err != nil {
		t.Fatalf("connection from before any policy cut by a later policy: %v", err)
	}
}

// A rule allowing one port: that port is reached, another is not, and the
// rule counts each new flow once (established packets are not judged again).
func TestAllowedPortOnlyAndItsRuleCounted(t *testing.T) {
	p := newPolicyTraffic(t)
	allow8080 := &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "default", DefaultAction: policy.Deny,
		Policies: []policy.Policy{{Name: "web", Rules: []policy.Rule{{ID: 42, Action: policy.Allow, Protocol: 6,
			DstPorts: []policy.PortRange{{8080, 8080}}}}}}}}}
	p.setSlots(p.serverIf, p.install(t, "server-ingress-web", allow8080), noSlot)
	c, err := dial(p.client, p.server+":8080")
	if err != nil {
		t.Fatalf("allowed port refused: %v", err)
	}
	for range 3 {
		if err := ask(c); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	if c, err := dial(p.client, p.server+":9090"); err == nil {
		c.Close()
		t.Fatal("a port the policy does not allow was reached")
	}
	var hits []uint64
	if err := p.dp.Objs.SlRulectrV1.Lookup(gen.SluiceRulectrKey{RuleId: 42}, &hits); err != nil {
		t.Fatalf("rule 42 counter: %v", err)
	}
	total := uint64(0)
	for _, h := range hits {
		total += h
	}
	if total != 1 {
		t.Fatalf("rule 42 counted %d new flows, want 1", total)
	}
}

// Egress is judged after the service NAT: a client that may not reach the
// server's address may not reach it through a ClusterIP either.
func TestEgressJudgedAfterServiceNAT(t *testing.T) {
	p := newPolicyTraffic(t)
	vip := netip.MustParseAddrPort("10.96.0.10:80")
	p.dp.AddService(bpftest.Service{ID: 1, Front: vip, Proto: bpftest.ProtoTCP,
		Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(p.topo.PodIP["server"], 8080), Local: true}}})
	if c, err := dial(p.client, vip.String()); err != nil {
		t.Fatalf("service before the egress policy: %v", err)
	} else {
		c.Close()
	}
	noServer := &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "default", DefaultAction: policy.Deny,
		Policies: []policy.Policy{{Name: "p", Rules: []policy.Rule{
			{ID: 7, Action: policy.Deny, DstNets: []netip.Prefix{netip.PrefixFrom(p.topo.PodIP["server"], 32)}},
			{ID: 8, Action: policy.Allow},
		}}}}}}
	p.setSlots(p.clientIf, noSlot, p.install(t, "client-egress", noServer))
	if c, err := dial(p.client, vip.String()); err == nil {
		c.Close()
		t.Fatal("egress policy on the backend's address did not apply to the service")
	}
}
