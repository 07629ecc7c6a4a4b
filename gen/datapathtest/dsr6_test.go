package datapathtest_test

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// The IPv6 twins of dsr_test.go: the option rides in a Destination Options
// header (bpf/include/dsr6.h).
var (
	dsrFront6  = netip.AddrPortFrom(node6, 30090)
	dsrRemote6 = netip.MustParseAddrPort("[fd00:3::4]:8080")
	dsrOther6  = netip.MustParseAddrPort("[fd00:3::5]:8080")
)

func dsrNode6(t *testing.T, flags gen.SluiceConfigFlags, proto uint8, backends ...bpftest.Backend) *bpftest.Datapath {
	t.Helper()
	d := newDP6(t)
	d.Put(d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP), Flags: flags})
	d.AddService(bpftest.Service{ID: 9, Front: dsrFront6, Proto: proto, Backends: backends, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	return d
}

// dsrHeader6 is the Destination Options header naming front, before a
// header of protocol next.
func dsrHeader6(front netip.AddrPort, next byte) []byte {
	h := make([]byte, 24)
	h[0], h[1], h[2], h[3] = next, 2, 0x1e, 18
	a := front.Addr().As16()
	copy(h[4:], a[:])
	binary.BigEndian.PutUint16(h[20:], front.Port())
	h[22] = 1 // PadN of no data
	return h
}

// wantDSRHeader6 checks that an IPv6 frame carries the DSR header for front
// right after its IPv6 header, before an L4 header of protocol next.
func wantDSRHeader6(t *testing.T, what string, frame []byte, front netip.AddrPort, next byte) {
	t.Helper()
	if frame[14+6] != 60 || !bytes.Equal(frame[14+40:14+64], dsrHeader6(front, next)) {
		t.Fatalf("%s: next header %d, then % x; want the DSR header % x", what, frame[14+6], frame[14+40:14+64], dsrHeader6(front, next))
	}
}

func wantNoExtHeaders6(t *testing.T, what string, frame []byte) {
	t.Helper()
	if next := frame[14+6]; next != 6 && next != 17 {
		t.Fatalf("%s: next header %d, want TCP or UDP right after the IPv6 header", what, next)
	}
}

// runIPv6 runs prog and returns its verdict, the frame cut to its IPv6
// length, and the frame decoded (checksums verified).
func runIPv6(t *testing.T, d *bpftest.Datapath, prog *ebpf.Program, frame []byte) (uint32, []byte, *bpftest.Decoded) {
	t.Helper()
	ret, out := d.Run(prog, frame)
	n := 14 + 40 + int(binary.BigEndian.Uint16(out[14+4:]))
	dec, err := bpftest.Decode(out[:n])
	if err != nil {
		t.Fatal(err)
	}
	return ret, out[:n], dec
}

// The whole flow over IPv6: the balancing node keeps the client and adds
// the header to the SYN only; the backend's node removes it, and its
// backend's replies leave from the frontend.
func TestIPv6DSRBothNodes(t *testing.T) {
	front := dsrNode6(t, gen.SluiceConfigFlagsCFG_DSR_TCP, protoTCP, bpftest.Backend{AP: dsrRemote6})
	back := newDP6(t)

	ret, sent, syn := runIPv6(t, front, front.Objs.SlFromHost, bpftest.TCPPacket(ext6, dsrFront6, bpftest.SYN))
	if ret != actOK {
		t.Fatalf("balancing node verdict %d", ret)
	}
	wantAP(t, "SYN destination", syn.Dst, dsrRemote6)
	wantAP(t, "SYN source", syn.Src, ext6)
	wantDSRHeader6(t, "SYN", sent, dsrFront6, 6)
	fwd, ok := front.CT6(bpftest.CtKey6(ext6, dsrFront6, protoTCP))
	if !ok || fwd.Flags&gen.SluiceCtFlagsCT_DSR == 0 || fwd.Flags&gen.SluiceCtFlagsCT_SNAT != 0 {
		t.Fatalf("forward entry %+v (%v), want DSR without SNAT", fwd, ok)
	}

	ret, in, got := runIPv6(t, back, back.Objs.SlFromHost, sent)
	if ret != actOK {
		t.Fatalf("backend's node verdict %d", ret)
	}
	wantNoExtHeaders6(t, "SYN at the backend", in)
	wantAP(t, "SYN at the backend", got.Dst, dsrRemote6)
	wantAP(t, "SYN's source at the backend", got.Src, ext6)
	if !got.TCP.SYN || len(in) != len(sent)-24 {
		t.Fatalf("SYN at the backend: %d bytes, %d sent", len(in), len(sent))
	}
	if n := back.Counter(gen.SluiceCounterCNT_DSR_ACCEPTED); n != 1 {
		t.Fatalf("dsr_accepted %d, want 1", n)
	}
	ret, _, reply := runIPv6(t, back, back.Objs.SlFromWl, bpftest.TCPPacket(dsrRemote6, ext6, bpftest.SYN|bpftest.ACK))
	if ret != actOK && ret != actRedirect {
		t.Fatalf("reply verdict %d", ret)
	}
	wantAP(t, "reply source", reply.Src, dsrFront6)
	wantAP(t, "reply destination", reply.Dst, ext6)

	// The established segments carry no header, at either node.
	_, sent, ack := runIPv6(t, front, front.Objs.SlFromHost, bpftest.TCPPacket(ext6, dsrFront6, bpftest.ACK))
	wantNoExtHeaders6(t, "established segment", sent)
	wantAP(t, "established segment", ack.Dst, dsrRemote6)
	ret, _, _ = runIPv6(t, back, back.Objs.SlFromHost, sent)
	if ret != actOK {
		t.Fatalf("established segment at the backend: verdict %d", ret)
	}
}

// UDP: each datagram that fits 1,280 bytes with the header carries it; a
// first datagram that would not is SNATed instead; hybrid SNATs UDP.
func TestIPv6DSRUDP(t *testing.T) {
	d := dsrNode6(t, gen.SluiceConfigFlagsCFG_DSR_TCP|gen.SluiceConfigFlagsCFG_DSR_UDP, protoUDP, bpftest.Backend{AP: dsrRemote6})
	for range 2 {
		_, sent, out := runIPv6(t, d, d.Objs.SlFromHost, bpftest.UDPPacket(ext6, dsrFront6, []byte("query")))
		wantAP(t, "datagram", out.Src, ext6)
		wantDSRHeader6(t, "datagram", sent, dsrFront6, 17)
		if !bytes.Equal(out.UDP.Payload, []byte("query")) {
			t.Fatalf("payload %q", out.UDP.Payload)
		}
	}
	// A later datagram too big for the header goes without it.
	_, sent, out := runIPv6(t, d, d.Objs.SlFromHost, bpftest.UDPPacket(ext6, dsrFront6, make([]byte, 1240)))
	wantNoExtHeaders6(t, "large datagram of a DSR flow", sent)
	wantAP(t, "large datagram's source", out.Src, ext6)

	// A flow whose first datagram is too big is SNATed.
	big := netip.AddrPortFrom(ext6.Addr(), 50001)
	_, sent, out = runIPv6(t, d, d.Objs.SlFromHost, bpftest.UDPPacket(big, dsrFront6, make([]byte, 1240)))
	wantNoExtHeaders6(t, "large first datagram", sent)
	if out.Src.Addr() != node6 {
		t.Fatalf("large first datagram's source %v, want SNAT to the node", out.Src)
	}

	h := dsrNode6(t, gen.SluiceConfigFlagsCFG_DSR_TCP, protoUDP, bpftest.Backend{AP: dsrRemote6})
	_, sent, out = runIPv6(t, h, h.Objs.SlFromHost, bpftest.UDPPacket(ext6, dsrFront6, []byte("query")))
	wantNoExtHeaders6(t, "hybrid datagram", sent)
	if out.Src.Addr() != node6 {
		t.Fatalf("hybrid datagram's source %v, want SNAT to the node", out.Src)
	}
}

// A moved connection over IPv6, as TestDSRMovedConnectionIsBalanced.
func TestIPv6DSRMovedConnectionIsBalanced(t *testing.T) {
	d := newDP6(t)
	d.Put(d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP), Flags: gen.SluiceConfigFlagsCFG_DSR_TCP})
	d.AddService(bpftest.Service{ID: 9, Front: dsrFront6, Proto: protoTCP,
		Backends: []bpftest.Backend{{AP: dsrRemote6}, {AP: dsrOther6}},
		Flags:    gen.SluiceFeFlagsFE_EXTERNAL | gen.SluiceFeFlagsFE_MAGLEV})
	table := make([]uint32, gen.MaglevDefaultTableSize)
	for i := range table {
		table[i] = 1
	}
	d.SetMaglevTable(9, table)
	for port := uint16(50000); port < 50010; port++ {
		client := netip.AddrPortFrom(ext6.Addr(), port)
		seg := bpftest.Build(bpftest.PacketSpec{Src: client, Dst: dsrFront6, Proto: layers.IPProtocolTCP, TCPFlags: bpftest.ACK | bpftest.PSH, Payload: []byte("more")})
		_, sent, out := runIPv6(t, d, d.Objs.SlFromHost, seg)
		wantAP(t, "moved segment's destination", out.Dst, dsrOther6)
		wantAP(t, "moved segment's source", out.Src, client)
		wantDSRHeader6(t, "moved segment", sent, dsrFront6, 6)
		_, sent, out = runIPv6(t, d, d.Objs.SlFromHost, seg)
		wantNoExtHeaders6(t, "next segment", sent)
		wantAP(t, "next segment's destination", out.Dst, dsrOther6)
	}
}
