package trace

import (
	"bytes"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// referenceFrame serialises pkt with gopacket, the library build replaced:
// the judge of build's bytes, checksums included.
func referenceFrame(t *testing.T, pkt Packet, flags func(*layers.TCP), extra ...gopacket.SerializableLayer) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
	proto := map[string]layers.IPProtocol{"tcp": layers.IPProtocolTCP, "udp": layers.IPProtocolUDP}[pkt.Proto]
	var netLayer gopacket.NetworkLayer
	ls := []gopacket.SerializableLayer{eth}
	if pkt.Src.Addr().Is4() {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: proto, Flags: layers.IPv4DontFragment, SrcIP: pkt.Src.Addr().AsSlice(), DstIP: pkt.Dst.Addr().AsSlice()}
		netLayer, ls = ip, append(ls, ip)
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: pkt.Src.Addr().AsSlice(), DstIP: pkt.Dst.Addr().AsSlice()}
		netLayer, ls = ip, append(ls, ip)
	}
	ls = append(ls, extra...)
	if proto == layers.IPProtocolTCP {
		tcp := &layers.TCP{SrcPort: layers.TCPPort(pkt.Src.Port()), DstPort: layers.TCPPort(pkt.Dst.Port()), Window: 65535, Seq: 1}
		flags(tcp)
		if err := tcp.SetNetworkLayerForChecksum(netLayer); err != nil {
			t.Fatal(err)
		}
		ls = append(ls, tcp)
	} else {
		udp := &layers.UDP{SrcPort: layers.UDPPort(pkt.Src.Port()), DstPort: layers.UDPPort(pkt.Dst.Port())}
		if err := udp.SetNetworkLayerForChecksum(netLayer); err != nil {
			t.Fatal(err)
		}
		ls = append(ls, udp)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, append(ls, gopacket.Payload(pkt.Payload))...); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// build writes what gopacket writes, byte for byte, for both families,
// both protocols, every TCP flag and payloads of odd and even length; and
// summary reads them back.
func TestBuildWritesWhatGopacketWrites(t *testing.T) {
	for _, tc := range []struct {
		pkt   Packet
		flags func(*layers.TCP)
		want  string
	}{
		{Packet{Proto: "tcp", Src: netip.MustParseAddrPort("10.0.0.5:43210"), Dst: netip.MustParseAddrPort("10.96.0.10:80")},
			func(l *layers.TCP) { l.SYN = true }, "tcp 10.0.0.5:43210 -> 10.96.0.10:80 [SYN]"},
		{Packet{Proto: "tcp", Src: netip.MustParseAddrPort("10.0.0.5:43210"), Dst: netip.MustParseAddrPort("10.96.0.10:80"), TCPFlags: "ack, PSH,fin,rst", Payload: []byte("odd")},
			func(l *layers.TCP) { l.ACK, l.PSH, l.FIN, l.RST = true, true, true, true }, "tcp 10.0.0.5:43210 -> 10.96.0.10:80 [ACK,FIN,RST,PSH]"},
		{Packet{Proto: "udp", Src: netip.MustParseAddrPort("10.0.0.5:5353"), Dst: netip.MustParseAddrPort("10.96.0.10:53"), Payload: []byte("even")},
			nil, "udp 10.0.0.5:5353 -> 10.96.0.10:53"},
		{Packet{Proto: "tcp", Src: netip.MustParseAddrPort("[fd00::5]:43210"), Dst: netip.MustParseAddrPort("[fd00:96::10]:80"), TCPFlags: "syn,ack"},
			func(l *layers.TCP) { l.SYN, l.ACK = true, true }, "tcp [fd00::5]:43210 -> [fd00:96::10]:80 [SYN,ACK]"},
		{Packet{Proto: "udp", Src: netip.MustParseAddrPort("[fd00::5]:5353"), Dst: netip.MustParseAddrPort("[fd00:96::10]:53"), Payload: bytes.Repeat([]byte{0xab}, 1001)},
			nil, "udp [fd00::5]:5353 -> [fd00:96::10]:53"},
	} {
		got, err := build(tc.pkt)
		if err != nil {
			t.Fatalf("%s: %v", tc.want, err)
		}
		if want := referenceFrame(t, tc.pkt, tc.flags); !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %x\nwant %x", tc.want, got, want)
		}
		if s := summary(got); s != tc.want {
			t.Errorf("summary %q, want %q", s, tc.want)
		}
	}
}

