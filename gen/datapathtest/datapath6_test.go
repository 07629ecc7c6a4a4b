package datapathtest_test

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// The IPv6 twins of datapath_test.go's tests, on the IPv6 maps.

var (
	client6  = netip.MustParseAddrPort("[fd00:1::5]:41234")
	vip6     = netip.MustParseAddrPort("[fd00:96::10]:80")
	be1v6    = netip.MustParseAddrPort("[fd00:2::7]:8080")
	be2v6    = netip.MustParseAddrPort("[fd00:2::8]:8080")
	node6    = netip.MustParseAddr("fd00::1")
	ext6     = netip.MustParseAddrPort("[2001:db8::9]:50000")
	wildcard = netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")
)

func newDP6(tb testing.TB) *bpftest.Datapath {
	d := bpftest.NewDatapath(tb, nodeIP)
	d.SetNodeIP6(node6)
	return d
}

func web6() bpftest.Service {
	return bpftest.Service{ID: 1, Front: vip6, Proto: protoTCP, Backends: []bpftest.Backend{{AP: be1v6}}}
}

func TestIPv6ClusterIPTCPFlowBothWays(t *testing.T) {
	d := newDP6(t)
	d.AddService(web6())

	syn := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(client6, vip6, bpftest.SYN))
	wantAP(t, "SYN destination", syn.Dst, be1v6)
	wantAP(t, "SYN source", syn.Src, client6)
	if syn.IP6 == nil || !syn.TCP.SYN || syn.TCP.ACK {
		t.Fatalf("not an IPv6 SYN: %v", syn.Packet)
	}
	fwd, ok := d.CT6(bpftest.CtKey6(client6, vip6, protoTCP))
	if !ok {
		t.Fatal("no forward conntrack entry")
	}
	rev, ok := d.CT6(bpftest.CtKey6(be1v6, client6, protoTCP))
	if !ok {
		t.Fatal("no reverse conntrack entry")
	}
	if fwd.Type != gen.SluiceCtTypeCT_FORWARD || rev.Type != gen.SluiceCtTypeCT_REVERSE ||
		fwd.Peer != bpftest.CtKey6(be1v6, client6, protoTCP) || rev.Peer != bpftest.CtKey6(client6, vip6, protoTCP) {
		t.Fatalf("entries: fwd %+v rev %+v", fwd, rev)
	}
	if gen.AddrFromNet6(fwd.NatAddr) != be1v6.Addr() || gen.PortFromNet(fwd.NatPort) != be1v6.Port() ||
		gen.AddrFromNet6(rev.NatAddr) != vip6.Addr() || gen.PortFromNet(rev.NatPort) != vip6.Port() {
		t.Fatalf("NAT addresses: fwd %+v rev %+v", fwd, rev)
	}
	if fwd.SvcId != 1 || fwd.TcpSeen&0x02 == 0 || fwd.Created == 0 || fwd.Flags&gen.SluiceCtFlagsCT_SNAT != 0 {
		t.Fatalf("forward entry %+v", fwd)
	}
	if d.CT6Count() != 2 {
		t.Fatalf("%d IPv6 conntrack entries, want 2", d.CT6Count())
	}

	synack := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(be1v6, client6, bpftest.SYN|bpftest.ACK))
	wantAP(t, "reply source", synack.Src, vip6)
	wantAP(t, "reply destination", synack.Dst, client6)

	// Established flows live on conntrack alone, at every hook.
	if err := d.Objs.SlFe6V1.Delete(bpftest.FeKey6(vip6, protoTCP)); err != nil {
		t.Fatal(err)
	}
	for _, prog := range []*ebpf.Program{d.Objs.SlFromWl, d.Objs.SlToWl, d.Objs.SlFromHost, d.Objs.SlToHost} {
		out := d.RunOK(prog, bpftest.TCPPacket(client6, vip6, bpftest.ACK|bpftest.PSH))
		wantAP(t, "ACK destination on "+prog.String(), out.Dst, be1v6)
	}
	// The IPv4 maps were not touched.
	var k gen.SluiceCtKey
	var v gen.SluiceCtValue
	if d.Objs.SlCtV2.Iterate().Next(&k, &v) {
		t.Fatalf("an IPv6 flow wrote the IPv4 conntrack map: %+v", k)
	}
}

