package datapathtest_test

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/google/gopacket/layers"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

const protoSCTP = bpftest.ProtoSCTP

// TCP flag bits as conntrack records SCTP's chunks (bpf/include/sctp.h).
const (
	seenFIN = 0x01
	seenSYN = 0x02
	seenRST = 0x04
	seenACK = 0x10
)

// sctpPayloadSizes are chunk values whose packets' lengths set each low bit
// of the length the CRC update is built from, up to an MTU-sized packet.
var sctpPayloadSizes = []int{0, 1, 3, 4, 5, 17, 100, 255, 256, 1000, 1023, 1400, 1432}

// An SCTP association to a Service whose port differs from its backends':
// every packet, both ways, leaves translated with a CRC32c computed from
// scratch in the test (Decode verifies it), and conntrack follows the
// association's chunks, in both families.
func TestSCTPServiceBothWays(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			d := f.newDP(t)
			d.AddService(bpftest.Service{ID: 1, Front: f.vip, Proto: protoSCTP, Backends: []bpftest.Backend{{AP: f.be1}}})

			init := d.RunOK(d.Objs.SlFromWl, bpftest.SCTPPacket(f.client, f.vip, bpftest.SCTPInit, make([]byte, 16)))
			wantAP(t, "INIT destination", init.Dst, f.be1)
			wantAP(t, "INIT source", init.Src, f.client)
			if init.SCTP == nil || init.SCTP.VerificationTag != 0x5c7b0001 {
				t.Fatalf("not the SCTP packet sent: %v", init.Packet)
			}
			fwd, ok := d.Flow(f.client, f.vip, protoSCTP)
			if !ok || fwd.SvcID != 1 || fwd.TCPSeen&seenSYN == 0 {
				t.Fatalf("forward entry %+v (found %v): want service 1 with the INIT seen", fwd, ok)
			}

			ack := d.RunOK(d.Objs.SlFromWl, bpftest.SCTPPacket(f.be1, f.client, bpftest.SCTPInitAck, make([]byte, 20)))
			wantAP(t, "INIT ACK source", ack.Src, f.vip)
			wantAP(t, "INIT ACK destination", ack.Dst, f.client)
			if rev, _ := d.Flow(f.be1, f.client, protoSCTP); rev.TCPSeen&(seenSYN|seenACK) != seenSYN|seenACK {
				t.Fatalf("reverse entry saw %#x, want the INIT ACK (SYN|ACK)", rev.TCPSeen)
			}

			for _, n := range sctpPayloadSizes {
				payload := bytes.Repeat([]byte{byte(n)}, n)
				out := d.RunOK(d.Objs.SlFromWl, bpftest.SCTPPacket(f.client, f.vip, bpftest.SCTPData, payload))
				wantAP(t, "DATA destination", out.Dst, f.be1)
				back := d.RunOK(d.Objs.SlFromWl, bpftest.SCTPPacket(f.be1, f.client, bpftest.SCTPData, payload))
				wantAP(t, "DATA reply source", back.Src, f.vip)
			}

			d.RunOK(d.Objs.SlFromWl, bpftest.SCTPPacket(f.client, f.vip, bpftest.SCTPShutdown, make([]byte, 4)))
			if fwd, _ := d.Flow(f.client, f.vip, protoSCTP); fwd.TCPSeen&seenFIN == 0 {
				t.Fatalf("forward entry saw %#x, want the SHUTDOWN (FIN)", fwd.TCPSeen)
			}
			d.RunOK(d.Objs.SlFromWl, bpftest.SCTPPacket(f.be1, f.client, bpftest.SCTPAbort, nil))
			if rev, _ := d.Flow(f.be1, f.client, protoSCTP); rev.TCPSeen&seenRST == 0 {
				t.Fatalf("reverse entry saw %#x, want the ABORT (RST)", rev.TCPSeen)
			}

			// A new association on the ended one's tuple is balanced
			// afresh, as a SYN reopens a closed TCP tuple.
			reused := d.Counter(gen.SluiceCounterCNT_TUPLE_REUSED)
			d.RunOK(d.Objs.SlFromWl, bpftest.SCTPPacket(f.client, f.vip, bpftest.SCTPInit, make([]byte, 16)))
			if d.Counter(gen.SluiceCounterCNT_TUPLE_REUSED) != reused+1 {
				t.Fatal("an INIT on an aborted association's tuple was not balanced as a new flow")
			}
		})
	}
}

