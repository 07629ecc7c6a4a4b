package datapathtest_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// XDP verdicts (enum xdp_action).
const (
	xdpTX       = 3
	xdpRedirect = 4
)

// xdpNode is a node namespace for the acceleration's FIB lookups: its data
// interface (data, the node IP 10.0.0.1/24) reaches the external clients
// (198.51.100.0/24) through a router and the remote backends (10.3.0.0/16)
// through another node, both on its link; a second interface (back,
// 10.9.0.1/24) reaches 10.4.0.0/16. The next hops' MACs are fixed, so the
// translated frames are known to the byte.
type xdpNode struct {
	ns                   *bpftest.NetNS
	data, back           int // ifindexes
	dataMAC, backMAC     net.HardwareAddr
	routerMAC, remoteMAC net.HardwareAddr
	backHopMAC           net.HardwareAddr
	dataName, backName   string
}

func newXDPNode(t *testing.T) *xdpNode {
	t.Helper()
	n := &xdpNode{ns: bpftest.NewNetNS(t),
		routerMAC: net.HardwareAddr{0x02, 0, 0, 0, 0xfe, 1}, remoteMAC: net.HardwareAddr{0x02, 0, 0, 0, 0xfe, 2},
		backHopMAC: net.HardwareAddr{0x02, 0, 0, 0, 0xfe, 3}}
	peer := bpftest.NewNetNS(t)
	data := bpftest.NewVeth(t, n.ns, peer)
	back := bpftest.NewVeth(t, n.ns, peer)
	n.dataName, n.backName = data.Name, back.Name
	for _, cmd := range [][]string{
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"ip", "addr", "add", "10.0.0.1/24", "dev", data.Name},
		{"ip", "addr", "add", "10.9.0.1/24", "dev", back.Name},
		{"ip", "neigh", "replace", "10.0.0.254", "lladdr", n.routerMAC.String(), "dev", data.Name, "nud", "permanent"},
		{"ip", "neigh", "replace", "10.0.0.253", "lladdr", n.remoteMAC.String(), "dev", data.Name, "nud", "permanent"},
		{"ip", "neigh", "replace", "10.9.0.254", "lladdr", n.backHopMAC.String(), "dev", back.Name, "nud", "permanent"},
		{"ip", "route", "add", "198.51.100.0/24", "via", "10.0.0.254", "dev", data.Name},
		{"ip", "route", "add", "10.3.0.0/16", "via", "10.0.0.253", "dev", data.Name},
		{"ip", "route", "add", "10.4.0.0/16", "via", "10.9.0.254", "dev", back.Name},
	} {
		n.ns.Run(cmd...)
	}
	if err := n.ns.Do(func() error {
		for _, x := range []struct {
			name  string
			index *int
			mac   *net.HardwareAddr
		}{{data.Name, &n.data, &n.dataMAC}, {back.Name, &n.back, &n.backMAC}} {
			ifc, err := net.InterfaceByName(x.name)
			if err != nil {
				return err
			}
			*x.index, *x.mac = ifc.Index, ifc.HardwareAddr
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// runXDP runs the acceleration on frame as if it arrived on ifindex, in the
// node's namespace (where its FIB lookups and devmap resolve).
func (n *xdpNode) runXDP(t *testing.T, d *bpftest.Datapath, ifindex int, frame []byte) (uint32, []byte) {
	t.Helper()
	var ret uint32
	out := make([]byte, len(frame)+256)
	err := n.ns.Do(func() error {
		opts := ebpf.RunOptions{Data: frame, DataOut: out,
			Context: gen.XDPContext{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ifindex)}}
		var err error
		ret, err = d.Objs.SlXdpAccel.Run(&opts)
		out = opts.DataOut
		return err
	})
	if err != nil {
		t.Fatalf("run sl_xdp_accel: %v", err)
	}
	return ret, out
}

// withIPv6 gives the node's data interface node6/64, external clients
// (2001:db8::/64) behind a router and remote backends (fd00:3::/64) behind
// another node, and returns those next hops' MACs.
func (n *xdpNode) withIPv6() (routerMAC, remoteMAC net.HardwareAddr) {
	routerMAC, remoteMAC = net.HardwareAddr{0x02, 0, 0, 0, 0xfe, 6}, net.HardwareAddr{0x02, 0, 0, 0, 0xfe, 7}
	for _, cmd := range [][]string{
		{"sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"},
		{"ip", "addr", "add", node6.String() + "/64", "dev", n.dataName, "nodad"},
		{"ip", "neigh", "replace", "fd00::fe", "lladdr", routerMAC.String(), "dev", n.dataName, "nud", "permanent"},
		{"ip", "neigh", "replace", "fd00::fd", "lladdr", remoteMAC.String(), "dev", n.dataName, "nud", "permanent"},
		{"ip", "-6", "route", "add", "2001:db8::/64", "via", "fd00::fe", "dev", n.dataName},
		{"ip", "-6", "route", "add", "fd00:3::/64", "via", "fd00::fd", "dev", n.dataName},
	} {
		n.ns.Run(cmd...)
	}
	return routerMAC, remoteMAC
}

// runTC runs sl_from_host on frame in the node's namespace (its FIB
// lookups see the node's routes).
func (n *xdpNode) runTC(t *testing.T, d *bpftest.Datapath, frame []byte) (uint32, []byte) {
	t.Helper()
	var ret uint32
	var out []byte
	if err := n.ns.Do(func() error {
		ret, out = d.Run(d.Objs.SlFromHost, frame)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ret, out
}

// forwarded is frame as the node sends it on: Ethernet addresses of the
// next hop, the TTL one less. Its checksums are computed from scratch by
// Build, so a frame the program left equal to it carries correct ones.
func forwarded(spec bpftest.PacketSpec, from, to net.HardwareAddr) []byte {
	spec.TTL = 63
	f := bpftest.Build(spec)
	copy(f[0:6], to)
	copy(f[6:12], from)
	return f
}

func xdpDecisions(t *testing.T, d *bpftest.Datapath) map[gen.SluiceXdpAccelDecision]uint64 {
	t.Helper()
	got := map[gen.SluiceXdpAccelDecision]uint64{}
	for k := gen.SluiceXdpAccelDecision(0); k < gen.SluiceXdpAccelDecisionXDP_ACCEL_MAX; k++ {
		var vs []uint64
		if err := d.Objs.SlXdpstatsV2.Lookup(k, &vs); err != nil {
			t.Fatal(err)
		}
		for _, v := range vs {
			got[k] += v
		}
	}
	return got
}

// sameEntries compares the conntrack entries of a flow (its forward and
// reverse keys) in two datapaths, but for their times: the flow started at
// XDP in got, at TC in want.
func sameEntries(t *testing.T, got, want *bpftest.Datapath, keys ...gen.SluiceCtKey) {
	t.Helper()
	for _, k := range keys {
		g, okG := got.CT(k)
		w, okW := want.CT(k)
		if !okG || !okW {
			t.Fatalf("entry %+v: at XDP %v, at TC %v; want both", k, okG, okW)
		}
		g.Created, g.LastSeen, w.Created, w.LastSeen = 0, 0, 0, 0
		if g != w {
			t.Fatalf("entry %+v:\n XDP wrote %+v\n  TC wrote %+v", k, g, w)
		}
	}
}

// sameEntries6 is sameEntries for IPv6 keys (sl_ct6_v1).
func sameEntries6(t *testing.T, got, want *bpftest.Datapath, keys ...gen.SluiceCt6Key) {
	t.Helper()
	for _, k := range keys {
		g, okG := got.CT6(k)
		w, okW := want.CT6(k)
		g.Created, g.LastSeen, w.Created, w.LastSeen = 0, 0, 0, 0
		if !okG || !okW || g != w {
			t.Fatalf("entry %+v:\n XDP wrote %+v (%v)\n  TC wrote %+v (%v)", k, g, okG, w, okW)
		}
	}
}

// A NodePort flow to a backend on another node: its first packet starts
// it at XDP, with the entries and the frame TC writes for it; its
// established packets, both ways, are translated at XDP to the very bytes
// the TC path writes and sent back out of the data interface; and each
// packet that changes the flow's state, or that XDP cannot carry, passes to
// TC untouched, counted by why.
func TestXDPAccelCarriesEstablishedNodePortFlows(t *testing.T) {
	for _, proto := range []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP} {
		t.Run(proto.String(), func(t *testing.T) {
			d := newDP(t)
			n := newXDPNode(t)
			np := netip.AddrPortFrom(nodeIP, 30085)
			remote := netip.MustParseAddrPort("10.3.0.4:8080")
			d.AddService(bpftest.Service{ID: 7, Front: np, Proto: uint8(proto), Backends: []bpftest.Backend{{AP: remote}},
				Flags: gen.SluiceFeFlagsFE_EXTERNAL})
			spec := func(src, dst netip.AddrPort, flags uint8, payload string) bpftest.PacketSpec {
				return bpftest.PacketSpec{Src: src, Dst: dst, Proto: proto, TCPFlags: flags, Seq: 1000, Payload: []byte(payload)}
			}
			first, ack, psh := flowFlags(proto)

			// The flow's first packet: XDP starts the flow, with the
			// entries TC writes for it (tcOnly: the same Service, the
			// packet at TC), and sends it on as TC would.
			syn := bpftest.Build(spec(extAP, np, first, "a"))
			tcOnly := newDP(t)
			tcOnly.AddService(bpftest.Service{ID: 7, Front: np, Proto: uint8(proto), Backends: []bpftest.Backend{{AP: remote}},
				Flags: gen.SluiceFeFlagsFE_EXTERNAL})
			tcRet, tcFrame := n.runTC(t, tcOnly, syn)
			ret, out := n.runXDP(t, d, n.data, syn)
			snat := netip.AddrPortFrom(nodeIP, extAP.Port()) // the client's port is free: kept
			want := forwarded(spec(snat, remote, first, "a"), n.dataMAC, n.remoteMAC)
			if ret != xdpTX || !bytes.Equal(out[:len(want)], want) || tcRet != actRedirect || !bytes.Equal(tcFrame[:len(want)], want) {
				t.Fatalf("first packet: XDP verdict %d, TC verdict %d; want XDP_TX and TC's redirect of the same frame %x (XDP %x, TC %x)",
					ret, tcRet, want, out[:len(want)], tcFrame[:len(want)])
			}
			sameEntries(t, d, tcOnly, bpftest.CtKey(extAP, np, uint8(proto)), bpftest.CtKey(remote, snat, uint8(proto)))

			// The backend's first answer changes the flow's state: TC's.
			answer := bpftest.Build(spec(remote, snat, first|ack, "b"))
			if ret, _ := n.runXDP(t, d, n.data, answer); ret != xdpPass {
				t.Fatalf("the backend's first answer: verdict %d, want XDP_PASS", ret)
			}
			n.runTC(t, d, answer)
			// TCP: the client's first ACK too; UDP: its second datagram
			// (the entry is not known to have seen a packet after its first).
			second := bpftest.Build(spec(extAP, np, ack, "c"))
			if ret, _ := n.runXDP(t, d, n.data, second); ret != xdpPass {
				t.Fatalf("the client's second packet: verdict %d, want XDP_PASS", ret)
			}
			n.runTC(t, d, second)

			// Established, both ways: XDP writes what TC writes.
			d.AgeFlow(extAP, np, uint8(proto), 10*time.Second)
			before, _ := d.CT(bpftest.CtKey(extAP, np, uint8(proto)))
			for _, c := range []struct {
				name    string
				in      bpftest.PacketSpec
				want    bpftest.PacketSpec
				nextHop net.HardwareAddr
			}{
				{"to the backend", spec(extAP, np, psh, "GET / HTTP/1.1\r\n"), spec(snat, remote, psh, "GET / HTTP/1.1\r\n"), n.remoteMAC},
				{"the reply", spec(remote, snat, psh, "HTTP/1.1 200 OK\r\n"), spec(np, extAP, psh, "HTTP/1.1 200 OK\r\n"), n.routerMAC},
			} {
				frame := bpftest.Build(c.in)
				ret, out := n.runXDP(t, d, n.data, frame)
				want := forwarded(c.want, n.dataMAC, c.nextHop)
				if ret != xdpTX || !bytes.Equal(out[:len(want)], want) {
					dec, err := bpftest.Decode(out)
					t.Fatalf("%s: verdict %d, frame %v → %v (checksums: %v), want XDP_TX of %v → %v from %v to %v",
						c.name, ret, dec.Src, dec.Dst, err, c.want.Src, c.want.Dst, n.dataMAC, c.nextHop)
				}
				if c.name == "to the backend" {
					after, _ := d.CT(bpftest.CtKey(extAP, np, uint8(proto)))
					if after.LastSeen <= before.LastSeen || after.TcpSeen != before.TcpSeen {
						t.Fatalf("forward entry after XDP: last_seen %d (was %d), tcp_seen %#x (was %#x): want refreshed, state unchanged",
							after.LastSeen, before.LastSeen, after.TcpSeen, before.TcpSeen)
					}
				}
				// The TC path, as it carries the flow when XDP is not
				// attached (an agent restart, acceleration turned off).
				ret, tcOut := n.runTC(t, d, frame)
				if ret != actRedirect || !bytes.Equal(tcOut[:len(want)], want) {
					t.Fatalf("%s at TC: verdict %d, a frame other than XDP's", c.name, ret)
				}
			}
			var stats []gen.SluiceSvcstatsValue
			if err := d.Objs.SlSvcstatsV1.Lookup(uint32(7), &stats); err != nil {
				t.Fatal(err)
			}
			var sum gen.SluiceSvcstatsValue
			for _, s := range stats {
				sum.FwdPackets += s.FwdPackets
				sum.RevPackets += s.RevPackets
			}
			// XDP counted the first and one each way, TC the others.
			if sum.FwdPackets != 4 || sum.RevPackets != 3 {
				t.Fatalf("service counters: %d forward, %d replies; want 4 and 3 (XDP counts as TC does)", sum.FwdPackets, sum.RevPackets)
			}

			// What XDP leaves to TC, unchanged.
			passes := []struct {
				name  string
				frame []byte
				why   gen.SluiceXdpAccelDecision
			}{
				{"a fragment", bpftest.Build(bpftest.PacketSpec{Src: extAP, Dst: np, Proto: proto, TCPFlags: psh, Fragment: true, Payload: []byte("x")}),
					gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_SHAPE},
				{"IP options", bpftest.Build(bpftest.PacketSpec{Src: extAP, Dst: np, Proto: proto, TCPFlags: psh, IPOptions: []byte{0x94, 0x04, 0, 0}}),
					gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_SHAPE},
				{"an expiring TTL", bpftest.Build(bpftest.PacketSpec{Src: extAP, Dst: np, Proto: proto, TCPFlags: psh, TTL: 1}),
					gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_TTL},
				{"a first packet to a port no Service has", bpftest.Build(spec(netip.MustParseAddrPort("198.51.100.10:50000"), netip.AddrPortFrom(nodeIP, 30999), first, "")),
					gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_NO_FLOW},
				{"ARP", append(make([]byte, 12), 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
					gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_NOT_IP},
				{"a truncated IPv4 header", append(make([]byte, 12), 0x08, 0x00, 0x45, 0, 0, 20, 0, 0, 0, 0, 64, 6),
					gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_SHAPE},
			}
			if proto == layers.IPProtocolTCP {
				passes = append(passes, struct {
					name  string
					frame []byte
					why   gen.SluiceXdpAccelDecision
				}{"the client's FIN", bpftest.Build(spec(extAP, np, bpftest.FIN|bpftest.ACK, "")), gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_STATE})
			}
			for _, c := range passes {
				before := xdpDecisions(t, d)[c.why]
				ret, out := n.runXDP(t, d, n.data, c.frame)
				if ret != xdpPass || !bytes.Equal(out[:len(c.frame)], c.frame) {
					t.Errorf("%s: verdict %d (frame changed: %v), want XDP_PASS unchanged", c.name, ret, !bytes.Equal(out[:len(c.frame)], c.frame))
				}
				if got := xdpDecisions(t, d)[c.why]; got != before+1 {
					t.Errorf("%s: decision %d counted %d times, want once", c.name, c.why, got-before)
				}
			}
		})
	}
}

// Which flows XDP leaves to TC, and where it sends a frame whose next hop is
// behind another interface: only to one in sl_xdpdev_v1, by redirect.
func TestXDPAccelLeavesOtherFlowsToTC(t *testing.T) {
	d := newDP(t)
	n := newXDPNode(t)
	local := netip.MustParseAddrPort("10.2.0.7:8080")
	behindBack := netip.MustParseAddrPort("10.4.0.4:8080")
	npLocal, npBack, vip := netip.AddrPortFrom(nodeIP, 30086), netip.AddrPortFrom(nodeIP, 30087), netip.MustParseAddrPort("10.96.0.20:80")
	d.AddService(bpftest.Service{ID: 8, Front: npLocal, Proto: protoTCP, Backends: []bpftest.Backend{{AP: local, Local: true}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	d.AddService(bpftest.Service{ID: 9, Front: npBack, Proto: protoTCP, Backends: []bpftest.Backend{{AP: behindBack}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	d.AddService(bpftest.Service{ID: 10, Front: vip, Proto: protoTCP, Backends: []bpftest.Backend{{AP: local, Local: true}}})

	// Each flow established through TC.
	establish := func(client, front netip.AddrPort) {
		t.Helper()
		n.runTC(t, d, bpftest.TCPPacket(client, front, bpftest.SYN))
		fwd, ok := d.CT(bpftest.CtKey(client, front, protoTCP))
		if !ok {
			t.Fatalf("no flow %v → %v", client, front)
		}
		be := netip.AddrPortFrom(gen.AddrFromNet(fwd.NatAddr), gen.PortFromNet(fwd.NatPort))
		to := client
		if fwd.Flags&gen.SluiceCtFlagsCT_SNAT != 0 {
			to = netip.AddrPortFrom(gen.AddrFromNet(fwd.SnatAddr), gen.PortFromNet(fwd.SnatPort))
		}
		n.runTC(t, d, bpftest.TCPPacket(be, to, bpftest.SYN|bpftest.ACK))
		n.runTC(t, d, bpftest.TCPPacket(client, front, bpftest.ACK))
	}
	clientLocal := netip.MustParseAddrPort("198.51.100.9:50001")
	clientBack := netip.MustParseAddrPort("198.51.100.9:50002")
	pod := netip.MustParseAddrPort("198.51.100.9:50003")
	establish(clientLocal, npLocal)
	establish(clientBack, npBack)
	establish(pod, vip)

	for _, c := range []struct {
		name  string
		frame []byte
		why   gen.SluiceXdpAccelDecision
	}{
		{"a NodePort flow to a local backend", bpftest.TCPPacket(clientLocal, npLocal, bpftest.ACK|bpftest.PSH), gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_TC_FLOW},
		{"a ClusterIP flow from outside, not SNATed", bpftest.TCPPacket(pod, vip, bpftest.ACK|bpftest.PSH), gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_TC_FLOW},
		{"a next hop behind an interface not accelerated", bpftest.TCPPacket(clientBack, npBack, bpftest.ACK|bpftest.PSH), gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_EGRESS},
	} {
		before := xdpDecisions(t, d)[c.why]
		ret, out := n.runXDP(t, d, n.data, c.frame)
		if ret != xdpPass || !bytes.Equal(out[:len(c.frame)], c.frame) {
			t.Errorf("%s: verdict %d, want XDP_PASS unchanged", c.name, ret)
		}
		if got := xdpDecisions(t, d)[c.why]; got != before+1 {
			t.Errorf("%s: decision %d counted %d times, want once", c.name, c.why, got-before)
		}
	}

	// With the back interface accelerated, its flows are redirected there.
	if err := n.ns.Do(func() error { return d.Objs.SlXdpdevV1.Put(uint32(n.back), uint32(n.back)) }); err != nil {
		t.Fatal(err)
	}
	fwd, _ := d.CT(bpftest.CtKey(clientBack, npBack, protoTCP))
	snat := netip.AddrPortFrom(gen.AddrFromNet(fwd.SnatAddr), gen.PortFromNet(fwd.SnatPort))
	ret, out := n.runXDP(t, d, n.data, bpftest.TCPPacket(clientBack, npBack, bpftest.ACK|bpftest.PSH))
	want := forwarded(bpftest.PacketSpec{Src: snat, Dst: behindBack, Proto: layers.IPProtocolTCP, TCPFlags: bpftest.ACK | bpftest.PSH}, n.backMAC, n.backHopMAC)
	if ret != xdpRedirect || !bytes.Equal(out[:len(want)], want) {
		t.Fatalf("next hop behind an accelerated interface: verdict %d, frame %x; want XDP_REDIRECT of %x", ret, out[:len(want)], want)
	}
	if got := xdpDecisions(t, d)[gen.SluiceXdpAccelDecisionXDP_ACCEL_REDIRECTED]; got != 1 {
		t.Fatalf("%d redirects counted, want 1", got)
	}
}

// The IPv6 twin: a NodePort flow of the node's IPv6 address to a backend
// behind another node is started at XDP with the entries TC writes on
// sl_ct6_v1, and carried at XDP both ways to the very bytes TC writes (the
// hop limit one less, the L4 checksum updated for the addresses and
// ports); an extension header passes to TC.
func TestXDPAccelCarriesIPv6Flows(t *testing.T) {
	for _, proto := range []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP} {
		t.Run(proto.String(), func(t *testing.T) {
			d := newDP6(t)
			n := newXDPNode(t)
			routerMAC6, remoteMAC6 := n.withIPv6()
			np := netip.AddrPortFrom(node6, 30085)
			remote := netip.MustParseAddrPort("[fd00:3::4]:8080")
			d.AddService(bpftest.Service{ID: 7, Front: np, Proto: uint8(proto), Backends: []bpftest.Backend{{AP: remote}},
				Flags: gen.SluiceFeFlagsFE_EXTERNAL})
			spec := func(src, dst netip.AddrPort, flags uint8, payload string) bpftest.PacketSpec {
				return bpftest.PacketSpec{Src: src, Dst: dst, Proto: proto, TCPFlags: flags, Seq: 1000, Payload: []byte(payload)}
			}
			first, ack, psh := flowFlags(proto)

			// Started at XDP, with the entries TC writes (tcOnly), and the
			// frame TC writes, forwarded as the stack would after TC (TC
			// leaves an IPv6 packet's forwarding to it, fib.h).
			syn := bpftest.Build(spec(ext6, np, first, "a"))
			tcOnly := newDP6(t)
			tcOnly.AddService(bpftest.Service{ID: 7, Front: np, Proto: uint8(proto), Backends: []bpftest.Backend{{AP: remote}},
				Flags: gen.SluiceFeFlagsFE_EXTERNAL})
			tcRet, tcFrame := n.runTC(t, tcOnly, syn)
			ret, out := n.runXDP(t, d, n.data, syn)
			snat := netip.AddrPortFrom(node6, ext6.Port()) // the client's port is free: kept
			want, tcWant := forwarded(spec(snat, remote, first, "a"), n.dataMAC, remoteMAC6), bpftest.Build(spec(snat, remote, first, "a"))
			if ret != xdpTX || !bytes.Equal(out[:len(want)], want) || tcRet != actOK || !bytes.Equal(tcFrame[:len(tcWant)], tcWant) {
				t.Fatalf("first packet: XDP verdict %d, TC verdict %d; want XDP_TX of %x, TC_ACT_OK of %x (XDP %x, TC %x)",
					ret, tcRet, want, tcWant, out[:len(want)], tcFrame[:len(tcWant)])
			}
			sameEntries6(t, d, tcOnly, bpftest.CtKey6(ext6, np, uint8(proto)), bpftest.CtKey6(remote, snat, uint8(proto)))
			n.runTC(t, d, bpftest.Build(spec(remote, snat, first|ack, "b")))
			n.runTC(t, d, bpftest.Build(spec(ext6, np, ack, "c")))

			d.AgeFlow(ext6, np, uint8(proto), 10*time.Second)
			before, _ := d.CT6(bpftest.CtKey6(ext6, np, uint8(proto)))
			decisions := xdpDecisions(t, d)
			for _, c := range []struct {
				name    string
				in      bpftest.PacketSpec
				want    bpftest.PacketSpec
				nextHop net.HardwareAddr
			}{
				{"to the backend", spec(ext6, np, psh, "GET / HTTP/1.1\r\n"), spec(snat, remote, psh, "GET / HTTP/1.1\r\n"), remoteMAC6},
				{"the reply", spec(remote, snat, psh, "HTTP/1.1 200 OK\r\n"), spec(np, ext6, psh, "HTTP/1.1 200 OK\r\n"), routerMAC6},
			} {
				frame := bpftest.Build(c.in)
				ret, out := n.runXDP(t, d, n.data, frame)
				want := forwarded(c.want, n.dataMAC, c.nextHop)
				if ret != xdpTX || !bytes.Equal(out[:len(want)], want) {
					dec, err := bpftest.Decode(out)
					t.Fatalf("%s: verdict %d, frame %v → %v (checksums: %v), want XDP_TX of %v → %v", c.name, ret, dec.Src, dec.Dst, err, c.want.Src, c.want.Dst)
				}
				// TC writes the same translation and the stack forwards it:
				// the same frame but for the hop limit and the MACs.
				tcWant := bpftest.Build(c.want)
				if ret, tcOut := n.runTC(t, d, frame); ret != actOK || !bytes.Equal(tcOut[14:len(tcWant)], tcWant[14:]) {
					t.Fatalf("%s at TC: verdict %d, a translation other than XDP's", c.name, ret)
				}
			}
			after, _ := d.CT6(bpftest.CtKey6(ext6, np, uint8(proto)))
			if after.LastSeen <= before.LastSeen || after.TcpSeen != before.TcpSeen {
				t.Fatalf("forward entry after XDP: last_seen %d (was %d), tcp_seen %#x (was %#x)", after.LastSeen, before.LastSeen, after.TcpSeen, before.TcpSeen)
			}
			if got := xdpDecisions(t, d)[gen.SluiceXdpAccelDecisionXDP_ACCEL_TX]; got != decisions[gen.SluiceXdpAccelDecisionXDP_ACCEL_TX]+2 {
				t.Fatalf("XDP_TX counted %d times, want 2", got-decisions[gen.SluiceXdpAccelDecisionXDP_ACCEL_TX])
			}

			// A hop-by-hop header (the shape of DSR's destination option,
			// and of every extension header) and an expiring hop limit pass.
			for _, c := range []struct {
				name  string
				frame []byte
				why   gen.SluiceXdpAccelDecision
			}{
				{"an extension header", withHopByHop(bpftest.Build(spec(ext6, np, psh, "x"))), gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_SHAPE},
				{"an expiring hop limit", bpftest.Build(bpftest.PacketSpec{Src: ext6, Dst: np, Proto: proto, TCPFlags: psh, TTL: 1}),
					gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_TTL},
				{"a truncated header", bpftest.Build(spec(ext6, np, psh, "x"))[:14+20], gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_SHAPE},
			} {
				before := xdpDecisions(t, d)[c.why]
				ret, out := n.runXDP(t, d, n.data, c.frame)
				if ret != xdpPass || !bytes.Equal(out[:len(c.frame)], c.frame) {
					t.Errorf("%s: verdict %d, want XDP_PASS unchanged", c.name, ret)
				}
				if got := xdpDecisions(t, d)[c.why]; got != before+1 {
					t.Errorf("%s: decision %d counted %d times, want once", c.name, c.why, got-before)
				}
			}
		})
	}
}

// withHopByHop inserts an empty hop-by-hop options header (8 bytes of PadN)
// after an IPv6 frame's fixed header.
func withHopByHop(frame []byte) []byte {
	const l3, hlen = 14, 40
	next := frame[l3+6]
	out := append([]byte{}, frame[:l3+hlen]...)
	out = append(out, next, 0, 1, 4, 0, 0, 0, 0)
	out = append(out, frame[l3+hlen:]...)
	out[l3+6] = 0 // hop-by-hop
	payload := int(out[l3+4])<<8 | int(out[l3+5]) + 8
	out[l3+4], out[l3+5] = byte(payload>>8), byte(payload)
	return out
}

// New flows at XDP are balanced as TC balances them: a Maglev frontend's
// flows reach the backend its table names (the same as at TC, flow by
// flow, with the same entries), a client with affinity keeps its backend
// across the two paths, a source outside a frontend's ranges is dropped
// and counted as TC counts it, and every new flow the TC path must start
// (a frontend with a local backend, local-only, no endpoints, a host
// endpoint's policy) passes to it before anything is written.
func TestXDPAccelStartsFlowsAsTCDoes(t *testing.T) {
	n := newXDPNode(t)
	remotes := []bpftest.Backend{{AP: netip.MustParseAddrPort("10.3.0.4:8080")}, {AP: netip.MustParseAddrPort("10.3.0.5:8080")},
		{AP: netip.MustParseAddrPort("10.3.0.6:8080")}}
	maglev := netip.AddrPortFrom(nodeIP, 30090)
	sticky := netip.AddrPortFrom(nodeIP, 30091)
	ranged := netip.AddrPortFrom(nodeIP, 30092)
	services := func(d *bpftest.Datapath) {
		d.AddService(bpftest.Service{ID: 20, Front: maglev, Proto: protoTCP, Backends: remotes,
			Flags: gen.SluiceFeFlagsFE_EXTERNAL | gen.SluiceFeFlagsFE_MAGLEV})
		spreadMaglev(d, 20)
		d.AddService(bpftest.Service{ID: 21, Front: sticky, Proto: protoTCP, Backends: remotes, Affinity: 60,
			Flags: gen.SluiceFeFlagsFE_EXTERNAL})
		d.AddService(bpftest.Service{ID: 22, Front: ranged, Proto: protoUDP, Backends: remotes[:1],
			Flags: gen.SluiceFeFlagsFE_EXTERNAL | gen.SluiceFeFlagsFE_SRC_RANGES})
		d.Put(d.Objs.SlSrcrangeV1, gen.SluiceSrcrangeKey{Prefixlen: 32 + 24, SvcId: gen.NetUint32(22),
			Src: gen.NetAddr(netip.MustParseAddr("198.51.100.0"))}, gen.SluiceSrcrangeValue{})
	}
	d, tcOnly := newDP(t), newDP(t)
	services(d)
	services(tcOnly)

	// Maglev: flow by flow, the backend TC's pick names, and the entries.
	picked := map[netip.Addr]int{}
	for port := uint16(40000); port < 40030; port++ {
		client := netip.AddrPortFrom(extAP.Addr(), port)
		syn := bpftest.TCPPacket(client, maglev, bpftest.SYN)
		if ret, _ := n.runXDP(t, d, n.data, syn); ret != xdpTX {
			t.Fatalf("Maglev flow from %v: XDP verdict %d, want XDP_TX", client, ret)
		}
		n.runTC(t, tcOnly, syn)
		fwd, _ := d.CT(bpftest.CtKey(client, maglev, protoTCP))
		be := netip.AddrPortFrom(gen.AddrFromNet(fwd.NatAddr), gen.PortFromNet(fwd.NatPort))
		sameEntries(t, d, tcOnly, bpftest.CtKey(client, maglev, protoTCP), bpftest.CtKey(be, netip.AddrPortFrom(nodeIP, port), protoTCP))
		picked[be.Addr()]++
	}
	if len(picked) < 2 {
		t.Fatalf("30 Maglev flows all reached %v: the table names three backends", picked)
	}

	// Affinity: a client's first flow picked at XDP; its next, at TC, goes
	// to the same backend.
	client := netip.AddrPortFrom(extAP.Addr(), 41000)
	if ret, _ := n.runXDP(t, d, n.data, bpftest.TCPPacket(client, sticky, bpftest.SYN)); ret != xdpTX {
		t.Fatalf("affinity flow: XDP verdict %d, want XDP_TX", ret)
	}
	first, _ := d.CT(bpftest.CtKey(client, sticky, protoTCP))
	for port := uint16(41001); port < 41006; port++ {
		next := netip.AddrPortFrom(extAP.Addr(), port)
		n.runTC(t, d, bpftest.TCPPacket(next, sticky, bpftest.SYN))
		if f, _ := d.CT(bpftest.CtKey(next, sticky, protoTCP)); f.NatAddr != first.NatAddr {
			t.Fatalf("the client's flow at TC reached %v, its first at XDP %v: affinity lost",
				gen.AddrFromNet(f.NatAddr), gen.AddrFromNet(first.NatAddr))
		}
	}

	// Source ranges: an allowed source is carried, another dropped, counted
	// and without entries.
	allowed := netip.MustParseAddrPort("198.51.100.7:5000")
	denied := netip.MustParseAddrPort("192.0.2.7:5000")
	if ret, _ := n.runXDP(t, d, n.data, bpftest.UDPPacket(allowed, ranged, []byte("x"))); ret != xdpTX {
		t.Fatalf("allowed source: XDP verdict %d, want XDP_TX", ret)
	}
	dropped := xdpDecisions(t, d)[gen.SluiceXdpAccelDecisionXDP_ACCEL_DROPPED]
	if ret, _ := n.runXDP(t, d, n.data, bpftest.UDPPacket(denied, ranged, []byte("x"))); ret != xdpDrop {
		t.Fatalf("source outside the ranges: XDP verdict %d, want XDP_DROP", ret)
	}
	if c := d.Counter(gen.SluiceCounterCNT_DROP_SRC_RANGE); c != 1 {
		t.Fatalf("source-range drops %d, want 1 (as TC counts them)", c)
	}
	if got := xdpDecisions(t, d)[gen.SluiceXdpAccelDecisionXDP_ACCEL_DROPPED]; got != dropped+1 {
		t.Fatalf("XDP drops counted %d, want %d", got, dropped+1)
	}
	if _, ok := d.CT(bpftest.CtKey(denied, ranged, protoUDP)); ok {
		t.Fatal("a refused flow left an entry")
	}

	// What the TC path starts: passed before anything is written.
	mixed, local := netip.AddrPortFrom(nodeIP, 30093), netip.AddrPortFrom(nodeIP, 30094)
	empty := netip.AddrPortFrom(nodeIP, 30095)
	d.AddService(bpftest.Service{ID: 23, Front: mixed, Proto: protoTCP,
		Backends: []bpftest.Backend{{AP: netip.MustParseAddrPort("10.2.0.7:8080"), Local: true}, remotes[0]}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	d.AddService(bpftest.Service{ID: 24, Front: local, Proto: protoTCP, Backends: remotes[:1],
		Flags: gen.SluiceFeFlagsFE_EXTERNAL | gen.SluiceFeFlagsFE_EXT_LOCAL})
	d.AddService(bpftest.Service{ID: 25, Front: empty, Proto: protoTCP, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	cases := []struct {
		name  string
		front netip.AddrPort
		setup func()
	}{
		{"a frontend with a local backend", mixed, nil},
		{"an externalTrafficPolicy Local frontend", local, nil},
		{"a frontend without endpoints", empty, nil},
		{"a host endpoint's policy", maglev, func() {
			d.Put(d.Objs.SlIfstateV1, gen.SluiceIfstateKey{Ifindex: uint32(n.data)},
				gen.SluiceIfstateValue{IngressPolicy: gen.IfstateNoPolicy, EgressPolicy: 3})
		}},
	}
	for i, c := range cases {
		if c.setup != nil {
			c.setup()
		}
		client := netip.AddrPortFrom(extAP.Addr(), uint16(42000+i))
		syn := bpftest.TCPPacket(client, c.front, bpftest.SYN)
		before := xdpDecisions(t, d)[gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_NEW_AT_TC]
		entries := d.CTCount()
		ret, out := n.runXDP(t, d, n.data, syn)
		if ret != xdpPass || !bytes.Equal(out[:len(syn)], syn) {
			t.Errorf("%s: verdict %d, want XDP_PASS unchanged", c.name, ret)
		}
		if got := xdpDecisions(t, d)[gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_NEW_AT_TC]; got != before+1 {
			t.Errorf("%s: pass_new_at_tc counted %d times, want once", c.name, got-before)
		}
		if got := d.CTCount(); got != entries {
			t.Errorf("%s: %d entries after XDP passed it, %d before: want nothing written", c.name, got, entries)
		}
	}
}

// The IPv6 twin of TestXDPAccelStartsFlowsAsTCDoes: a Maglev frontend's new
// flows get TC's pick and entries on sl_ct6_v1, and a source outside a
// frontend's ranges is dropped and counted as TC counts it.
func TestXDPAccelStartsIPv6FlowsAsTCDoes(t *testing.T) {
	n := newXDPNode(t)
	_, remoteMAC := n.withIPv6()
	remotes := []bpftest.Backend{{AP: netip.MustParseAddrPort("[fd00:3::4]:8080")}, {AP: netip.MustParseAddrPort("[fd00:3::5]:8080")},
		{AP: netip.MustParseAddrPort("[fd00:3::6]:8080")}}
	maglev, ranged := netip.AddrPortFrom(node6, 30090), netip.AddrPortFrom(node6, 30092)
	services := func(d *bpftest.Datapath) {
		d.AddService(bpftest.Service{ID: 20, Front: maglev, Proto: protoTCP, Backends: remotes,
			Flags: gen.SluiceFeFlagsFE_EXTERNAL | gen.SluiceFeFlagsFE_MAGLEV})
		spreadMaglev(d, 20)
		d.AddService(bpftest.Service{ID: 22, Front: ranged, Proto: protoUDP, Backends: remotes[:1],
			Flags: gen.SluiceFeFlagsFE_EXTERNAL | gen.SluiceFeFlagsFE_SRC_RANGES})
		d.Put(d.Objs.SlSrcrange6V1, gen.SluiceSrcrange6Key{Prefixlen: 32 + 64, SvcId: gen.NetUint32(22),
			Src: netip.MustParseAddr("2001:db8::").As16()}, gen.SluiceSrcrangeValue{})
	}
	d, tcOnly := newDP6(t), newDP6(t)
	services(d)
	services(tcOnly)

	picked := map[netip.Addr]int{}
	for port := uint16(40000); port < 40030; port++ {
		client := netip.AddrPortFrom(ext6.Addr(), port)
		syn := bpftest.TCPPacket(client, maglev, bpftest.SYN)
		ret, out := n.runXDP(t, d, n.data, syn)
		n.runTC(t, tcOnly, syn)
		fwd, _ := tcOnly.CT6(bpftest.CtKey6(client, maglev, protoTCP))
		be := netip.AddrPortFrom(gen.AddrFromNet6(fwd.NatAddr), gen.PortFromNet(fwd.NatPort))
		snat := netip.AddrPortFrom(node6, port)
		want := forwarded(bpftest.PacketSpec{Src: snat, Dst: be, Proto: layers.IPProtocolTCP, TCPFlags: bpftest.SYN}, n.dataMAC, remoteMAC)
		if ret != xdpTX || !bytes.Equal(out[:len(want)], want) {
			t.Fatalf("Maglev flow from %v: XDP verdict %d, want XDP_TX to TC's pick %v", client, ret, be)
		}
		sameEntries6(t, d, tcOnly, bpftest.CtKey6(client, maglev, protoTCP), bpftest.CtKey6(be, snat, protoTCP))
		picked[be.Addr()]++
	}
	if len(picked) < 2 {
		t.Fatalf("30 Maglev flows all reached %v: the table names three backends", picked)
	}

	allowed := netip.MustParseAddrPort("[2001:db8::7]:5000")
	denied := netip.MustParseAddrPort("[2001:db9::7]:5000")
	if ret, _ := n.runXDP(t, d, n.data, bpftest.UDPPacket(allowed, ranged, []byte("x"))); ret != xdpTX {
		t.Fatalf("allowed source: XDP verdict %d, want XDP_TX", ret)
	}
	if ret, _ := n.runXDP(t, d, n.data, bpftest.UDPPacket(denied, ranged, []byte("x"))); ret != xdpDrop {
		t.Fatalf("source outside the ranges: XDP verdict %d, want XDP_DROP", ret)
	}
	if c := d.Counter(gen.SluiceCounterCNT_DROP_SRC_RANGE); c != 1 {
		t.Fatalf("source-range drops %d, want 1", c)
	}
	if got := xdpDecisions(t, d)[gen.SluiceXdpAccelDecisionXDP_ACCEL_DROPPED]; got != 1 {
		t.Fatalf("XDP drops counted %d, want 1", got)
	}
}

// With events on, a flow XDP starts writes its start (with its backend)
// and a flow XDP refuses its drop (with the reason TC would give), both
// naming the data interface, in each family.
func TestXDPAccelWritesEvents(t *testing.T) {
	n := newXDPNode(t)
	n.withIPv6()
	for _, fam := range []struct {
		name           string
		front, remote  netip.AddrPort
		client, denied netip.AddrPort
		rangeKey       any
		family         uint8
	}{
		{"IPv4", netip.AddrPortFrom(nodeIP, 30096), netip.MustParseAddrPort("10.3.0.4:8080"),
			netip.MustParseAddrPort("198.51.100.7:5000"), netip.MustParseAddrPort("192.0.2.7:5000"),
			gen.SluiceSrcrangeKey{Prefixlen: 32 + 24, SvcId: gen.NetUint32(26), Src: gen.NetAddr(netip.MustParseAddr("198.51.100.0"))}, 4},
		{"IPv6", netip.AddrPortFrom(node6, 30096), netip.MustParseAddrPort("[fd00:3::4]:8080"),
			netip.MustParseAddrPort("[2001:db8::7]:5000"), netip.MustParseAddrPort("[2001:db9::7]:5000"),
			gen.SluiceSrcrange6Key{Prefixlen: 32 + 64, SvcId: gen.NetUint32(26), Src: netip.MustParseAddr("2001:db8::").As16()}, 6},
	} {
		t.Run(fam.name, func(t *testing.T) {
			d := newDP6(t)
			rd := eventsOn(t, d, 100, true)
			d.AddService(bpftest.Service{ID: 26, Front: fam.front, Proto: protoTCP, Backends: []bpftest.Backend{{AP: fam.remote}},
				Flags: gen.SluiceFeFlagsFE_EXTERNAL | gen.SluiceFeFlagsFE_SRC_RANGES})
			m := d.Objs.SlSrcrangeV1
			if fam.family == 6 {
				m = d.Objs.SlSrcrange6V1
			}
			d.Put(m, fam.rangeKey, gen.SluiceSrcrangeValue{})
			if ret, _ := n.runXDP(t, d, n.data, bpftest.TCPPacket(fam.client, fam.front, bpftest.SYN)); ret != xdpTX {
				t.Fatalf("allowed flow: XDP verdict %d, want XDP_TX", ret)
			}
			if ret, _ := n.runXDP(t, d, n.data, bpftest.TCPPacket(fam.denied, fam.front, bpftest.SYN)); ret != xdpDrop {
				t.Fatalf("refused flow: XDP verdict %d, want XDP_DROP", ret)
			}
			evs := readEvents(t, rd)
			if len(evs) != 2 {
				t.Fatalf("%d events %+v, want a start and a drop", len(evs), evs)
			}
			start, drop := evs[0], evs[1]
			if start.Type != gen.SluiceEventTypeEV_FLOW_START || evAddr(start.Saddr, start.Sport) != fam.client ||
				evAddr(start.Daddr, start.Dport) != fam.front || evAddr(start.NatAddr, start.NatPort) != fam.remote ||
				start.SvcId != 26 || start.Family != fam.family || start.Ifindex != uint32(n.data) || start.Hook != 2 /* HOOK_FROM_HOST */ {
				t.Fatalf("start event %+v", start)
			}
			if drop.Type != gen.SluiceEventTypeEV_DROP || drop.Reason != uint32(gen.SluiceCounterCNT_DROP_SRC_RANGE) ||
				evAddr(drop.Saddr, drop.Sport) != fam.denied || evAddr(drop.Daddr, drop.Dport) != fam.front ||
				drop.Family != fam.family || drop.Ifindex != uint32(n.data) || drop.Proto != protoTCP {
				t.Fatalf("drop event %+v", drop)
			}
		})
	}
}

// stackForwarded is a frame TC passed to the stack as the stack forwards
// it: the next hop's MACs, the TTL one less and the IPv4 header checksum
// (options included) computed again.
func stackForwarded(frame []byte, from, to net.HardwareAddr) []byte {
	f := slices.Clone(frame)
	copy(f[0:6], to)
	copy(f[6:12], from)
	ihl := int(f[14]&0x0f) * 4
	f[14+8]--
	f[14+10], f[14+11] = 0, 0
	binary.BigEndian.PutUint16(f[14+10:], ^bpftest.OnesSum(f[14:14+ihl], 0))
	return f
}

// DSR at XDP: a new flow's first packet (a SYN, a datagram) gets the
// option TC inserts and TC's DNAT, with TC's entries; an established TCP
// segment is DNATed alone and each later datagram carries the option again,
// as at TC; a datagram the option would make too big for its link passes
// to TC, which answers or fragments it.
func TestXDPAccelSendsDSRFlows(t *testing.T) {
	n := newXDPNode(t)
	remote := netip.MustParseAddrPort("10.3.0.4:8080")
	for _, proto := range []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP} {
		t.Run(proto.String(), func(t *testing.T) {
			front := netip.AddrPortFrom(nodeIP, 30097)
			d, tcOnly := dsrPair(t, newDP, front, remote, proto), dsrPair(t, newDP, front, remote, proto)
			spec := func(flags uint8, payload string) bpftest.PacketSpec {
				return bpftest.PacketSpec{Src: extAP, Dst: front, Proto: proto, TCPFlags: flags, Seq: 1000, Payload: []byte(payload)}
			}
			first, ack, psh := flowFlags(proto)
			same := func(what string, frame []byte, wantDecision gen.SluiceXdpAccelDecision) {
				t.Helper()
				tcRet, tcOut := n.runTC(t, tcOnly, frame)
				before := xdpDecisions(t, d)[wantDecision]
				ret, out := n.runXDP(t, d, n.data, frame)
				if tcRet != actOK {
					t.Fatalf("%s at TC: verdict %d, want TC_ACT_OK (the stack forwards a DSR packet)", what, tcRet)
				}
				want := stackForwarded(tcOut, n.dataMAC, n.remoteMAC)
				if ret != xdpTX || !bytes.Equal(out, want) {
					t.Fatalf("%s: XDP verdict %d, frame %x; want XDP_TX of TC's frame, forwarded: %x", what, ret, out, want)
				}
				if got := xdpDecisions(t, d)[wantDecision]; got != before+1 {
					t.Fatalf("%s: decision %d counted %d times, want once", what, wantDecision, got-before)
				}
			}

			// The first packet: the option, the DNAT, the entries.
			same("the first packet", bpftest.Build(spec(first, "a")), gen.SluiceXdpAccelDecisionXDP_ACCEL_TX)
			sameEntries(t, d, tcOnly, bpftest.CtKey(extAP, front, uint8(proto)), bpftest.CtKey(remote, extAP, uint8(proto)))
			if c := d.Counter(gen.SluiceCounterCNT_DSR_SENT); c != 1 {
				t.Fatalf("DSR options sent %d, want 1", c)
			}
			// The client's second packet changes the flow's state (TCP: the
			// first ACK; UDP: the first datagram after the flow's first):
			// TC's.
			second := bpftest.Build(spec(ack, "b"))
			if ret, _ := n.runXDP(t, d, n.data, second); ret != xdpPass {
				t.Fatalf("the second packet: XDP verdict %d, want XDP_PASS", ret)
			}
			n.runTC(t, d, second)
			n.runTC(t, tcOnly, second)
			same("an established packet", bpftest.Build(spec(psh, "GET / HTTP/1.1\r\n")), gen.SluiceXdpAccelDecisionXDP_ACCEL_TX)
			// The option: the first packet's, and UDP's every datagram's.
			wantSent := uint64(1)
			if proto == layers.IPProtocolUDP {
				wantSent = 3
			}
			if c := d.Counter(gen.SluiceCounterCNT_DSR_SENT); c != wantSent {
				t.Fatalf("DSR options sent %d, want %d", c, wantSent)
			}

			if proto == layers.IPProtocolUDP {
				big := bpftest.Build(spec(psh, strings.Repeat("x", 1500-20-8-4)))
				before := xdpDecisions(t, d)[gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_FIB]
				if ret, out := n.runXDP(t, d, n.data, big); ret != xdpPass || !bytes.Equal(out[:len(big)], big) {
					t.Fatalf("a datagram the option makes too big: XDP verdict %d, want XDP_PASS unchanged", ret)
				}
				if got := xdpDecisions(t, d)[gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_FIB]; got != before+1 {
					t.Fatalf("pass_fib counted %d times, want once", got-before)
				}
			}
		})
	}
}

// IPv6 DSR at XDP: a new flow's first packet gets the destination options
// header TC inserts and TC's DNAT, with TC's entries; an established TCP
// segment is DNATed alone and each later datagram carries the header again,
// as at TC, forwarded as the stack forwards TC's frame. A first datagram
// the header would take past 1,280 bytes is SNATed at XDP as at TC.
func TestXDPAccelSendsIPv6DSRFlows(t *testing.T) {
	n := newXDPNode(t)
	_, remoteMAC := n.withIPv6()
	remote := netip.MustParseAddrPort("[fd00:3::4]:8080")
	for _, proto := range []layers.IPProtocol{layers.IPProtocolTCP, layers.IPProtocolUDP} {
		t.Run(proto.String(), func(t *testing.T) {
			front := netip.AddrPortFrom(node6, 30097)
			d, tcOnly := dsrPair(t, newDP6, front, remote, proto), dsrPair(t, newDP6, front, remote, proto)
			spec := func(src netip.AddrPort, flags uint8, payload string) bpftest.PacketSpec {
				return bpftest.PacketSpec{Src: src, Dst: front, Proto: proto, TCPFlags: flags, Seq: 1000, Payload: []byte(payload)}
			}
			first, ack, psh := flowFlags(proto)
			same := func(what string, frame []byte) {
				t.Helper()
				tcRet, tcOut := n.runTC(t, tcOnly, frame)
				before := xdpDecisions(t, d)[gen.SluiceXdpAccelDecisionXDP_ACCEL_TX]
				ret, out := n.runXDP(t, d, n.data, frame)
				want := slices.Clone(tcOut)
				copy(want[0:6], remoteMAC)
				copy(want[6:12], n.dataMAC)
				want[14+7]-- // the hop limit
				if tcRet != actOK || ret != xdpTX || !bytes.Equal(out, want) {
					t.Fatalf("%s: TC verdict %d, XDP verdict %d, frame %x; want XDP_TX of TC's frame, forwarded: %x",
						what, tcRet, ret, out, want)
				}
				if got := xdpDecisions(t, d)[gen.SluiceXdpAccelDecisionXDP_ACCEL_TX]; got != before+1 {
					t.Fatalf("%s: tx counted %d times, want once", what, got-before)
				}
			}

			// The first packet: the header, the DNAT, the entries.
			same("the first packet", bpftest.Build(spec(ext6, first, "a")))
			sameEntries6(t, d, tcOnly, bpftest.CtKey6(ext6, front, uint8(proto)), bpftest.CtKey6(remote, ext6, uint8(proto)))
			if c := d.Counter(gen.SluiceCounterCNT_DSR_SENT); c != 1 {
				t.Fatalf("DSR headers sent %d, want 1", c)
			}
			if fwd, _ := d.CT6(bpftest.CtKey6(ext6, front, uint8(proto))); fwd.Flags&gen.SluiceCtFlagsCT_DSR == 0 {
				t.Fatalf("the flow's entry %+v is not DSR's", fwd)
			}
			// The client's second packet changes the flow's state: TC's.
			second := bpftest.Build(spec(ext6, ack, "b"))
			before := xdpDecisions(t, d)[gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_STATE]
			if ret, _ := n.runXDP(t, d, n.data, second); ret != xdpPass || xdpDecisions(t, d)[gen.SluiceXdpAccelDecisionXDP_ACCEL_PASS_STATE] != before+1 {
				t.Fatalf("the second packet: XDP verdict %d, decisions %v; want XDP_PASS counted as pass_state", ret, xdpDecisions(t, d))
			}
			n.runTC(t, d, second)
			n.runTC(t, tcOnly, second)
			same("an established packet", bpftest.Build(spec(ext6, psh, "GET / HTTP/1.1\r\n")))
			wantSent := uint64(1)
			if proto == layers.IPProtocolUDP {
				wantSent = 3
			}
			if c := d.Counter(gen.SluiceCounterCNT_DSR_SENT); c != wantSent {
				t.Fatalf("DSR headers sent %d, want %d", c, wantSent)
			}

			if proto == layers.IPProtocolUDP {
				// 1,260 bytes: 1,284 with the header.
				client := netip.AddrPortFrom(ext6.Addr(), 5001)
				same("a first datagram too big for the header", bpftest.Build(spec(client, 0, strings.Repeat("x", 1260-40-8))))
				sameEntries6(t, d, tcOnly, bpftest.CtKey6(client, front, uint8(proto)), bpftest.CtKey6(remote, netip.AddrPortFrom(node6, client.Port()), uint8(proto)))
				if c := d.Counter(gen.SluiceCounterCNT_DSR_SENT); c != wantSent {
					t.Fatalf("DSR headers sent %d after a datagram SNATed, want %d", c, wantSent)
				}
			}
		})
	}
}

// flowFlags are the TCP flags of a flow's first packet, of its second (the
// first ACK) and of an established one; a UDP flow's are none.
func flowFlags(proto layers.IPProtocol) (first, ack, psh uint8) {
	if proto == layers.IPProtocolUDP {
		return 0, 0, 0
	}
	return bpftest.SYN, bpftest.ACK, bpftest.ACK | bpftest.PSH
}

// dsrPair is a datapath (newDP's family) with DSR on for TCP and UDP and
// an external frontend front whose one backend, remote, is on another node.
func dsrPair(t *testing.T, newDP func(testing.TB) *bpftest.Datapath, front, remote netip.AddrPort, proto layers.IPProtocol) *bpftest.Datapath {
	d := newDP(t)
	d.Put(d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP),
		Flags: gen.SluiceConfigFlagsCFG_DSR_TCP | gen.SluiceConfigFlagsCFG_DSR_UDP})
	d.AddService(bpftest.Service{ID: 27, Front: front, Proto: uint8(proto), Backends: []bpftest.Backend{{AP: remote}},
		Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	return d
}

// spreadMaglev gives Service id a Maglev table that names its three
// backends in turn, unevenly.
func spreadMaglev(d *bpftest.Datapath, id uint32) {
	table := make([]uint32, gen.MaglevDefaultTableSize)
	for i := range table {
		table[i] = uint32(i*7/5) % 3
	}
	d.SetMaglevTable(id, table)
}