func TestIPv6UDPBothWaysAndSpread(t *testing.T) {
	d := newDP6(t)
	dns := netip.MustParseAddrPort("[fd00:96::53]:53")
	d.AddService(bpftest.Service{ID: 2, Front: dns, Proto: protoUDP, Backends: []bpftest.Backend{{AP: be1v6}, {AP: be2v6}}})

	hits := map[netip.AddrPort]int{}
	for port := range uint16(100) {
		src := netip.AddrPortFrom(client6.Addr(), 20000+port)
		q := d.RunOK(d.Objs.SlFromWl, bpftest.UDPPacket(src, dns, []byte("query")))
		if !bytes.Equal(q.UDP.Payload, []byte("query")) {
			t.Fatalf("payload %q", q.UDP.Payload)
		}
		hits[q.Dst]++
		r := d.RunOK(d.Objs.SlFromWl, bpftest.UDPPacket(q.Dst, src, []byte("answer")))
		wantAP(t, "answer source", r.Src, dns)
		wantAP(t, "answer destination", r.Dst, src)
	}
	if len(hits) != 2 || hits[be1v6] < 20 || hits[be2v6] < 20 {
		t.Fatalf("100 flows spread %v over two backends", hits)
	}
}

func TestIPv6NodePortToRemoteBackendIsSNATedAndWildcard(t *testing.T) {
	d := newDP6(t)
	remote := netip.MustParseAddrPort("[fd00:3::4]:8080")
	d.AddService(bpftest.Service{ID: 6, Front: netip.AddrPortFrom(wildcard, 30082), Proto: protoTCP,
		Backends: []bpftest.Backend{{AP: remote}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	np := netip.AddrPortFrom(node6, 30082)

	out := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(ext6, np, bpftest.SYN))
	wantAP(t, "destination", out.Dst, remote)
	if out.Src.Addr() != node6 {
		t.Fatalf("source %v, want the node's IPv6 address", out.Src)
	}
	// A second client with the same source port gets another SNAT port.
	ext2 := netip.AddrPortFrom(netip.MustParseAddr("2001:db8::10"), ext6.Port())
	out2 := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(ext2, np, bpftest.SYN))
	if out2.Src == out.Src || out2.Src.Addr() != node6 {
		t.Fatalf("second client SNATed to %v, first to %v", out2.Src, out.Src)
	}
	r := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(remote, out.Src, bpftest.SYN|bpftest.ACK))
	wantAP(t, "reply source", r.Src, np)
	wantAP(t, "reply destination", r.Dst, ext6)
	r2 := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(remote, out2.Src, bpftest.SYN|bpftest.ACK))
	wantAP(t, "second reply destination", r2.Dst, ext2)

	// From a pod, the same NodePort keeps the pod's address.
	pod := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(client6, np, bpftest.SYN))
	wantAP(t, "pod source", pod.Src, client6)
	// An address that is not the node's is no NodePort.
	other := netip.AddrPortFrom(netip.MustParseAddr("fd00::99"), 30082)
	if got := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(ext6, other, bpftest.SYN)); got.Dst != other {
		t.Fatalf("a packet to %v was translated to %v", other, got.Dst)
	}
}

func TestIPv6ExternalTrafficPolicyLocalAndSourceRanges(t *testing.T) {
	d := newDP6(t)
	np := netip.AddrPortFrom(node6, 30090)
	d.AddService(bpftest.Service{ID: 7, Front: np, Proto: protoTCP, Backends: []bpftest.Backend{{AP: be1v6}},
		Flags: gen.SluiceFeFlagsFE_EXTERNAL | gen.SluiceFeFlagsFE_EXT_LOCAL | gen.SluiceFeFlagsFE_SRC_RANGES})
	d.Put(d.Objs.SlSrcrange6V1, gen.SluiceSrcrange6Key{Prefixlen: 32 + 64, SvcId: gen.NetUint32(7),
		Src: gen.NetAddr6(netip.MustParseAddr("2001:db8::"))}, gen.SluiceSrcrangeValue{})

	outside := netip.MustParseAddrPort("[2001:db9::1]:40000")
	ret, _ := d.Run(d.Objs.SlFromHost, bpftest.TCPPacket(outside, np, bpftest.SYN))
	if ret != actShot || d.Counter(gen.SluiceCounterCNT_DROP_SRC_RANGE) != 1 {
		t.Fatalf("source outside the ranges: verdict %d, src-range drops %d", ret, d.Counter(gen.SluiceCounterCNT_DROP_SRC_RANGE))
	}
	// Inside the range, but no local backend with eTP Local: dropped.
	ret, _ = d.Run(d.Objs.SlFromHost, bpftest.TCPPacket(ext6, np, bpftest.SYN))
	if ret != actShot || d.Counter(gen.SluiceCounterCNT_DROP_NO_LOCAL_BACKEND) != 1 {
		t.Fatalf("eTP Local without local backends: verdict %d", ret)
	}
	// With a local backend, the client's address is kept.
	d.AddService(bpftest.Service{ID: 7, Front: np, Proto: protoTCP, Backends: []bpftest.Backend{{AP: be1v6, Local: true}},
		Flags: gen.SluiceFeFlagsFE_EXTERNAL | gen.SluiceFeFlagsFE_EXT_LOCAL | gen.SluiceFeFlagsFE_SRC_RANGES})
	out := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(ext6, np, bpftest.SYN))
	wantAP(t, "destination", out.Dst, be1v6)
	wantAP(t, "source", out.Src, ext6)
}