// A NodePort to a remote backend: the source becomes the node's address,
// the destination the backend's, both ports may change; the CRC follows
// each, and the reply goes back to the client from the NodePort.
func TestSCTPNodePortToRemoteBackendIsSNATed(t *testing.T) {
	d := newDP(t)
	np := netip.AddrPortFrom(nodeIP, 30868)
	remote := netip.MustParseAddrPort("10.3.0.4:3868")
	d.AddService(bpftest.Service{ID: 6, Front: np, Proto: protoSCTP, Backends: []bpftest.Backend{{AP: remote}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})

	out := d.RunOK(d.Objs.SlFromHost, bpftest.SCTPPacket(extAP, np, bpftest.SCTPInit, make([]byte, 16)))
	wantAP(t, "destination", out.Dst, remote)
	if out.Src.Addr() != nodeIP {
		t.Fatalf("source %v, want the node IP", out.Src)
	}
	// A second client with the same port is given another one: the CRC
	// follows a source port change too.
	ext2 := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.10"), extAP.Port())
	out2 := d.RunOK(d.Objs.SlFromHost, bpftest.SCTPPacket(ext2, np, bpftest.SCTPInit, make([]byte, 16)))
	if out2.Src == out.Src || out2.Src.Addr() != nodeIP {
		t.Fatalf("second client SNATed to %v, first to %v", out2.Src, out.Src)
	}
	r := d.RunOK(d.Objs.SlFromHost, bpftest.SCTPPacket(remote, out2.Src, bpftest.SCTPInitAck, make([]byte, 20)))
	wantAP(t, "reply source", r.Src, np)
	wantAP(t, "reply destination", r.Dst, ext2)
}

// No endpoints: an SCTP packet to the Service is answered with an ICMP port
// unreachable quoting it, as kube-proxy's reject does.
func TestSCTPNoEndpointsRejectsWithPortUnreachable(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			d := f.newDP(t)
			d.AddService(bpftest.Service{ID: 10, Front: f.vip, Proto: protoSCTP})
			ret, out := d.Run(d.Objs.SlFromWl, bpftest.SCTPPacket(f.client, f.vip, bpftest.SCTPInit, make([]byte, 16)))
			if ret != actRedirect {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT", ret)
			}
			reply, err := bpftest.Decode(out)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case f.vip.Addr().Is4() && (reply.ICMP == nil || reply.ICMP.TypeCode != layers.CreateICMPv4TypeCode(3, 3)):
				t.Fatalf("not an ICMP port unreachable: %v", reply.Packet)
			case f.vip.Addr().Is6() && (reply.ICMP6 == nil || reply.ICMP6.TypeCode != layers.CreateICMPv6TypeCode(1, 4)):
				t.Fatalf("not an ICMPv6 port unreachable: %v", reply.Packet)
			}
			if d.Counter(gen.SluiceCounterCNT_REJECT_NO_ENDPOINTS) != 1 {
				t.Fatal("the reject was not counted")
			}
		})
	}
}

// An IPv4 first fragment's CRC covers a datagram whose length it does not
// carry: with the Service's port the backend's, only addresses change and
// the fragment passes; with a port to change it is refused and counted,
// never sent with a wrong CRC.
func TestSCTPFirstFragment(t *testing.T) {
	d := newDP(t)
	same := netip.AddrPortFrom(be1AP.Addr(), vipAP.Port())
	d.AddService(bpftest.Service{ID: 1, Front: vipAP, Proto: protoSCTP, Backends: []bpftest.Backend{{AP: same}}})
	frag := func(dst netip.AddrPort) []byte {
		return bpftest.Build(bpftest.PacketSpec{Src: clientAP, Dst: dst, Proto: layers.IPProtocolSCTP, Payload: make([]byte, 64), Fragment: true})
	}
	ret, out := d.Run(d.Objs.SlFromWl, frag(vipAP))
	if ret != actOK {
		t.Fatalf("verdict %d on a first fragment whose ports stay, want TC_ACT_OK", ret)
	}
	// gopacket decodes no L4 header in a fragment: the addresses from
	// its IPv4 header, the port and the CRC from the bytes after it.
	dec, err := bpftest.Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	sctp := out[14+20:]
	dst := netip.AddrPortFrom(netip.MustParseAddr(dec.IP.DstIP.String()), binary.BigEndian.Uint16(sctp[2:4]))
	wantAP(t, "first fragment destination", dst, same)
	in := frag(vipAP)[14+20:]
	if !bytes.Equal(sctp[:12], in[:12]) {
		t.Fatalf("SCTP header changed: %x, was %x", sctp[:12], in[:12])
	}

	other := netip.MustParseAddrPort("10.96.0.11:3868")
	d.AddService(bpftest.Service{ID: 2, Front: other, Proto: protoSCTP, Backends: []bpftest.Backend{{AP: be1AP}}})
	malformed := d.Counter(gen.SluiceCounterCNT_DROP_MALFORMED)
	if ret, _ := d.Run(d.Objs.SlFromWl, frag(other)); ret != actShot {
		t.Fatalf("verdict %d on a first fragment whose port changes, want TC_ACT_SHOT", ret)
	}
	if d.Counter(gen.SluiceCounterCNT_DROP_MALFORMED) != malformed+1 {
		t.Fatal("the refused fragment was not counted")
	}
}

