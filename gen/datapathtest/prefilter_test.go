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

const (
	xdpDrop = 1
	xdpPass = 2
)

func TestXDPPrefilter(t *testing.T) {
	d := newDP(t)
	deny := netip.MustParsePrefix("198.51.100.0/24")
	d.Put(d.Objs.SlPrefilterV1, gen.SluicePrefilterKey{Prefixlen: uint32(deny.Bits()), Addr: gen.NetAddr(deny.Addr())}, gen.SluicePrefilterValue{})
	deny6 := netip.MustParsePrefix("2001:db8:bad::/48")
	d.Put(d.Objs.SlPrefilter6V1, gen.SluicePrefilter6Key{Prefixlen: uint32(deny6.Bits()), Addr: gen.NetAddr6(deny6.Addr())}, gen.SluicePrefilterValue{})
	node6 := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("fd00::1"), port) }
	denied6 := netip.MustParseAddrPort("[2001:db8:bad::7]:40000")
	allowed6 := netip.MustParseAddrPort("[2001:db8:600d::7]:40000")
	for _, port := range []uint16{22, 6443, 10256} {
		d.Put(d.Objs.SlFailsafeV1, gen.SluiceFailsafeKey{Proto: protoTCP, Port: gen.NetPort(port)}, gen.SluiceFailsafeValue{})
	}
	node := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(nodeIP, port) }
	denied := netip.MustParseAddrPort("198.51.100.7:40000")
	allowed := netip.MustParseAddrPort("203.0.113.7:40000")
	cases := []struct {
		name  string
		frame []byte
		want  uint32
	}{
		{"denied source to a NodePort", bpftest.TCPPacket(denied, node(30080), bpftest.SYN), xdpDrop},
		{"denied source, UDP", bpftest.UDPPacket(denied, node(53), nil), xdpDrop},
		{"denied source, ICMP", bpftest.Build(bpftest.PacketSpec{Src: denied, Dst: node(0), Proto: layers.IPProtocolICMPv4, ICMPType: 8}), xdpDrop},
		{"denied source to SSH (failsafe)", bpftest.TCPPacket(denied, node(22), bpftest.SYN), xdpPass},
		{"denied source to the API server (failsafe)", bpftest.TCPPacket(denied, node(6443), bpftest.SYN), xdpPass},
		{"denied source to a failsafe port over UDP (not failsafe)", bpftest.UDPPacket(denied, node(22), nil), xdpDrop},
		{"denied source, failsafe port behind IP options", bpftest.Build(bpftest.PacketSpec{Src: denied, Dst: node(22), Proto: layers.IPProtocolTCP,
			TCPFlags: bpftest.SYN, IPOptions: []byte{0x94, 0x04, 0, 0}}), xdpPass},
		{"other source", bpftest.TCPPacket(allowed, node(30080), bpftest.SYN), xdpPass},
		{"neither IPv4 nor IPv6 (ARP)", append(make([]byte, 12), 0x08, 0x06, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), xdpPass},
		{"IPv6 header cut short", append(make([]byte, 12), 0x86, 0xdd, 0x60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), xdpPass},
		{"denied IPv6 source to a NodePort", bpftest.TCPPacket(denied6, node6(30080), bpftest.SYN), xdpDrop},
		{"denied IPv6 source, ICMPv6", bpftest.Build(bpftest.PacketSpec{Src: denied6, Dst: node6(0), Proto: layers.IPProtocolICMPv6, ICMPType: 128}), xdpDrop},
		{"denied IPv6 source to SSH (failsafe)", bpftest.TCPPacket(denied6, node6(22), bpftest.SYN), xdpPass},
		{"denied IPv6 source to SSH behind an extension header (not looked for)",
			bpftest.WithExtHeaders(bpftest.TCPPacket(denied6, node6(22), bpftest.SYN), bpftest.ExtHeader{Type: 60, Body: bpftest.PadOptions(1)}), xdpDrop},
		{"other IPv6 source", bpftest.TCPPacket(allowed6, node6(30080), bpftest.SYN), xdpPass},
	}
	drops, passes := uint64(0), uint64(0)
	for _, c := range cases {
		opts := ebpf.RunOptions{Data: c.frame, DataOut: make([]byte, len(c.frame)+64)}
		ret, err := d.Objs.SlXdpPrefilter.Run(&opts)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if ret != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, ret, c.want)
		}
		if ret == xdpPass && !bytes.Equal(opts.DataOut, c.frame) {
			t.Errorf("%s: passed packet was changed", c.name)
		}
		if c.want == xdpDrop {
			drops++
		} else if c.name[:6] == "denied" {
			passes++
		}
	}
	if got := d.Counter(gen.SluiceCounterCNT_XDP_DROP_DENIED); got != drops {
		t.Errorf("deny drops counted %d, want %d", got, drops)
	}
	if got := d.Counter(gen.SluiceCounterCNT_XDP_PASS_FAILSAFE); got != passes {
		t.Errorf("failsafe passes counted %d, want %d", got, passes)
	}
}
