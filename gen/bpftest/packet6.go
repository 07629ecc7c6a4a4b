package bpftest

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// IPv6 frames: Build and Decode hand over to these for an IPv6 PacketSpec or
// frame.

func build6(spec PacketSpec) []byte {
	hop := spec.TTL
	if hop == 0 {
		hop = 64
	}
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC, EthernetType: layers.EthernetTypeIPv6}
	ip := &layers.IPv6{
		Version: 6, HopLimit: hop, NextHeader: spec.Proto,
		SrcIP: spec.Src.Addr().AsSlice(), DstIP: spec.Dst.Addr().AsSlice(),
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
	case layers.IPProtocolICMPv6:
		icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(spec.ICMPType, spec.ICMPCode)}
		if err := icmp.SetNetworkLayerForChecksum(ip); err != nil {
			panic(err)
		}
		ls = append(ls, icmp)
		if spec.ICMPType == layers.ICMPv6TypeEchoRequest || spec.ICMPType == layers.ICMPv6TypeEchoReply {
			ls = append(ls, &layers.ICMPv6Echo{Identifier: spec.ICMPID, SeqNumber: 1})
		}
	}
	ls = append(ls, gopacket.Payload(spec.Payload))
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		panic(fmt.Sprintf("build packet %+v: %v", spec, err))
	}
	return buf.Bytes()
}

// ExtHeader is an IPv6 extension header to insert with WithExtHeaders: its
// type (0 hop-by-hop, 43 routing, 60 destination options, 44 fragment) and
// its body after the next-header byte (the length byte included, except
// for a fragment header, which is always 8 bytes).
type ExtHeader struct {
	Type uint8
	Body []byte
}

// PadOptions is an extension header body of n*8 bytes: the length byte and
// PadN options, for hop-by-hop and destination options headers.
func PadOptions(n int) []byte {
	b := make([]byte, n*8-1)
	b[0] = byte(n - 1)
	b[1], b[2] = 1, byte(len(b)-3) // PadN covering the rest
	return b
}

// WithExtHeaders inserts extension headers, in order, between the IPv6
// header of an Ethernet/IPv6 frame and its upper-layer header. The L4
// checksum stays valid: it does not cover extension headers.
func WithExtHeaders(frame []byte, hdrs ...ExtHeader) []byte {
	const l3 = 14
	out := append([]byte(nil), frame[:l3+40]...)
	next := out[l3+6]
	for i, h := range hdrs {
		if i == 0 {
			out[l3+6] = h.Type
		}
		nh := next
		if i+1 < len(hdrs) {
			nh = hdrs[i+1].Type
		}
		out = append(out, nh)
		out = append(out, h.Body...)
	}
	out = append(out, frame[l3+40:]...)
	binary.BigEndian.PutUint16(out[l3+4:l3+6], uint16(len(out)-l3-40))
	return out
}

// FragmentHeader is the body of a fragment header at byte offset off of the
// datagram, with the More Fragments bit and identification id.
func FragmentHeader(off int, more bool, id uint32) []byte {
	b := make([]byte, 7)
	fo := uint16(off/8) << 3
	if more {
		fo |= 1
	}
	binary.BigEndian.PutUint16(b[1:3], fo)
	binary.BigEndian.PutUint32(b[3:7], id)
	return b
}

// Fragment6 splits an Ethernet/IPv6 frame without extension headers into
// fragments whose fragmentable part holds at most size bytes (rounded down
// to a multiple of 8), each with a fragment header of identification id.
func Fragment6(frame []byte, size int, id uint32) [][]byte {
	const l3 = 14
	payload := frame[l3+40:]
	size &^= 7
	var out [][]byte
	for off := 0; off < len(payload); off += size {
		end := min(off+size, len(payload))
		f := append([]byte(nil), frame[:l3+40]...)
		f = append(f, payload[off:end]...)
		f = WithExtHeaders(f, ExtHeader{Type: 44, Body: FragmentHeader(off, end < len(payload), id)})
		// WithExtHeaders keeps the upper-layer protocol as the fragment
		// header's next header, for every fragment.
		f[l3+40] = frame[l3+6]
		out = append(out, f)
	}
	return out
}

func decode6(frame []byte, p gopacket.Packet, d *Decoded, ip6 *layers.IPv6) (*Decoded, error) {
	d.IP6 = ip6
	src, _ := netip.AddrFromSlice(ip6.SrcIP.To16())
	dst, _ := netip.AddrFromSlice(ip6.DstIP.To16())
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
	if c, ok := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6); ok {
		d.ICMP6 = c
	}
	d.Src, d.Dst = netip.AddrPortFrom(src, sport), netip.AddrPortFrom(dst, dport)
	return d, VerifyChecksums(frame)
}

// verifyChecksums6 checks the TCP, UDP or ICMPv6 checksum of an IPv6
// packet (IPv6 has no header checksum), walking extension headers.
func verifyChecksums6(ip []byte) error {
	if len(ip) < 40 {
		return fmt.Errorf("IPv6 packet too short: %d bytes", len(ip))
	}
	total := 40 + int(binary.BigEndian.Uint16(ip[4:6]))
	if total > len(ip) {
		return fmt.Errorf("bad IPv6 payload length: %d in %d bytes", total-40, len(ip))
	}
	next, off := ip[6], 40
	for next == 0 || next == 43 || next == 60 || next == 44 {
		if off+8 > total {
			return fmt.Errorf("extension header cut short")
		}
		if next == 44 {
			if binary.BigEndian.Uint16(ip[off+2:off+4])&0xfff9 != 0 {
				return nil // a fragment's L4 checksum covers data in other fragments
			}
			next, off = ip[off], off+8
			continue
		}
		next, off = ip[off], off+(int(ip[off+1])+1)*8
	}
	l4 := ip[off:total]
	switch next {
	case 132:
		return SCTPChecksum(l4)
	case 6, 17, 58:
		var pseudo uint32
		for i := 8; i < 40; i += 2 {
			pseudo += uint32(binary.BigEndian.Uint16(ip[i:]))
		}
		pseudo += uint32(next) + uint32(len(l4))
		if s := checksum(l4, pseudo); s != 0 {
			return fmt.Errorf("L4 (protocol %d) checksum invalid (sum %#04x)", next, s)
		}
	}
	return nil
}