// The powers in bpf/include/sctp.h are x^(8*2^k) mod P: each is recomputed
// here from Go's CRC32c, the first by appending one zero byte.
func TestSCTPCRCPowersTable(t *testing.T) {
	src, err := os.ReadFile("../../bpf/include/sctp.h")
	if err != nil {
		t.Fatal(err)
	}
	table := regexp.MustCompile(`(?s)crc32c_zero_bytes_pow\[16\] = \{(.*?)\}`).FindSubmatch(src)
	if table == nil {
		t.Fatal("crc32c_zero_bytes_pow not found in sctp.h")
	}
	words := regexp.MustCompile(`0x[0-9a-f]{8}`).FindAll(table[1], -1)
	if len(words) != 16 {
		t.Fatalf("%d powers, want 16", len(words))
	}
	mul := func(a, b uint32) uint32 {
		var p uint32
		for i := range 32 {
			p ^= b & -((a >> (31 - i)) & 1)
			b = b>>1 ^ 0x82f63b78&-(b&1)
		}
		return p
	}
	tab := crc32.MakeTable(crc32.Castagnoli)
	// raw CRC (no pre- and post-inversion) of one byte 1, then zeros:
	// x^(8n) times the state after it.
	raw := func(b []byte) uint32 { return ^crc32.Update(^uint32(0), tab, b) }
	one := raw([]byte{1})
	pow := uint32(0x00800000)
	for k, w := range words {
		got, _ := strconv.ParseUint(string(w[2:]), 16, 32)
		if uint32(got) != pow {
			t.Fatalf("power %d: %s, want %#08x", k, w, pow)
		}
		if k < 12 {
			zeros := make([]byte, 1<<k)
			if want := raw(append([]byte{1}, zeros...)); mul(one, pow) != want {
				t.Fatalf("power %d does not append %d zero bytes to a CRC", k, 1<<k)
			}
		}
		pow = mul(pow, pow)
	}
}

// SCTP through a LoadBalancer IP (or externalIP: the same external
// frontend) from outside the node, and with session affinity: every INIT of
// a client goes to its first backend, in both families.
func TestSCTPExternalFrontendAndAffinity(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			d := f.newDP(t)
			lb, ext := netip.MustParseAddrPort("203.0.113.10:3868"), netip.MustParseAddrPort("198.51.100.9:50000")
			if f.vip.Addr().Is6() {
				lb, ext = netip.MustParseAddrPort("[2001:db8::10]:3868"), netip.MustParseAddrPort("[2001:db8:9::9]:50000")
			}
			d.AddService(bpftest.Service{ID: 1, Front: lb, Proto: protoSCTP, Flags: gen.SluiceFeFlagsFE_EXTERNAL,
				Backends: []bpftest.Backend{{AP: f.be1, Local: true}}})
			init := d.RunOK(d.Objs.SlFromHost, bpftest.SCTPPacket(ext, lb, bpftest.SCTPInit, make([]byte, 16)))
			wantAP(t, "INIT to the LoadBalancer IP, destination", init.Dst, f.be1)
			wantAP(t, "INIT to the LoadBalancer IP, source (local backend: kept)", init.Src, ext)
			ack := d.RunOK(d.Objs.SlFromWl, bpftest.SCTPPacket(f.be1, ext, bpftest.SCTPInitAck, make([]byte, 20)))
			wantAP(t, "INIT ACK source", ack.Src, lb)
			wantAP(t, "INIT ACK destination", ack.Dst, ext)

			third := netip.AddrPortFrom(f.be2.Addr().Next(), f.be2.Port())
			d.AddService(bpftest.Service{ID: 2, Front: f.vip, Proto: protoSCTP, Affinity: 60,
				Backends: []bpftest.Backend{{AP: f.be1}, {AP: f.be2}, {AP: third}}})
			first := d.RunOK(d.Objs.SlFromWl, bpftest.SCTPPacket(f.client, f.vip, bpftest.SCTPInit, make([]byte, 16))).Dst
			for i := range uint16(20) {
				src := netip.AddrPortFrom(f.client.Addr(), 40000+i)
				if got := d.RunOK(d.Objs.SlFromWl, bpftest.SCTPPacket(src, f.vip, bpftest.SCTPInit, make([]byte, 16))).Dst; got != first {
					t.Fatalf("association %d from port %d went to %v: affinity says %v", i+2, src.Port(), got, first)
				}
			}
		})
	}
}
