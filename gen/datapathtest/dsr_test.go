package datapathtest_test

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// The DSR tests run a balancing node (the frontend's, node IP nodeIP) and a
// backend's node, each a datapath of its own.
var (
	dsrFront  = netip.AddrPortFrom(nodeIP, 30090)
	dsrRemote = netip.MustParseAddrPort("10.3.0.4:8080")
	dsrOther  = netip.MustParseAddrPort("10.3.0.5:8080")
)

const dsrOptType = 0x9e // bpf/include/dsr.h DSR_OPT_TYPE

// dsrNode is a balancing node whose external traffic goes by DSR for the
// given protocols (gen.SluiceConfigFlagsCFG_DSR_*).
func dsrNode(t *testing.T, flags gen.SluiceConfigFlags, proto uint8, backends ...bpftest.Backend) *bpftest.Datapath {
	t.Helper()
	d := newDP(t)
	d.Put(d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP), Flags: flags})
	d.AddService(bpftest.Service{ID: 9, Front: dsrFront, Proto: proto, Backends: backends, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	return d
}

// dsrOption is the option a packet to a backend carries for front.
func dsrOption(front netip.AddrPort) []byte {
	opt := []byte{dsrOptType, 8, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(opt[2:], front.Port())
	copy(opt[4:], front.Addr().AsSlice())
	return opt
}

// wantDSROption checks that a packet carries the DSR option for front, and
// nothing else in its IPv4 options.
func wantDSROption(t *testing.T, what string, p *bpftest.Decoded, front netip.AddrPort) {
	t.Helper()
	if p.IP.IHL != 7 || len(p.IP.Options) != 1 {
		t.Fatalf("%s: IHL %d, options %+v, want the 8-byte DSR option alone", what, p.IP.IHL, p.IP.Options)
	}
	o := p.IP.Options[0]
	got := append([]byte{o.OptionType, o.OptionLength}, o.OptionData...)
	if !bytes.Equal(got, dsrOption(front)) {
		t.Fatalf("%s: option % x, want % x", what, got, dsrOption(front))
	}
}

func wantNoOptions(t *testing.T, what string, p *bpftest.Decoded) {
	t.Helper()
	if p.IP.IHL != 5 {
		t.Fatalf("%s: IHL %d, want 5 (no options)", what, p.IP.IHL)
	}
}

// The balancing node DNATs a flow from outside to a remote backend without
// SNAT; the SYN alone carries the frontend, and the entries say DSR.
func TestDSRTCPKeepsTheClientAndCarriesTheFrontendOnTheSYN(t *testing.T) {
	d := dsrNode(t, gen.SluiceConfigFlagsCFG_DSR_TCP, protoTCP, bpftest.Backend{AP: dsrRemote})

	syn := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(extAP, dsrFront, bpftest.SYN))
	wantAP(t, "SYN destination", syn.Dst, dsrRemote)
	wantAP(t, "SYN source (the client's, not SNATed)", syn.Src, extAP)
	wantDSROption(t, "SYN", syn, dsrFront)
	if !syn.TCP.SYN || syn.TCP.ACK {
		t.Fatal("TCP flags changed")
	}
	fwd, ok := d.CT(bpftest.CtKey(extAP, dsrFront, protoTCP))
	if !ok {
		t.Fatal("no forward entry")
	}
	if fwd.Flags&gen.SluiceCtFlagsCT_DSR == 0 || fwd.Flags&(gen.SluiceCtFlagsCT_SNAT|gen.SluiceCtFlagsCT_BACKEND_LOCAL) != 0 {
		t.Fatalf("forward entry flags %#x, want DSR without SNAT", fwd.Flags)
	}
	if _, ok := d.CT(bpftest.CtKey(dsrRemote, extAP, protoTCP)); !ok {
		t.Fatal("no reverse entry keyed by the client's own address")
	}

	ack := d.RunOK(d.Objs.SlFromHost, bpftest.Build(bpftest.PacketSpec{Src: extAP, Dst: dsrFront,
		Proto: layers.IPProtocolTCP, TCPFlags: bpftest.ACK, Payload: []byte("GET / HTTP/1.0\r\n\r\n")}))
	wantAP(t, "ACK destination", ack.Dst, dsrRemote)
	wantNoOptions(t, "established segment", ack)
	if !bytes.Equal(ack.TCP.Payload, []byte("GET / HTTP/1.0\r\n\r\n")) {
		t.Fatalf("payload %q", ack.TCP.Payload)
	}
	if n := d.Counter(gen.SluiceCounterCNT_DSR_SENT); n != 1 {
		t.Fatalf("dsr_sent %d, want 1", n)
	}
}

// In DSR mode every datagram of a UDP flow carries the option; in hybrid
// mode UDP is SNATed as before, TCP goes by DSR.
func TestDSRUDPEveryDatagramAndHybridSNATsUDP(t *testing.T) {
	t.Run("dsr", func(t *testing.T) {
		d := dsrNode(t, gen.SluiceConfigFlagsCFG_DSR_TCP|gen.SluiceConfigFlagsCFG_DSR_UDP, protoUDP, bpftest.Backend{AP: dsrRemote})
		for i := range 3 {
			out := d.RunOK(d.Objs.SlFromHost, bpftest.UDPPacket(extAP, dsrFront, []byte("query")))
			wantAP(t, "destination", out.Dst, dsrRemote)
			wantAP(t, "source", out.Src, extAP)
			wantDSROption(t, "datagram", out, dsrFront)
			if !bytes.Equal(out.UDP.Payload, []byte("query")) {
				t.Fatalf("datagram %d: payload %q", i, out.UDP.Payload)
			}
		}
		if n := d.Counter(gen.SluiceCounterCNT_DSR_SENT); n != 3 {
			t.Fatalf("dsr_sent %d, want 3", n)
		}
	})
	t.Run("hybrid", func(t *testing.T) {
		d := dsrNode(t, gen.SluiceConfigFlagsCFG_DSR_TCP, protoUDP, bpftest.Backend{AP: dsrRemote})
		out := d.RunOK(d.Objs.SlFromHost, bpftest.UDPPacket(extAP, dsrFront, []byte("query")))
		wantAP(t, "destination", out.Dst, dsrRemote)
		if out.Src.Addr() != nodeIP {
			t.Fatalf("UDP source %v, want SNAT to the node in hybrid mode", out.Src)
		}
		wantNoOptions(t, "SNATed datagram", out)
	})
	t.Run("local backend", func(t *testing.T) {
		d := dsrNode(t, gen.SluiceConfigFlagsCFG_DSR_TCP, protoTCP, bpftest.Backend{AP: be1AP, Local: true})
		out := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(extAP, dsrFront, bpftest.SYN))
		wantAP(t, "destination", out.Dst, be1AP)
		wantNoOptions(t, "SYN to a local backend", out)
	})
	t.Run("snat", func(t *testing.T) {
		d := dsrNode(t, 0, protoTCP, bpftest.Backend{AP: dsrRemote})
		out := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(extAP, dsrFront, bpftest.SYN))
		if out.Src.Addr() != nodeIP {
			t.Fatalf("source %v, want SNAT to the node without DSR", out.Src)
		}
		wantNoOptions(t, "SNATed SYN", out)
	})
}