// A zero UDP checksum is sent as all ones: zero means none (RFC 768).
func TestBuildNeverSendsAZeroUDPChecksum(t *testing.T) {
	// Search a payload whose checksum would be zero.
	pkt := Packet{Proto: "udp", Src: netip.MustParseAddrPort("10.0.0.5:5353"), Dst: netip.MustParseAddrPort("10.96.0.10:53"), Payload: []byte{0, 0}}
	for v := range 1 << 16 {
		pkt.Payload[0], pkt.Payload[1] = byte(v>>8), byte(v)
		frame, err := build(pkt)
		if err != nil {
			t.Fatal(err)
		}
		udp := frame[ethHeaderLen+20:]
		if udp[6] == 0xff && udp[7] == 0xff {
			return
		}
		if udp[6] == 0 && udp[7] == 0 {
			t.Fatalf("payload %x: checksum 0", pkt.Payload)
		}
	}
	t.Fatal("no payload gave an all-ones checksum")
}

// summary reads past IPv6 extension headers, names fragments, ICMP and
// other protocols, and says when a frame is not IP or is cut short; bad
// input to build is refused by name.
func TestSummaryReadsWhatItCanAndBuildRefusesBadInput(t *testing.T) {
	v6 := Packet{Proto: "udp", Src: netip.MustParseAddrPort("[fd00::5]:5353"), Dst: netip.MustParseAddrPort("[fd00:96::10]:53")}
	destOpts := &layers.IPv6Destination{Options: []*layers.IPv6DestinationOption{{OptionType: 0x1e, OptionData: []byte{1, 2, 3, 4}}}}
	destOpts.NextHeader = layers.IPProtocolUDP
	withDestOpts := referenceFrame(t, v6, nil, destOpts)
	withDestOpts[ethHeaderLen+6] = 60 // gopacket leaves the IPv6 header naming UDP
	if s := summary(withDestOpts); s != "udp [fd00::5]:5353 -> [fd00:96::10]:53" {
		t.Errorf("past a destination options header: %q", s)
	}
	v4, err := build(Packet{Proto: "udp", Src: netip.MustParseAddrPort("10.0.0.5:5353"), Dst: netip.MustParseAddrPort("10.96.0.10:53")})
	if err != nil {
		t.Fatal(err)
	}
	icmp := bytes.Clone(v4)
	icmp[ethHeaderLen+9] = protoICMP
	icmp[ethHeaderLen+20], icmp[ethHeaderLen+21] = 3, 3
	later := bytes.Clone(v4)
	later[ethHeaderLen+7] = 1 // fragment offset 8
	gre := bytes.Clone(v4)
	gre[ethHeaderLen+9] = 47
	arp := bytes.Clone(v4)
	arp[12], arp[13] = 0x08, 0x06
	for frame, want := range map[string]string{
		string(icmp):                           "icmp 10.0.0.5 -> 10.96.0.10 type 3 code 3",
		string(later):                          "10.0.0.5 -> 10.96.0.10 fragment",
		string(gre):                            "10.0.0.5 -> 10.96.0.10 protocol 47",
		string(arp):                            "60 bytes, not IP",
		string(v4[:20]):                        "20 bytes, a truncated IPv4 header",
		string(v4[:3]):                         "3 bytes, not IP",
		string(withDestOpts[:ethHeaderLen+44]): "fd00::5 -> fd00:96::10 truncated",
	} {
		if s := summary([]byte(frame)); s != want {
			t.Errorf("summary %q, want %q", s, want)
		}
	}

	for _, tc := range []struct {
		pkt  Packet
		want string
	}{
		{Packet{Proto: "sctp", Src: v6.Src, Dst: v6.Dst}, `protocol "sctp"`},
		{Packet{Proto: "tcp", Src: v6.Src, Dst: v6.Dst, TCPFlags: "syn,urg"}, `TCP flag "urg"`},
		{Packet{Proto: "udp", Src: netip.MustParseAddrPort("10.0.0.5:1"), Dst: v6.Dst}, "not of one family"},
	} {
		if _, err := build(tc.pkt); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("build(%+v): %v, want %s", tc.pkt, err, tc.want)
		}
	}
}