func TestIPv6SessionAffinity(t *testing.T) {
	d := newDP6(t)
	s := web6()
	s.Backends = []bpftest.Backend{{AP: be1v6}, {AP: be2v6}}
	s.Affinity = 60
	d.AddService(s)
	first := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(client6, vip6, bpftest.SYN)).Dst
	for port := range uint16(30) {
		src := netip.AddrPortFrom(client6.Addr(), 30000+port)
		wantAP(t, "affine backend", d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(src, vip6, bpftest.SYN)).Dst, first)
	}
}

func TestIPv6NoEndpointsRejects(t *testing.T) {
	d := newDP6(t)
	d.AddService(bpftest.Service{ID: 3, Front: vip6, Proto: protoTCP})
	dns := netip.AddrPortFrom(vip6.Addr(), 53)
	d.AddService(bpftest.Service{ID: 4, Front: dns, Proto: protoUDP})

	syn := bpftest.Build(bpftest.PacketSpec{Src: client6, Dst: vip6, Proto: layers.IPProtocolTCP, TCPFlags: bpftest.SYN, Seq: 1000})
	ret, out := d.Run(d.Objs.SlFromWl, syn)
	if ret != actRedirect {
		t.Fatalf("verdict %d, want a redirect back", ret)
	}
	rst, err := bpftest.Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	if rst.TCP == nil || !rst.TCP.RST || !rst.TCP.ACK || rst.TCP.Ack != 1001 {
		t.Fatalf("reply %v, want RST+ACK acking 1001", rst.Packet)
	}
	wantAP(t, "RST source", rst.Src, vip6)
	wantAP(t, "RST destination", rst.Dst, client6)

	ret, out = d.Run(d.Objs.SlFromWl, bpftest.UDPPacket(client6, dns, []byte("query")))
	if ret != actRedirect {
		t.Fatalf("UDP verdict %d, want a redirect back", ret)
	}
	unreach, err := bpftest.Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	if unreach.ICMP6 == nil || unreach.ICMP6.TypeCode != layers.CreateICMPv6TypeCode(1, 4) {
		t.Fatalf("reply %v, want ICMPv6 port unreachable", unreach.Packet)
	}
	if unreach.Src.Addr() != vip6.Addr() || unreach.Dst.Addr() != client6.Addr() {
		t.Fatalf("unreachable from %v to %v", unreach.Src, unreach.Dst)
	}
	// The quote is the datagram as sent: its ports let the client's stack
	// find the socket.
	quote := unreach.ICMP6.Payload[4:]
	if len(quote) != 48 || binary.BigEndian.Uint16(quote[40:42]) != client6.Port() || binary.BigEndian.Uint16(quote[42:44]) != 53 {
		t.Fatalf("quote % x", quote)
	}
	if d.Counter(gen.SluiceCounterCNT_REJECT_NO_ENDPOINTS) != 2 || d.CT6Count() != 0 {
		t.Fatalf("rejects %d, conntrack %d", d.Counter(gen.SluiceCounterCNT_REJECT_NO_ENDPOINTS), d.CT6Count())
	}
}

