package bpftest

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net"
	"net/netip"
	"slices"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// Frame addresses used by every built packet: the datapath never looks at them.
var (
	srcMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	dstMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 2}
)

// TCP flag sets for PacketSpec.TCPFlags.
const (
	FIN = 1 << iota
	SYN
	RST
	PSH
	ACK
)

// PacketSpec describes an Ethernet/IPv4 or Ethernet/IPv6 frame to build: the
// family is Src's.
type PacketSpec struct {
	Src, Dst netip.AddrPort
	Proto    layers.IPProtocol // TCP, UDP, SCTP, ICMPv4 or ICMPv6
	TCPFlags uint8             // for TCP
	// SCTPChunk is an SCTP packet's one chunk's type (0: DATA); Payload is
	// the chunk's value, padded to 4 bytes.
	SCTPChunk uint8
	Seq       uint32 // for TCP
	ICMPType  uint8  // for ICMPv4 and ICMPv6
	ICMPCode  uint8
	ICMPID    uint16 // echo identifier
	Payload   []byte
	TTL       uint8 // 64 when zero
	// IPOptions are appended to the IPv4 header (padded to 4 bytes).
	IPOptions []byte
	// Fragment sets the More Fragments bit.
	Fragment bool
	// ID is the IPv4 identification (0x1234 when zero).
	ID uint16
}

// Build serialises spec with valid lengths and checksums.
func Build(spec PacketSpec) []byte {
	if spec.Src.Addr().Is6() {
		return build6(spec)
	}
	ttl := spec.TTL
	if ttl == 0 {
		ttl = 64
	}
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{
		Version: 4, TTL: ttl, Protocol: spec.Proto, Id: cmp.Or(spec.ID, 0x1234),
		SrcIP: spec.Src.Addr().AsSlice(), DstIP: spec.Dst.Addr().AsSlice(),
	}
	if spec.Fragment {
		ip.Flags = layers.IPv4MoreFragments
	}
	if len(spec.IPOptions) > 0 {
		ip.Options = []layers.IPv4Option{{OptionType: spec.IPOptions[0], OptionLength: uint8(len(spec.IPOptions)), OptionData: spec.IPOptions[2:]}}
	}
	ls := []gopacket.SerializableLayer{eth, ip}
	switch spec.Proto {
	case layers.IPProtocolTCP:
		tcp := &layers.TCP{
			SrcPort: layers.TCPPort(spec.Src.Port()), DstPort: layers.TCPPort(spec.Dst.Port()),
			Seq: spec.Seq, Window: 65535,
			FIN: spec.TCPFlags&FIN != 0, SYN: spec.TCPFlags&SYN != 0, RST: spec.TCPFlags&RST != 0,
			PSH: spec.TCPFlags&PSH != 0, ACK: spec.TCPFlags&ACK != 0,
		}
		if err := tcp.SetNetworkLayerForChecksum(ip); err != nil {
			panic(err)
		}
		ls = append(ls, tcp)
	case layers.IPProtocolUDP:
		udp := &layers.UDP{SrcPort: layers.UDPPort(spec.Src.Port()), DstPort: layers.UDPPort(spec.Dst.Port())}
		if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
			panic(err)
		}
		ls = append(ls, udp)
	case layers.IPProtocolSCTP:
		ls = append(ls, sctpLayers(spec)...)
		spec.Payload = nil
	case layers.IPProtocolICMPv4:
		ls = append(ls, &layers.ICMPv4{
			TypeCode: layers.CreateICMPv4TypeCode(spec.ICMPType, spec.ICMPCode),
			Id:       spec.ICMPID, Seq: 1,
		})
	}
	ls = append(ls, gopacket.Payload(spec.Payload))
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		panic(fmt.Sprintf("build packet %+v: %v", spec, err))
	}
	return buf.Bytes()
}

// sctpLayers are an SCTP packet's common header and its one chunk
// (gopacket computes the CRC32c over both).
func sctpLayers(spec PacketSpec) []gopacket.SerializableLayer {
	chunk := make([]byte, 4, 4+len(spec.Payload)+3)
	chunk[0] = spec.SCTPChunk
	binary.BigEndian.PutUint16(chunk[2:], uint16(4+len(spec.Payload)))
	chunk = append(chunk, spec.Payload...)
	for len(chunk)%4 != 0 {
		chunk = append(chunk, 0)
	}
	return []gopacket.SerializableLayer{
		&layers.SCTP{SrcPort: layers.SCTPPort(spec.Src.Port()), DstPort: layers.SCTPPort(spec.Dst.Port()), VerificationTag: 0x5c7b0001},
		gopacket.Payload(chunk),
	}
}

