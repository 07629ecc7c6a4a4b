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
	var c net.Conn
	err := ns.Do(func() (err error) { c, err = net.DialTimeout("tcp4", addr, 400*time.Millisecond); return err })
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

func TestPolicyOnRealTraffic(t *testing.T) {
	dp := bpftest.NewDatapath(t, netip.MustParseAddr("10.210.0.1"))
	topo := bpftest.NewTopology(t, dp, "client", "server")
	maps := policy.Maps{Programs: dp.Objs.SlPolprogV1, IPSets: dp.Objs.SlIpsetV1, RuleCounters: dp.Objs.SlRulectrV1}
	rt, err := policy.NewRuntime(maps, dp.Objs.SlPolicyVerdict, 0)
	if err != nil {
		t.Fatal(err)
	}
	server := topo.PodIP["server"].String()
	bpftest.ServeTCP(t, topo.Pods["server"], "server", ":8080")
	bpftest.ServeTCP(t, topo.Pods["server"], "server", ":9090")
	serverIf := gen.SluiceIfstateKey{Ifindex: ifindex(t, topo.Node, topo.PodIface["server"])}
	clientIf := gen.SluiceIfstateKey{Ifindex: ifindex(t, topo.Node, topo.PodIface["client"])}
	setSlots := func(k gen.SluiceIfstateKey, ingress, egress uint32) {
		dp.Put(dp.Objs.SlIfstateV1, k, gen.SluiceIfstateValue{Flags: gen.SluiceIfstateFlagsIFS_WORKLOAD | gen.SluiceIfstateFlagsIFS_READY,
			IngressPolicy: ingress, EgressPolicy: egress})
	}
	const none = 0xffffffff
	client := topo.Pods["client"]

	// Before any policy: a connection tracked with no policy to judge it.
	before, err := dial(client, server+":9090")
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	// Under an allow-all policy: a connection judged and allowed.
	allowAll := &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "default", DefaultAction: policy.Deny,
		Policies: []policy.Policy{{Name: "all", Rules: []policy.Rule{{ID: 1, Action: policy.Allow}}}}}}}
	slot0, err := rt.Install("server-ingress-all", allowAll)
	if err != nil {
		t.Fatal(err)
	}
	setSlots(serverIf, slot0, none)
	old, err := dial(client, server+":9090")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := ask(old); err != nil {
		t.Fatal(err)
	}

	// Default deny on the server's ingress.
	denyAll := &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "default", DefaultAction: policy.Deny}}}
	slot, err := rt.Install("server-ingress-deny", denyAll)
	if err != nil {
		t.Fatal(err)
	}
	setSlots(serverIf, slot, none)
	rt.Remove(slot0)
	if c, err := dial(client, server+":8080"); err == nil {
		c.Close()
		t.Fatal("default deny let a new connection through")
	}
	if dp.Counter(gen.SluiceCounterCNT_DROP_POLICY) == 0 {
		t.Fatal("policy drops not counted")
	}
	// A flow keeps the verdict it was given when it started (documented),
	// whether a policy judged it or there was none: every flow is tracked
	// from its first packet.
	if err := ask(old); err != nil {
		t.Fatalf("allowed connection cut by a later policy: %v", err)
	}
	if err := ask(before); err != nil {
		t.Fatalf("connection from before any policy cut by a later policy: %v", err)
	}

	// Allow TCP 8080 only.
	allow8080 := &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "default", DefaultAction: policy.Deny,
		Policies: []policy.Policy{{Name: "web", Rules: []policy.Rule{{ID: 42, Action: policy.Allow, Protocol: 6,
			DstPorts: []policy.PortRange{{8080, 8080}}}}}}}}}
	slot2, err := rt.Install("server-ingress-web", allow8080)
	if err != nil {
		t.Fatal(err)
	}
	setSlots(serverIf, slot2, none)
	rt.Remove(slot)
	c, err := dial(client, server+":8080")
	if err != nil {
		t.Fatalf("allowed port refused: %v", err)
	}
	if err := ask(c); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if c, err := dial(client, server+":9090"); err == nil {
		c.Close()
		t.Fatal("a port the policy does not allow was reached")
	}
	var hits []uint64
	if err := dp.Objs.SlRulectrV1.Lookup(gen.SluiceRulectrKey{RuleId: 42}, &hits); err != nil {
		t.Fatalf("rule 42 counter: %v", err)
	}
	total := uint64(0)
	for _, h := range hits {
		total += h
	}
	if total != 1 {
		t.Fatalf("rule 42 counted %d new flows, want 1 (established packets are not judged again)", total)
	}

	// Egress, judged after the service NAT: the client may not reach the
	// server's address, whether directly or through a ClusterIP.
	vip := netip.MustParseAddrPort("10.96.0.10:80")
	dp.AddService(bpftest.Service{ID: 1, Front: vip, Proto: bpftest.ProtoTCP,
		Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(topo.PodIP["server"], 8080), Local: true}}})
	if c, err := dial(client, vip.String()); err != nil {
		t.Fatalf("service before the egress policy: %v", err)
	} else {
		c.Close()
	}
	noServer := &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "default", DefaultAction: policy.Deny,
		Policies: []policy.Policy{{Name: "p", Rules: []policy.Rule{
			{ID: 7, Action: policy.Deny, DstNets: []netip.Prefix{netip.PrefixFrom(topo.PodIP["server"], 32)}},
			{ID: 8, Action: policy.Allow},
		}}}}}}
	eslot, err := rt.Install("client-egress", noServer)
	if err != nil {
		t.Fatal(err)
	}
	setSlots(clientIf, none, eslot)
	if c, err := dial(client, vip.String()); err == nil {
		c.Close()
		t.Fatal("egress policy on the backend's address did not apply to the service")
	}
}
