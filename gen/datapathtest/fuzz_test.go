package datapathtest_test

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// FuzzDatapath feeds arbitrary frames to every datapath program with services
// programmed and checks the invariants: the program runs, its verdict is one the
// datapath may give, and a frame dropped as malformed leaves conntrack as it was.
//
//	go test -fuzz FuzzDatapath -fuzztime 60s ./gen
func FuzzDatapath(f *testing.F) {
	udpFront := netip.AddrPortFrom(vipAP.Addr(), 53)
	seeds := [][]byte{
		bpftest.TCPPacket(clientAP, vipAP, bpftest.SYN),
		bpftest.TCPPacket(be1AP, clientAP, bpftest.SYN|bpftest.ACK),
		bpftest.UDPPacket(clientAP, udpFront, []byte("q")),
		bpftest.TCPPacket(extAP, netip.AddrPortFrom(nodeIP, 30080), bpftest.SYN),
		bpftest.Build(bpftest.PacketSpec{Src: netip.AddrPortFrom(be1AP.Addr(), 0), Dst: netip.AddrPortFrom(clientAP.Addr(), 0),
			Proto: layers.IPProtocolICMPv4, ICMPType: 3, ICMPCode: 4,
			Payload: bpftest.TCPPacket(clientAP, be1AP, bpftest.SYN)[14 : 14+28]}),
		bpftest.Build(bpftest.PacketSpec{Src: clientAP, Dst: vipAP, Proto: layers.IPProtocolTCP, TCPFlags: bpftest.SYN,
			IPOptions: []byte{0x94, 0x04, 0, 0}}),
	}
	for _, s := range seeds {
		f.Add(s)
	}

	d := newDP(f)
	d.AddService(webService())
	d.AddService(bpftest.Service{ID: 2, Front: udpFront, Proto: protoUDP}) // no endpoints: rejects
	d.AddService(bpftest.Service{ID: 3, Front: netip.AddrPortFrom(netip.MustParseAddr("255.255.255.255"), 30080), Proto: protoTCP,
		Backends: []bpftest.Backend{{AP: be2AP}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	progs := []*ebpf.Program{d.Objs.SlFromWl, d.Objs.SlToWl, d.Objs.SlFromHost, d.Objs.SlToHost}

	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14+20 || len(frame) > 1500 {
			return // BPF_PROG_TEST_RUN refuses these; a real interface never passes them up
		}
		d.TB = t
		for _, prog := range progs {
			before := d.CTCount()
			malformed := d.Counter(gen.SluiceCounterCNT_DROP_MALFORMED)
			opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256)}
			ret, err := prog.Run(&opts)
			if err != nil {
				t.Fatalf("%v: %v", prog, err)
			}
			switch ret {
			case actOK, actShot, actRedirect:
			default:
				t.Fatalf("%v: verdict %d not in {OK, SHOT, REDIRECT}", prog, ret)
			}
			if d.Counter(gen.SluiceCounterCNT_DROP_MALFORMED) > malformed && d.CTCount() != before {
				t.Fatalf("%v: frame dropped as malformed changed conntrack (%d -> %d entries)", prog, before, d.CTCount())
			}
		}
	})
}

// FuzzIPv6Datapath is FuzzDatapath for IPv6 frames: extension header chains,
// fragments, ICMPv6 errors quoting flows, with IPv6 services programmed. A
// frame must also leave the IPv4 conntrack map alone.
//
//	go test -fuzz FuzzIPv6Datapath -fuzztime 60s ./gen
func FuzzIPv6Datapath(f *testing.F) {
	udpFront := netip.AddrPortFrom(vip6.Addr(), 53)
	syn := bpftest.TCPPacket(client6, vip6, bpftest.SYN)
	seeds := [][]byte{
		syn,
		bpftest.TCPPacket(be1v6, client6, bpftest.SYN|bpftest.ACK),
		bpftest.UDPPacket(client6, udpFront, []byte("q")),
		bpftest.TCPPacket(ext6, netip.AddrPortFrom(node6, 30080), bpftest.SYN),
		bpftest.WithExtHeaders(syn, bpftest.ExtHeader{Type: 0, Body: bpftest.PadOptions(1)},
			bpftest.ExtHeader{Type: 43, Body: bpftest.PadOptions(3)}, bpftest.ExtHeader{Type: 60, Body: bpftest.PadOptions(1)}),
		bpftest.Fragment6(bpftest.UDPPacket(client6, udpFront, bytes.Repeat([]byte("x"), 3000)), 1232, 9)[0],
		bpftest.Fragment6(bpftest.UDPPacket(client6, udpFront, bytes.Repeat([]byte("x"), 3000)), 1232, 9)[1],
		bpftest.Build(bpftest.PacketSpec{Src: netip.AddrPortFrom(be1v6.Addr(), 0), Dst: netip.AddrPortFrom(client6.Addr(), 0),
			Proto: layers.IPProtocolICMPv6, ICMPType: 2, Payload: append([]byte{0, 0, 5, 0}, bpftest.TCPPacket(client6, be1v6, bpftest.ACK)[14:]...)}),
		bpftest.Build(bpftest.PacketSpec{Src: netip.AddrPortFrom(client6.Addr(), 0), Dst: netip.AddrPortFrom(vip6.Addr(), 0),
			Proto: layers.IPProtocolICMPv6, ICMPType: 128, ICMPID: 3}),
	}
	for _, s := range seeds {
		f.Add(s)
	}

	d := newDP6(f)
	d.AddService(web6())
	d.AddService(bpftest.Service{ID: 2, Front: udpFront, Proto: protoUDP}) // no endpoints: rejects
	d.AddService(bpftest.Service{ID: 3, Front: netip.AddrPortFrom(wildcard, 30080), Proto: protoTCP,
		Backends: []bpftest.Backend{{AP: be2v6}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	d.Put(d.Objs.SlFe6V1, bpftest.FeKey6(netip.AddrPortFrom(vip6.Addr(), 0), bpftest.ProtoICMPv6), gen.SluiceFeValue{})
	progs := []*ebpf.Program{d.Objs.SlFromWl, d.Objs.SlToWl, d.Objs.SlFromHost, d.Objs.SlToHost}

	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14+40 || len(frame) > 1500 {
			return // BPF_PROG_TEST_RUN refuses these; a real interface never passes them up
		}
		frame[12], frame[13] = 0x86, 0xdd // IPv6 frames only: FuzzDatapath has the rest
		d.TB = t
		for _, prog := range progs {
			before, before6 := d.CTCount(), d.CT6Count()
			malformed := d.Counter(gen.SluiceCounterCNT_DROP_MALFORMED)
			opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256)}
			ret, err := prog.Run(&opts)
			if err != nil {
				t.Fatalf("%v: %v", prog, err)
			}
			switch ret {
			case actOK, actShot, actRedirect:
			default:
				t.Fatalf("%v: verdict %d not in {OK, SHOT, REDIRECT}", prog, ret)
			}
			if d.Counter(gen.SluiceCounterCNT_DROP_MALFORMED) > malformed && d.CTCount() != before {
				t.Fatalf("%v: frame dropped as malformed changed conntrack (%d -> %d entries)", prog, before, d.CTCount())
			}
			if d.CTCount()-d.CT6Count() != before-before6 {
				t.Fatalf("%v: an IPv6 frame changed the IPv4 conntrack map", prog)
			}
		}
	})
}