// Path-MTU discovery through the proxy: a Packet Too Big from the backend's
// path about a DNATed flow reaches the client as if the service sent it.
func TestIPv6PacketTooBigIsReverseTranslated(t *testing.T) {
	d := newDP6(t)
	d.AddService(web6())
	d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(client6, vip6, bpftest.SYN))

	// The backend's node says the segment client -> backend was too big.
	quoted := bpftest.TCPPacket(client6, be1v6, bpftest.ACK)[14:]
	ptb := bpftest.Build(bpftest.PacketSpec{Src: netip.AddrPortFrom(be1v6.Addr(), 0), Dst: netip.AddrPortFrom(client6.Addr(), 0),
		Proto: layers.IPProtocolICMPv6, ICMPType: 2, Payload: append([]byte{0, 0, 0x05, 0x00}, quoted...)})
	out := d.RunOK(d.Objs.SlToWl, ptb)
	if out.ICMP6 == nil || out.ICMP6.TypeCode.Type() != 2 {
		t.Fatalf("not a Packet Too Big: %v", out.Packet)
	}
	if out.Src.Addr() != vip6.Addr() || out.Dst.Addr() != client6.Addr() {
		t.Fatalf("outer %v -> %v, want the service address -> the client", out.Src, out.Dst)
	}
	q := out.ICMP6.Payload[4:]
	if mtu := binary.BigEndian.Uint16(out.ICMP6.Payload[2:4]); mtu != 1280 {
		t.Fatalf("MTU %d changed", mtu)
	}
	if got := netip.AddrFrom16([16]byte(q[24:40])); got != vip6.Addr() {
		t.Fatalf("quoted destination %v, want the service address", got)
	}
	if port := binary.BigEndian.Uint16(q[42:44]); port != vip6.Port() {
		t.Fatalf("quoted destination port %d", port)
	}
	if d.Counter(gen.SluiceCounterCNT_ICMP_ERROR_TRANSLATED) != 1 {
		t.Fatal("translation not counted")
	}
}

func TestIPv6EchoToServiceIPAndNDPUntouched(t *testing.T) {
	d := newDP6(t)
	d.Put(d.Objs.SlFe6V1, bpftest.FeKey6(netip.AddrPortFrom(vip6.Addr(), 0), bpftest.ProtoICMPv6), gen.SluiceFeValue{})

	echo := bpftest.Build(bpftest.PacketSpec{Src: netip.AddrPortFrom(client6.Addr(), 0), Dst: netip.AddrPortFrom(vip6.Addr(), 0),
		Proto: layers.IPProtocolICMPv6, ICMPType: 128, ICMPID: 7, Payload: []byte("ping")})
	ret, out := d.Run(d.Objs.SlFromWl, echo)
	if ret != actRedirect {
		t.Fatalf("verdict %d, want the reply sent back", ret)
	}
	reply, err := bpftest.Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	if reply.ICMP6.TypeCode.Type() != 129 || reply.Src.Addr() != vip6.Addr() || reply.Dst.Addr() != client6.Addr() {
		t.Fatalf("reply %v", reply.Packet)
	}

	// Neighbour solicitation for the service address is the stack's.
	ns := bpftest.Build(bpftest.PacketSpec{Src: netip.AddrPortFrom(client6.Addr(), 0), Dst: netip.AddrPortFrom(netip.MustParseAddr("ff02::1:ff00:10"), 0),
		Proto: layers.IPProtocolICMPv6, ICMPType: 135, Payload: append(make([]byte, 4), vip6.Addr().AsSlice()...)})
	ret, out = d.Run(d.Objs.SlFromWl, ns)
	if ret != actOK || !bytes.Equal(out[:len(ns)], ns) {
		t.Fatalf("neighbour solicitation: verdict %d, changed %v", ret, !bytes.Equal(out[:len(ns)], ns))
	}
}

func TestIPv6ExtensionHeadersAreWalked(t *testing.T) {
	d := newDP6(t)
	d.AddService(web6())
	syn := bpftest.WithExtHeaders(bpftest.TCPPacket(client6, vip6, bpftest.SYN),
		bpftest.ExtHeader{Type: 0, Body: bpftest.PadOptions(1)},
		bpftest.ExtHeader{Type: 60, Body: bpftest.PadOptions(2)})
	out := d.RunOK(d.Objs.SlFromWl, syn)
	wantAP(t, "destination behind two extension headers", out.Dst, be1v6)

	// Nine headers are more than the parser walks: dropped, counted.
	var many []bpftest.ExtHeader
	for range 9 {
		many = append(many, bpftest.ExtHeader{Type: 60, Body: bpftest.PadOptions(1)})
	}
	src := netip.AddrPortFrom(client6.Addr(), 41235)
	ret, _ := d.Run(d.Objs.SlFromWl, bpftest.WithExtHeaders(bpftest.TCPPacket(src, vip6, bpftest.SYN), many...))
	if ret != actShot || d.Counter(gen.SluiceCounterCNT_DROP_MALFORMED) != 1 {
		t.Fatalf("nine extension headers: verdict %d, malformed %d", ret, d.Counter(gen.SluiceCounterCNT_DROP_MALFORMED))
	}

	// Every truncation of a packet with extension headers, inside them or
	// the TCP header, is handled: never translated half, never a crash.
	// (BPF_PROG_TEST_RUN refuses IPv6 frames shorter than the IPv6 header.)
	for n := 14 + 40; n < len(syn); n++ {
		cut := append([]byte(nil), syn[:n]...)
		binary.BigEndian.PutUint16(cut[18:20], uint16(n-14-40))
		opts := ebpf.RunOptions{Data: cut, DataOut: make([]byte, len(cut)+256)}
		ret, err := d.Objs.SlFromHost.Run(&opts)
		if err != nil {
			t.Fatalf("cut at %d: %v", n, err)
		}
		out := opts.DataOut
		if ret != actOK && ret != actShot {
			t.Fatalf("cut at %d: verdict %d", n, ret)
		}
		if ret == actOK && !bytes.Equal(out[:n], cut) {
			t.Fatalf("cut at %d: passed but changed", n)
		}
	}
}