// SCTP chunk types for PacketSpec.SCTPChunk (RFC 9260 3.2).
const (
	SCTPData             = 0
	SCTPInit             = 1
	SCTPInitAck          = 2
	SCTPAbort            = 6
	SCTPShutdown         = 7
	SCTPShutdownAck      = 8
	SCTPCookieEcho       = 10
	SCTPCookieAck        = 11
	SCTPShutdownComplete = 14
)

// SCTPPacket builds an SCTP packet with one chunk of the given type.
func SCTPPacket(src, dst netip.AddrPort, chunk uint8, payload []byte) []byte {
	return Build(PacketSpec{Src: src, Dst: dst, Proto: layers.IPProtocolSCTP, SCTPChunk: chunk, Payload: payload})
}

// SCTPChecksum checks an SCTP packet's CRC32c (RFC 9260 6.8: over the
// packet with its checksum field zero, stored little-endian).
func SCTPChecksum(l4 []byte) error {
	if len(l4) < 12 {
		return fmt.Errorf("SCTP packet too short: %d bytes", len(l4))
	}
	b := slices.Clone(l4)
	stored := binary.LittleEndian.Uint32(b[8:12])
	clear(b[8:12])
	if sum := crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)); sum != stored {
		return fmt.Errorf("SCTP CRC32c invalid: %#08x, want %#08x", stored, sum)
	}
	return nil
}

// TCPPacket builds a TCP segment with the given flags.
func TCPPacket(src, dst netip.AddrPort, flags uint8) []byte {
	return Build(PacketSpec{Src: src, Dst: dst, Proto: layers.IPProtocolTCP, TCPFlags: flags})
}

// UDPPacket builds a UDP datagram.
func UDPPacket(src, dst netip.AddrPort, payload []byte) []byte {
	return Build(PacketSpec{Src: src, Dst: dst, Proto: layers.IPProtocolUDP, Payload: payload})
}

// Decoded is a parsed frame with the fields tests assert on.
type Decoded struct {
	Packet   gopacket.Packet
	IP       *layers.IPv4 // nil for IPv6
	IP6      *layers.IPv6 // nil for IPv4
	TCP      *layers.TCP
	UDP      *layers.UDP
	SCTP     *layers.SCTP
	ICMP     *layers.ICMPv4
	ICMP6    *layers.ICMPv6
	Src, Dst netip.AddrPort
}

// Decode parses an Ethernet frame and verifies the IP and L4 checksums.
func Decode(frame []byte) (*Decoded, error) {
	p := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	d := &Decoded{Packet: p}
	if ip6, ok := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ok {
		return decode6(frame, p, d, ip6)
	}
	ipl, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if !ok {
		return nil, fmt.Errorf("decode: no IPv4 layer: %v", p.ErrorLayer())
	}
	// Application payloads (gopacket guesses DNS on port 53, say) may fail to
	// decode; only the IPv4 and transport layers matter here.
	d.IP = ipl
	src, _ := netip.AddrFromSlice(ipl.SrcIP.To4())
	dst, _ := netip.AddrFromSlice(ipl.DstIP.To4())
	var sport, dport uint16
	if t, ok := p.Layer(layers.LayerTypeTCP).(*layers.TCP); ok {
		d.TCP, sport, dport = t, uint16(t.SrcPort), uint16(t.DstPort)
	}
	if u, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP); ok {
		d.UDP, sport, dport = u, uint16(u.SrcPort), uint16(u.DstPort)
	}
	if s, ok := p.Layer(layers.LayerTypeSCTP).(*layers.SCTP); ok {
		d.SCTP, sport, dport = s, uint16(s.SrcPort), uint16(s.DstPort)
	}
	if c, ok := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok {
		d.ICMP = c
	}
	d.Src, d.Dst = netip.AddrPortFrom(src, sport), netip.AddrPortFrom(dst, dport)
	if err := VerifyChecksums(frame); err != nil {
		return d, err
	}
	return d, nil
}

