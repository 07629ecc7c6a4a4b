package policy_test

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/policy"
)

// A pod's policy judges its IPv6 flows as it judges IPv4 ones, on a
// dual-stack topology: CIDR and IP-set rules of both families, ingress and
// egress, after the service NAT, established flows kept, and neighbour
// discovery never judged (a pod under a deny-all egress policy still
// resolves its gateway, or the allowed connections below would fail).
func TestIPv6FlowsAreJudgedByThePodsPolicy(t *testing.T) {
	p := newPolicyTraffic(t)
	p.topo.EnableIPv6(t)
	bpftest.ServeTCP(t, p.topo.Pods["server"], "server6", "[::]:8080")
	bpftest.ServeTCP(t, p.topo.Pods["server"], "server6", "[::]:9090")
	server6, client6 := p.topo.PodIP6["server"], p.topo.PodIP6["client"]
	at := func(port string) string { return "[" + server6.String() + "]:" + port }

	// Ingress: port 8080 from the client's /64 (a CIDR rule), 9090 from
	// the client pod (an IP set with both its addresses); nothing else.
	ingress := &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "default", DefaultAction: policy.Deny,
		Policies: []policy.Policy{{Name: "web", Rules: []policy.Rule{
			{ID: 1, Action: policy.Allow, Protocol: 6, DstPorts: []policy.PortRange{{8080, 8080}},
				SrcNets: []netip.Prefix{netip.MustParsePrefix("fd00:200::/64")}},
			{ID: 2, Action: policy.Allow, Protocol: 6, DstPorts: []policy.PortRange{{9090, 9090}}, SrcIPSets: []uint32{5}},
		}}}}}}
	if c, err := dial(p.client, at("8080")); err != nil {
		t.Fatalf("IPv6 before any policy: %v", err)
	} else {
		c.Close()
	}
	p.dp.Put(p.dp.Objs.SlIpset6V1, gen.SluiceIpset6Key{Prefixlen: 32 + 128, SetId: gen.NetUint32(5), Addr: gen.NetAddr6(client6)}, gen.SluiceIpsetValue{})
	p.setSlots(p.serverIf, p.install(t, "server-ingress", ingress), noSlot)

	c, err := dial(p.client, at("8080"))
	if err != nil {
		for i := gen.SluiceCounter(0); i < gen.SluiceCounterCNT_MAX; i++ {
			if n := p.dp.Counter(i); n != 0 {
				t.Logf("counter %d: %d", i, n)
			}
		}
		t.Fatalf("IPv6 connection the CIDR rule allows: %v", err)
	}
	defer c.Close()
	if err := ask(c); err != nil {
		t.Fatal(err)
	}
	c2, err := dial(p.client, at("9090"))
	if err != nil {
		t.Fatalf("IPv6 connection the IP-set rule allows: %v", err)
	}
	c2.Close()
	// The IPv4 rules of the same policy: no IPv4 CIDR or member is there,
	// so the client's IPv4 connections are refused by the default deny.
	if c4, err := dial(p.client, p.server+":8080"); err == nil {
		c4.Close()
		t.Fatal("an IPv4 connection passed a policy whose rules are IPv6 only")
	}
	// From another source the IPv6 rules do not hold.
	other := netip.MustParseAddr("fd00:200::99")
	p.client.Run("ip", "addr", "add", other.String()+"/64", "dev", "eth0", "nodad")
	drops := p.dp.Counter(gen.SluiceCounterCNT_DROP_POLICY)
	if err := p.client.Do(func() error {
		c, err := dialFrom(other, at("9090"))
		if err == nil {
			c.Close()
		}
		return err
	}); err == nil {
		t.Fatal("an IPv6 source outside the IP set reached port 9090")
	}
	if p.dp.Counter(gen.SluiceCounterCNT_DROP_POLICY) == drops {
		t.Fatal("the IPv6 policy drop was not counted")
	}

	// Egress, judged after the service NAT: the client may reach the
	// server's IPv6 address on 8080 only, directly or through a Service;
	// the established connection above is not judged again.
	vip := netip.MustParseAddrPort("[fd00:96::10]:80")
	p.dp.AddService(bpftest.Service{ID: 1, Front: vip, Proto: bpftest.ProtoTCP,
		Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(server6, 9090), Local: true}}})
	egress := &policy.EndpointPolicy{Tiers: []policy.Tier{{Name: "default", DefaultAction: policy.Deny,
		Policies: []policy.Policy{{Name: "out", Rules: []policy.Rule{
			{ID: 3, Action: policy.Allow, Protocol: 6, DstPorts: []policy.PortRange{{8080, 8080}},
				DstNets: []netip.Prefix{netip.PrefixFrom(server6, 128)}},
		}}}}}}
	p.setSlots(p.clientIf, noSlot, p.install(t, "client-egress", egress))
	if err := ask(c); err != nil {
		t.Fatalf("established IPv6 connection cut by a later egress policy: %v", err)
	}
	c3, err := dial(p.client, at("8080"))
	if err != nil {
		t.Fatalf("IPv6 connection the egress policy allows (neighbour discovery judged?): %v", err)
	}
	c3.Close()
	if c4, err := dial(p.client, vip.String()); err == nil {
		c4.Close()
		t.Fatal("egress policy did not judge the IPv6 Service's backend port (9090)")
	}
}

// dialFrom connects from a given local address, in the calling namespace.
func dialFrom(src netip.Addr, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 400 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
	return d.Dial("tcp", addr)
}