// The backend's node takes the option off, tracks the flow, and its
// backend's replies leave from the frontend, to the client.
func TestDSRBackendNodeRemovesTheOptionAndAnswersFromTheFrontend(t *testing.T) {
	d := newDP(t) // the backend's node: be1AP is its pod
	payload := []byte("hello over DSR")
	in := bpftest.Build(bpftest.PacketSpec{Src: extAP, Dst: be1AP, Proto: layers.IPProtocolTCP,
		TCPFlags: bpftest.SYN, IPOptions: dsrOption(dsrFront), Payload: payload})

	out := d.RunOK(d.Objs.SlFromHost, in)
	wantNoOptions(t, "SYN at the backend", out)
	wantAP(t, "destination", out.Dst, be1AP)
	wantAP(t, "source", out.Src, extAP)
	if int(out.IP.Length) != len(in)-14-8 || !bytes.Equal(out.TCP.Payload, payload) {
		t.Fatalf("IP length %d (in %d), payload %q", out.IP.Length, len(in)-14, out.TCP.Payload)
	}
	rev, ok := d.CT(bpftest.CtKey(be1AP, extAP, protoTCP))
	if !ok {
		t.Fatal("no reverse entry")
	}
	if gen.AddrFromNet(rev.NatAddr) != dsrFront.Addr() || gen.PortFromNet(rev.NatPort) != dsrFront.Port() ||
		rev.Flags&(gen.SluiceCtFlagsCT_DSR|gen.SluiceCtFlagsCT_BACKEND_LOCAL) != gen.SluiceCtFlagsCT_DSR|gen.SluiceCtFlagsCT_BACKEND_LOCAL {
		t.Fatalf("reverse entry %+v", rev)
	}
	if n := d.Counter(gen.SluiceCounterCNT_DSR_ACCEPTED); n != 1 {
		t.Fatalf("dsr_accepted %d, want 1", n)
	}

	// The SYN-ACK leaves from the frontend, routed by the FIB (or, where
	// the test's namespace does not forward, passed to the stack).
	ret, frame := d.Run(d.Objs.SlFromWl, bpftest.TCPPacket(be1AP, extAP, bpftest.SYN|bpftest.ACK))
	if ret != actOK && ret != actRedirect {
		t.Fatalf("reply verdict %d", ret)
	}
	reply, err := bpftest.Decode(frame)
	if err != nil {
		t.Fatal(err)
	}
	wantAP(t, "reply source", reply.Src, dsrFront)
	wantAP(t, "reply destination", reply.Dst, extAP)

	// Later segments come without the option and pass as they are.
	ack := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(extAP, be1AP, bpftest.ACK))
	wantAP(t, "ACK destination", ack.Dst, be1AP)

	// A new connection on the same tuple after this one reset is answered
	// from the frontend again: the SYN's option rewrites the entries.
	d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(extAP, be1AP, bpftest.RST))
	d.RunOK(d.Objs.SlFromHost, in)
	_, frame = d.Run(d.Objs.SlFromWl, bpftest.TCPPacket(be1AP, extAP, bpftest.SYN|bpftest.ACK))
	if reply, err = bpftest.Decode(frame); err != nil {
		t.Fatal(err)
	}
	wantAP(t, "reopened connection's reply source", reply.Src, dsrFront)
}