func TestIPv6HairpinIsSNATedAndSentBack(t *testing.T) {
	d := newDP6(t)
	self := netip.AddrPortFrom(be1v6.Addr(), 45000)
	d.AddService(web6())
	ret, out := d.Run(d.Objs.SlFromWl, bpftest.TCPPacket(self, vip6, bpftest.SYN))
	if ret != actRedirect {
		t.Fatalf("verdict %d, want the SYN sent straight back", ret)
	}
	syn, err := bpftest.Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	wantAP(t, "destination", syn.Dst, be1v6)
	if syn.Src.Addr() != node6 {
		t.Fatalf("source %v, want the node's IPv6 address", syn.Src)
	}
	ret, out = d.Run(d.Objs.SlFromWl, bpftest.TCPPacket(be1v6, syn.Src, bpftest.SYN|bpftest.ACK))
	if ret != actRedirect {
		t.Fatalf("reply verdict %d", ret)
	}
	reply, err := bpftest.Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	wantAP(t, "reply source", reply.Src, vip6)
	wantAP(t, "reply destination", reply.Dst, self)
}

func TestIPv6FragmentedDatagramToAService(t *testing.T) {
	d := newDP6(t)
	dns := netip.MustParseAddrPort("[fd00:96::53]:53")
	d.AddService(bpftest.Service{ID: 2, Front: dns, Proto: protoUDP, Backends: []bpftest.Backend{{AP: be1v6}}})
	d.Put(d.Objs.SlFe6V1, bpftest.FeKey6(netip.AddrPortFrom(dns.Addr(), 0), bpftest.ProtoICMPv6), gen.SluiceFeValue{})
	payload := bytes.Repeat([]byte("0123456789abcdef"), 200) // 3200 bytes
	frags := bpftest.Fragment6(bpftest.UDPPacket(client6, dns, payload), 1232, 0xabcd)
	if len(frags) != 3 {
		t.Fatalf("%d fragments", len(frags))
	}
	for i, f := range frags {
		ret, out := d.Run(d.Objs.SlFromWl, f)
		if ret != actOK {
			t.Fatalf("fragment %d: verdict %d", i, ret)
		}
		dst := netip.AddrFrom16([16]byte(out[14+24 : 14+40]))
		if dst != be1v6.Addr() {
			t.Fatalf("fragment %d to %v, want the backend", i, dst)
		}
	}
	if d.Counter(gen.SluiceCounterCNT_FRAGMENT_TRANSLATED) != 2 {
		t.Fatalf("translated later fragments: %d", d.Counter(gen.SluiceCounterCNT_FRAGMENT_TRANSLATED))
	}
	// A later fragment whose first was never seen must not reach the
	// service address untranslated.
	late := bpftest.Fragment6(bpftest.UDPPacket(netip.AddrPortFrom(client6.Addr(), 999), dns, payload), 1232, 0x7777)[1]
	if ret, _ := d.Run(d.Objs.SlFromWl, late); ret != actShot {
		t.Fatalf("unknown later fragment: verdict %d, want dropped", ret)
	}
}

