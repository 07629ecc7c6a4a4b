package datapathtest_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket/layers"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/netlab"
)

// An ICMP error about a reply, from a router on the client's path, reaches
// the backend as if about the packet it sent (icmp_error_rnat,
// icmp6_error_rnat): the reply left the node from the NodePort, SNATed flow
// or not, and the error comes back to the NodePort address.
func TestICMPErrorAboutAReplyGoesToTheBackend(t *testing.T) {
	for _, fam := range []struct {
		name             string
		node, ext        netip.AddrPort
		remote           netip.AddrPort
		wildcard, router netip.Addr
		setNode          func(*bpftest.Datapath)
		icmp             layers.IPProtocol
		typ              uint8
		ipLen            int
		addrAt           [2]int // quoted source and destination address offsets
	}{
		{"IPv4", netip.AddrPortFrom(nodeIP, 30090), extAP, netip.MustParseAddrPort("10.3.0.4:8080"),
			netip.MustParseAddr("255.255.255.255"), netip.MustParseAddr("192.0.2.254"), func(*bpftest.Datapath) {},
			layers.IPProtocolICMPv4, 3, 20, [2]int{12, 16}},
		{"IPv6", netip.AddrPortFrom(node6, 30090), ext6, netip.MustParseAddrPort("[fd00:3::4]:8080"),
			wildcard, netip.MustParseAddr("2001:db8:ffff::1"), func(d *bpftest.Datapath) { d.SetNodeIP6(node6) },
			layers.IPProtocolICMPv6, 2, 40, [2]int{8, 24}},
	} {
		t.Run(fam.name, func(t *testing.T) {
			d := newDP(t)
			fam.setNode(d)
			d.AddService(bpftest.Service{ID: 9, Front: netip.AddrPortFrom(fam.wildcard, fam.node.Port()), Proto: protoTCP,
				Backends: []bpftest.Backend{{AP: fam.remote}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
			syn := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(fam.ext, fam.node, bpftest.SYN))
			snat := syn.Src // the node's address and the port the backend sees
			// The backend's reply, translated on its way out.
			reply := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(fam.remote, snat, bpftest.ACK))
			wantAP(t, "reply", reply.Dst, fam.ext)
			quote := reply.Packet.Data()[14 : 14+fam.ipLen+8]
			payload := append([]byte{0, 0, 0x05, 0x00}, quote...) // MTU 1280 (IPv6) / unused+MTU (IPv4)
			if fam.icmp == layers.IPProtocolICMPv4 {
				payload = quote
			}
			err := bpftest.Build(bpftest.PacketSpec{Src: netip.AddrPortFrom(fam.router, 0), Dst: netip.AddrPortFrom(fam.node.Addr(), 0),
				Proto: fam.icmp, ICMPType: fam.typ, ICMPCode: map[uint8]uint8{3: 4, 2: 0}[fam.typ], Payload: payload})
			out := d.RunOK(d.Objs.SlFromHost, err)
			if out.Dst.Addr() != fam.remote.Addr() || out.Src.Addr() != fam.router {
				t.Fatalf("error %v -> %v: want it from the router to the backend", out.Src.Addr(), out.Dst.Addr())
			}
			var inner []byte
			if out.ICMP != nil {
				inner = out.ICMP.Payload
			} else {
				inner = out.ICMP6.Payload[4:]
			}
			src := netip.AddrPortFrom(addrAt(inner, fam.addrAt[0], fam.ipLen), binary.BigEndian.Uint16(inner[fam.ipLen:]))
			dst := netip.AddrPortFrom(addrAt(inner, fam.addrAt[1], fam.ipLen), binary.BigEndian.Uint16(inner[fam.ipLen+2:]))
			wantAP(t, "quoted source", src, fam.remote)
			wantAP(t, "quoted destination", dst, snat)
			if fam.icmp == layers.IPProtocolICMPv4 && ipChecksum(inner[:20]) != 0 {
				t.Fatal("quoted IP header checksum invalid")
			}
			if d.Counter(gen.SluiceCounterCNT_ICMP_ERROR_TRANSLATED) != 1 {
				t.Fatal("translation not counted")
			}
		})
	}
}

func addrAt(b []byte, off, ipLen int) netip.Addr {
	if ipLen == 20 {
		return netip.AddrFrom4([4]byte(b[off : off+4]))
	}
	return netip.AddrFrom16([16]byte(b[off : off+16]))
}

// TestRealPathMTUThroughANodePort: an external client behind a router
// downloads 2 MB from a NodePort backend, over IPv4 and IPv6, where one link
// on the way has an MTU of 1280. The client advertises a 1500-byte MTU's
// segment size, so the backend's segments are too big for that link, and
// only if the backend hears of it does its path MTU drop and the download
// finish (otherwise every large segment is lost and the transfer stalls).
//
//   - The router's link toward the client: the router's ICMP error goes to
//     the NodePort address, and the datapath hands it to the backend
//     (icmp_error_rnat).
//   - The node's own link toward the router: the node cannot send the error
//     to the reply's source, which is itself, so the datapath finds the MTU
//     as it forwards the reply and answers the backend (fib.h).
func TestRealPathMTUThroughANodePort(t *testing.T) {
	t.Run("router's link", func(t *testing.T) { pathMTUDownload(t, false) })
	t.Run("node's own link", func(t *testing.T) { pathMTUDownload(t, true) })
}

func pathMTUDownload(t *testing.T, narrowAtNode bool) {
	d := newDP(t)
	node := bpftest.NewNetNS(t)
	topo := &bpftest.Topology{DP: d, Node: node}
	for _, s := range []string{"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"} {
		node.Run("sysctl", "-qw", s)
	}
	backend := bpftest.NewPod(t, node, "slw0", netip.MustParsePrefix("10.200.0.2/24"), netip.MustParseAddr("10.200.0.1"))
	node.Run("ip", "addr", "add", "fd00:200::1/64", "dev", "slw0", "nodad")
	backend.Run("ip", "addr", "add", "fd00:200::2/64", "dev", "eth0", "nodad")
	backend.Run("ip", "-6", "route", "add", "default", "via", "fd00:200::1")
	topo.Attach(t, "slw0", d.Objs.SlFromWl, d.Objs.SlToWl)

	lab := &netlab.Lab{Prefix: bpftest.UniqueName("slmtu")}
	t.Cleanup(lab.Close)
	router, err := lab.Router("router")
	if err != nil {
		t.Fatal(err)
	}
	ext, err := lab.Namespace("ext")
	if err != nil {
		t.Fatal(err)
	}
	steps := [][]string{
		{"netns", "exec", router, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"},
		{"-n", node.Name, "addr", "add", "fd00:220::1/64", "dev", "sldata0", "nodad"},
		{"-n", router, "addr", "add", "fd00:220::2/64", "dev", "r0", "nodad"},
		{"-n", router, "addr", "add", "fd00:221::1/64", "dev", "r1", "nodad"},
		{"-n", ext, "addr", "add", "fd00:221::2/64", "dev", "eth0", "nodad"},
		{"-n", node.Name, "route", "add", "10.221.0.0/24", "via", "10.220.0.2"},
		{"-n", node.Name, "-6", "route", "add", "fd00:221::/64", "via", "fd00:220::2"},
		{"-n", ext, "route", "add", "default", "via", "10.221.0.1"},
		{"-n", ext, "-6", "route", "add", "default", "via", "fd00:221::1"},
	}
	if narrowAtNode {
		// Both ends: a veth delivers a GSO packet whatever the MTU, so
		// only the forwarding's own check (the FIB's, or the stack's)
		// sees the narrow link, as it would on a real NIC.
		steps = append(steps, []string{"-n", node.Name, "link", "set", "sldata0", "mtu", "1280"},
			[]string{"-n", router, "link", "set", "r0", "mtu", "1280"})
	} else {
		steps = append(steps, []string{"-n", router, "link", "set", "r1", "mtu", "1280"})
	}
	if err := netlab.AddVeth(netlab.End{NS: node.Name, Name: "sldata0", Addr: netip.MustParsePrefix("10.220.0.1/24")},
		netlab.End{NS: router, Name: "r0", Addr: netip.MustParsePrefix("10.220.0.2/24")}); err != nil {
		t.Fatal(err)
	}
	if err := netlab.AddVeth(netlab.End{NS: router, Name: "r1", Addr: netip.MustParsePrefix("10.221.0.1/24")},
		netlab.End{NS: ext, Name: "eth0", Addr: netip.MustParsePrefix("10.221.0.2/24")}); err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if _, err := netlab.IP(s...); err != nil {
			t.Fatal(err)
		}
	}
	topo.Attach(t, "sldata0", d.Objs.SlFromHost, d.Objs.SlToHost)
	nodeIP4, nodeIP6 := netip.MustParseAddr("10.220.0.1"), netip.MustParseAddr("fd00:220::1")
	d.Put(d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP4)})
	d.Put(d.Objs.SlHostipV1, gen.SluiceHostipKey{Addr: gen.NetAddr(nodeIP4)}, gen.SluiceHostipValue{})
	d.SetNodeIP6(nodeIP6)

	const size = 2 << 20
	for _, network := range []string{"tcp4", "tcp6"} {
		var ln net.Listener
		addr := ":8080"
		if network == "tcp6" {
			addr = "[::]:8080"
		}
		if err := backend.Do(func() (err error) { ln, err = net.Listen(network, addr); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Write(bytes.Repeat([]byte("x"), size))
				c.Close()
			}
		}()
	}
	d.AddService(bpftest.Service{ID: 1, Front: netip.MustParseAddrPort("255.255.255.255:30080"), Proto: protoTCP,
		Backends: []bpftest.Backend{{AP: netip.MustParseAddrPort("10.200.0.2:8080"), Local: true}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	d.AddService(bpftest.Service{ID: 2, Front: netip.AddrPortFrom(wildcard, 30080), Proto: protoTCP,
		Backends: []bpftest.Backend{{AP: netip.MustParseAddrPort("[fd00:200::2]:8080"), Local: true}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})

	extNS := &bpftest.NetNS{Name: ext}
	for _, f := range []struct{ target, client, family string }{
		{"10.220.0.1:30080", "10.221.0.2", "-4"}, {"[fd00:220::1]:30080", "fd00:221::2", "-6"},
	} {
		t.Run(f.target, func(t *testing.T) {
			before := d.Counter(gen.SluiceCounterCNT_ICMP_ERROR_TRANSLATED)
			var got int64
			err := extNS.Do(func() error {
				c, err := net.DialTimeout("tcp", f.target, 3*time.Second)
				if err != nil {
					return err
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				got, err = io.Copy(io.Discard, c)
				return err
			})
			if err != nil || got != size {
				logCounters(t, d)
				t.Fatalf("download through a 1280-byte link: %d of %d bytes (%v)", got, size, err)
			}
			if d.Counter(gen.SluiceCounterCNT_ICMP_ERROR_TRANSLATED) == before {
				t.Fatal("the download finished without an ICMP error translated: the test did not exercise path-MTU discovery")
			}
			// The backend's stack learnt the path's MTU toward the client.
			if route := backend.Run("ip", f.family, "route", "get", f.client); !strings.Contains(route, "mtu 1280") {
				t.Fatalf("the backend's route to the client holds no path MTU of 1280:\n%s", route)
			}
		})
	}
}