// A UDP flow by DSR end to end: the balancing node's output is the
// backend's node's input.
func TestDSRBothNodesUDPEndToEnd(t *testing.T) {
	front := dsrNode(t, gen.SluiceConfigFlagsCFG_DSR_TCP|gen.SluiceConfigFlagsCFG_DSR_UDP, protoUDP, bpftest.Backend{AP: be1AP})
	back := newDP(t)
	ret, sent := front.Run(front.Objs.SlFromHost, bpftest.UDPPacket(extAP, dsrFront, []byte("ping")))
	if ret != actOK {
		t.Fatalf("balancing node verdict %d", ret)
	}
	in, err := bpftest.Decode(sent)
	if err != nil {
		t.Fatal(err)
	}
	out := back.RunOK(back.Objs.SlFromHost, sent[:14+int(in.IP.Length)])
	wantNoOptions(t, "datagram at the backend", out)
	wantAP(t, "datagram at the backend", out.Dst, be1AP)
	_, frame := back.Run(back.Objs.SlFromWl, bpftest.UDPPacket(be1AP, extAP, []byte("pong")))
	reply, err := bpftest.Decode(frame)
	if err != nil {
		t.Fatal(err)
	}
	wantAP(t, "reply source", reply.Src, dsrFront)
	wantAP(t, "reply destination", reply.Dst, extAP)
	if !bytes.Equal(reply.UDP.Payload, []byte("pong")) {
		t.Fatalf("reply payload %q", reply.UDP.Payload)
	}
}

// A connection an upstream router moved to this node (no entry here, a
// segment that is not a SYN) is balanced by the frontend's Maglev table,
// with the option, when the node does DSR; without DSR it passes untouched
// as before.
func TestDSRMovedConnectionIsBalanced(t *testing.T) {
	for _, dsr := range []bool{true, false} {
		flags := gen.SluiceConfigFlags(0)
		if dsr {
			flags = gen.SluiceConfigFlagsCFG_DSR_TCP
		}
		d := newDP(t)
		d.Put(d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP), Flags: flags})
		d.AddService(bpftest.Service{ID: 9, Front: dsrFront, Proto: protoTCP,
			Backends: []bpftest.Backend{{AP: dsrRemote}, {AP: dsrOther}},
			Flags:    gen.SluiceFeFlagsFE_EXTERNAL | gen.SluiceFeFlagsFE_MAGLEV})
		// Every slot names the second backend: a random pick would take
		// the first half of the time.
		table := make([]uint32, gen.MaglevDefaultTableSize)
		for i := range table {
			table[i] = 1
		}
		d.SetMaglevTable(9, table)

		for port := uint16(50000); port < 50010; port++ {
			client := netip.AddrPortFrom(extAP.Addr(), port)
			seg := bpftest.TCPPacket(client, dsrFront, bpftest.ACK|bpftest.PSH)
			if !dsr {
				ret, out := d.Run(d.Objs.SlFromHost, seg)
				if ret != actOK || !bytes.Equal(out[:len(seg)], seg) {
					t.Fatalf("without DSR: a segment of an unknown flow was changed (verdict %d)", ret)
				}
				continue
			}
			out := d.RunOK(d.Objs.SlFromHost, seg)
			wantAP(t, "moved segment's destination", out.Dst, dsrOther)
			wantAP(t, "moved segment's source", out.Src, client)
			wantDSROption(t, "moved segment", out, dsrFront)
			f, ok := d.CT(bpftest.CtKey(client, dsrFront, protoTCP))
			if !ok || f.Flags&gen.SluiceCtFlagsCT_DSR == 0 || f.TcpSeen&bpftest.ACK == 0 {
				t.Fatalf("moved flow %+v tracked %v, want DSR with its ACK seen", f, ok)
			}
			// The next segment follows the entry, without the option.
			next := d.RunOK(d.Objs.SlFromHost, seg)
			wantNoOptions(t, "next segment", next)
			wantAP(t, "next segment's destination", next.Dst, dsrOther)
		}
	}
}