// The twin of TestFragmentsOfARejectedDatagramAreDropped: a later fragment
// whose first was answered with ICMPv6 port unreachable starts nothing and
// does not reach the Service's address.
func TestIPv6FragmentsOfARejectedDatagramAreDropped(t *testing.T) {
	d := newDP6(t)
	dns := netip.MustParseAddrPort("[fd00:96::53]:53")
	d.AddService(bpftest.Service{ID: 5, Front: dns, Proto: protoUDP}) // no endpoints
	frags := bpftest.Fragment6(bpftest.UDPPacket(client6, dns, bytes.Repeat([]byte("x"), 3000)), 1232, 0x5555)
	if ret, _ := d.Run(d.Objs.SlFromWl, frags[0]); ret != actRedirect {
		t.Fatalf("first fragment to a Service without endpoints: verdict %d, want the reject", ret)
	}
	for i, f := range frags[1:] {
		if ret, _ := d.Run(d.Objs.SlFromWl, f); ret != actShot {
			t.Fatalf("later fragment %d of a rejected datagram: verdict %d, want drop", i+1, ret)
		}
	}
	if d.CTCount() != 0 {
		t.Fatalf("%d conntrack entries", d.CTCount())
	}
}

// The twin of TestFragmentsOutOfOrderOrExpiredAreDroppedNotPassedToAService.
func TestIPv6FragmentsOutOfOrderOrExpiredAreDroppedNotPassedToAService(t *testing.T) {
	d := newDP6(t)
	dns := netip.MustParseAddrPort("[fd00:96::53]:53")
	d.AddService(bpftest.Service{ID: 2, Front: dns, Proto: protoUDP, Backends: []bpftest.Backend{{AP: be1v6}}})
	d.Put(d.Objs.SlFe6V1, bpftest.FeKey6(netip.AddrPortFrom(dns.Addr(), 0), bpftest.ProtoICMPv6), gen.SluiceFeValue{})
	datagram := func(dst netip.AddrPort, id uint32) [][]byte {
		return bpftest.Fragment6(bpftest.UDPPacket(client6, dst, bytes.Repeat([]byte("f"), 3000)), 1232, id)
	}
	// The last fragment before the first: nothing tells which flow it is.
	if ret, _ := d.Run(d.Objs.SlFromWl, datagram(dns, 0x1111)[2]); ret != actShot || d.Counter(gen.SluiceCounterCNT_DROP_FRAGMENT_UNKNOWN) != 1 {
		t.Fatalf("out-of-order fragment to a service IP: verdict %d, %d counted", ret, d.Counter(gen.SluiceCounterCNT_DROP_FRAGMENT_UNKNOWN))
	}
	// A later fragment of a datagram to another address passes untouched.
	other := datagram(netip.MustParseAddrPort("[fd00:9::9]:53"), 0x2222)[1]
	if ret, out := d.Run(d.Objs.SlFromWl, other); ret != actOK || !bytes.Equal(out[:len(other)], other) {
		t.Fatalf("unknown fragment to a non-service address: verdict %d or changed", ret)
	}
	if d.Counter(gen.SluiceCounterCNT_PASS_FRAGMENT) != 1 {
		t.Fatal("passed unknown fragment not counted")
	}
	// An expired first fragment no longer serves its datagram.
	late := datagram(dns, 0x3333)
	d.RunOK(d.Objs.SlFromWl, late[0])
	key := gen.SluiceFrag6Key{Saddr: gen.NetAddr6(client6.Addr()), Daddr: gen.NetAddr6(dns.Addr()), Id: gen.NetUint32(0x3333), Proto: protoUDP}
	var v gen.SluiceFragValue
	if err := d.Objs.SlFrag6V1.Lookup(key, &v); err != nil {
		t.Fatalf("first fragment not recorded: %v", err)
	}
	v.Created -= uint64(31 * time.Second)
	d.Put(d.Objs.SlFrag6V1, key, v)
	if ret, _ := d.Run(d.Objs.SlFromWl, late[1]); ret != actShot {
		t.Fatalf("fragment of an expired datagram: verdict %d, want drop", ret)
	}
}

func TestIPv4PathIgnoresIPv6Maps(t *testing.T) {
	// An IPv4 flow and an IPv6 flow to services with the same id side by
	// side (a dual-stack Service is one id per family).
	d := newDP6(t)
	d.AddService(webService())
	d.AddService(web6())
	v4 := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.SYN))
	v6 := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(client6, vip6, bpftest.SYN))
	wantAP(t, "IPv4", v4.Dst, be1AP)
	wantAP(t, "IPv6", v6.Dst, be1v6)
	if d.CTCount() != 4 || d.CT6Count() != 2 {
		t.Fatalf("conntrack: %d entries, %d IPv6", d.CTCount(), d.CT6Count())
	}
}