// VerifyChecksums checks the IPv4 header checksum and the TCP, UDP, SCTP or
// ICMP checksum of an Ethernet frame, computed from scratch.
func VerifyChecksums(frame []byte) error {
	const ethLen = 14
	if len(frame) >= ethLen && binary.BigEndian.Uint16(frame[12:14]) == 0x86dd {
		return verifyChecksums6(frame[ethLen:])
	}
	if len(frame) < ethLen+20 {
		return fmt.Errorf("frame too short: %d bytes", len(frame))
	}
	ip := frame[ethLen:]
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	if total > len(ip) || ihl > total {
		return fmt.Errorf("bad IPv4 lengths: ihl %d total %d frame %d", ihl, total, len(ip))
	}
	if s := checksum(ip[:ihl], 0); s != 0 {
		return fmt.Errorf("IPv4 header checksum invalid (sum %#04x)", s)
	}
	l4 := ip[ihl:total]
	if binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0 {
		return nil // a fragment's L4 checksum covers data in other fragments
	}
	switch ip[9] {
	case 6, 17:
		if ip[9] == 17 && len(l4) >= 8 && binary.BigEndian.Uint16(l4[6:8]) == 0 {
			return nil // UDP without checksum
		}
		var pseudo uint32
		pseudo += uint32(binary.BigEndian.Uint16(ip[12:14])) + uint32(binary.BigEndian.Uint16(ip[14:16]))
		pseudo += uint32(binary.BigEndian.Uint16(ip[16:18])) + uint32(binary.BigEndian.Uint16(ip[18:20]))
		pseudo += uint32(ip[9]) + uint32(len(l4))
		if s := checksum(l4, pseudo); s != 0 {
			return fmt.Errorf("L4 (protocol %d) checksum invalid (sum %#04x)", ip[9], s)
		}
	case 132:
		return SCTPChecksum(l4)
	case 1:
		if s := checksum(l4, 0); s != 0 {
			return fmt.Errorf("ICMP checksum invalid (sum %#04x)", s)
		}
	}
	return nil
}

// checksum returns the ones' complement of the ones' complement sum of b plus
// initial; zero means the data carries a valid checksum.
func checksum(b []byte, initial uint32) uint16 { return ^OnesSum(b, initial) }

// OnesSum is the ones' complement sum of b as 16-bit big-endian words (an
// odd last byte padded with zero), plus initial, folded to 16 bits.
func OnesSum(b []byte, initial uint32) uint16 {
	sum := initial
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// Fragment splits an Ethernet/IPv4 frame into IPv4 fragments whose IP payloads
// hold at most size bytes (rounded down to a multiple of 8), as a sender whose
// datagram exceeds the MTU does. Every fragment keeps the frame's IP header
// (options included) with its own offset, length, MF bit and checksum.
func Fragment(frame []byte, size int) [][]byte {
	const ethLen = 14
	ip := frame[ethLen:]
	ihl := int(ip[0]&0x0f) * 4
	payload := ip[ihl:binary.BigEndian.Uint16(ip[2:4])]
	size &^= 7
	var out [][]byte
	for off := 0; off < len(payload); off += size {
		end := min(off+size, len(payload))
		f := make([]byte, 0, ethLen+ihl+end-off)
		f = append(f, frame[:ethLen+ihl]...)
		f = append(f, payload[off:end]...)
		h := f[ethLen : ethLen+ihl]
		binary.BigEndian.PutUint16(h[2:4], uint16(ihl+end-off))
		fo := uint16(off / 8)
		if end < len(payload) {
			fo |= 0x2000 // MF
		}
		binary.BigEndian.PutUint16(h[6:8], fo)
		binary.BigEndian.PutUint16(h[10:12], 0)
		binary.BigEndian.PutUint16(h[10:12], checksum(h, 0))
		out = append(out, f)
	}
	return out
}

// Reassemble joins the fragments of one datagram (in any order; duplicates
// and overlaps are laid over each other, as a receiver may) into one
// Ethernet/IPv4 frame with the first fragment's headers, for Decode to verify.
// It fails when the fragments disagree on the datagram or leave a hole.
func Reassemble(frags [][]byte) ([]byte, error) {
	const ethLen = 14
	var first []byte
	payload := map[int]byte{}
	total := -1
	for _, f := range frags {
		ip := f[ethLen:]
		ihl := int(ip[0]&0x0f) * 4
		fo := binary.BigEndian.Uint16(ip[6:8])
		off := int(fo&0x1fff) * 8
		data := ip[ihl:binary.BigEndian.Uint16(ip[2:4])]
		if off == 0 {
			first = f[:ethLen+ihl]
		}
		if fo&0x2000 == 0 {
			total = off + len(data)
		}
		for i, b := range data {
			payload[off+i] = b
		}
	}
	if first == nil || total < 0 {
		return nil, fmt.Errorf("reassemble: first or last fragment missing")
	}
	out := append([]byte(nil), first...)
	for i := range total {
		b, ok := payload[i]
		if !ok {
			return nil, fmt.Errorf("reassemble: hole at byte %d of %d", i, total)
		}
		out = append(out, b)
	}
	h := out[ethLen:]
	ihl := int(h[0]&0x0f) * 4
	binary.BigEndian.PutUint16(h[2:4], uint16(ihl+total))
	binary.BigEndian.PutUint16(h[6:8], 0)
	binary.BigEndian.PutUint16(h[10:12], 0)
	binary.BigEndian.PutUint16(h[10:12], checksum(h[:ihl], 0))
	return out, nil
}
