package datapathtest_test

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// Per-service counters: every packet of a service's flows counted once, by
// direction, with its IP length, and each flow once as it starts; packets
// of other traffic are not counted.
func TestServiceCountersCountEachPacketOnce(t *testing.T) {
	d := newDP(t)
	d.AddService(webService())
	var wantFwd, wantRev, wantFwdBytes, wantRevBytes uint64
	send := func(frame []byte, reply bool) {
		t.Helper()
		d.RunOK(d.Objs.SlFromWl, frame)
		n := uint64(binary.BigEndian.Uint16(frame[14+2:])) // the IPv4 total length, not the padded frame
		if reply {
			wantRev++
			wantRevBytes += n
		} else {
			wantFwd++
			wantFwdBytes += n
		}
	}
	for i := range 3 {
		client := netip.AddrPortFrom(clientAP.Addr(), clientAP.Port()+uint16(i))
		send(bpftest.TCPPacket(client, vipAP, bpftest.SYN), false)
		be, ok := d.CT(bpftest.CtKey(client, vipAP, protoTCP))
		if !ok {
			t.Fatal("no conntrack entry")
		}
		backend := netip.AddrPortFrom(gen.AddrFromNet(be.NatAddr), gen.PortFromNet(be.NatPort))
		send(bpftest.TCPPacket(backend, client, bpftest.SYN|bpftest.ACK), true)
		send(bpftest.TCPPacket(client, vipAP, bpftest.ACK), false)
	}
	// Traffic to no service: not counted.
	d.RunOK(d.Objs.SlFromWl, bpftest.UDPPacket(clientAP, netip.MustParseAddrPort("10.9.9.9:53"), []byte("q")))

	var vs []gen.SluiceSvcstatsValue
	if err := d.Objs.SlSvcstatsV1.Lookup(uint32(1), &vs); err != nil {
		t.Fatal(err)
	}
	var got gen.SluiceSvcstatsValue
	for _, v := range vs {
		got.FwdPackets += v.FwdPackets
		got.FwdBytes += v.FwdBytes
		got.RevPackets += v.RevPackets
		got.RevBytes += v.RevBytes
		got.NewFlows += v.NewFlows
	}
	want := gen.SluiceSvcstatsValue{FwdPackets: wantFwd, FwdBytes: wantFwdBytes, RevPackets: wantRev, RevBytes: wantRevBytes, NewFlows: 3}
	if got != want {
		t.Fatalf("service 1 counters %+v, want %+v", got, want)
	}
	if err := d.Objs.SlSvcstatsV1.Lookup(uint32(0), &vs); err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		if v != (gen.SluiceSvcstatsValue{}) {
			t.Fatalf("untranslated traffic counted under id 0: %+v", v)
		}
	}
}

// The same over IPv6: the counted length is the IPv6 header plus payload.
func TestIPv6ServiceCountersCountEachPacketOnce(t *testing.T) {
	d := newDP6(t)
	d.AddService(web6())
	var want gen.SluiceSvcstatsValue
	send := func(frame []byte, reply bool) {
		t.Helper()
		d.RunOK(d.Objs.SlFromWl, frame)
		n := 40 + uint64(binary.BigEndian.Uint16(frame[14+4:])) // header + payload length
		if reply {
			want.RevPackets++
			want.RevBytes += n
		} else {
			want.FwdPackets++
			want.FwdBytes += n
		}
	}
	for i := range 3 {
		client := netip.AddrPortFrom(client6.Addr(), client6.Port()+uint16(i))
		send(bpftest.TCPPacket(client, vip6, bpftest.SYN), false)
		send(bpftest.TCPPacket(be1v6, client, bpftest.SYN|bpftest.ACK), true)
		send(bpftest.TCPPacket(client, vip6, bpftest.ACK), false)
		want.NewFlows++
	}
	d.RunOK(d.Objs.SlFromWl, bpftest.UDPPacket(client6, netip.MustParseAddrPort("[fd00:9::9]:53"), []byte("q")))
	var vs []gen.SluiceSvcstatsValue
	if err := d.Objs.SlSvcstatsV1.Lookup(uint32(1), &vs); err != nil {
		t.Fatal(err)
	}
	var got gen.SluiceSvcstatsValue
	for _, v := range vs {
		got.FwdPackets += v.FwdPackets
		got.FwdBytes += v.FwdBytes
		got.RevPackets += v.RevPackets
		got.RevBytes += v.RevBytes
		got.NewFlows += v.NewFlows
	}
	if got != want {
		t.Fatalf("service 1 counters %+v, want %+v", got, want)
	}
}
