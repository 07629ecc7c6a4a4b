package trace

// The few frames a trace builds and reads: Ethernet, IPv4 or IPv6, TCP or
// UDP. Written here rather than with a packet library: the agent's binary
// is the CLI's, and gopacket's tables (7 MB of enum metadata filled at
// init) were resident in every agent.

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
)

const (
	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
	protoICMP     = 1
	protoTCP      = 6
	protoUDP      = 17
	protoICMPv6   = 58
	ethHeaderLen  = 14
	ethMinFrame   = 60 // without the frame check sequence
	tcpHeaderLen  = 20
	udpHeaderLen  = 8
)

// TCP flag bits, in the order a summary names them.
var tcpFlags = []struct {
	bit  byte
	name string
}{{0x02, "SYN"}, {0x10, "ACK"}, {0x01, "FIN"}, {0x04, "RST"}, {0x08, "PSH"}}

// build serialises the packet, checksums included.
func build(pkt Packet) ([]byte, error) {
	src, dst := pkt.Src.Addr(), pkt.Dst.Addr()
	if src.Is4() != dst.Is4() {
		return nil, fmt.Errorf("trace: %v and %v are not of one family", pkt.Src, pkt.Dst)
	}
	var l4 []byte
	var proto byte
	switch pkt.Proto {
	case "tcp":
		proto = protoTCP
		l4 = make([]byte, tcpHeaderLen, tcpHeaderLen+len(pkt.Payload))
		binary.BigEndian.PutUint32(l4[4:], 1) // sequence number
		l4[12] = tcpHeaderLen / 4 << 4
		for f := range strings.SplitSeq(cmpOr(pkt.TCPFlags, "syn"), ",") {
			i := -1
			for j, known := range tcpFlags {
				if strings.EqualFold(strings.TrimSpace(f), known.name) {
					i = j
				}
			}
			if i < 0 {
				return nil, fmt.Errorf("trace: TCP flag %q: want syn, ack, fin, rst or psh", f)
			}
			l4[13] |= tcpFlags[i].bit
		}
		binary.BigEndian.PutUint16(l4[14:], 65535) // window
	case "udp":
		proto = protoUDP
		l4 = make([]byte, udpHeaderLen, udpHeaderLen+len(pkt.Payload))
		binary.BigEndian.PutUint16(l4[4:], uint16(udpHeaderLen+len(pkt.Payload)))
	default:
		return nil, fmt.Errorf("trace: protocol %q: want tcp or udp", pkt.Proto)
	}
	binary.BigEndian.PutUint16(l4[0:], pkt.Src.Port())
	binary.BigEndian.PutUint16(l4[2:], pkt.Dst.Port())
	l4 = append(l4, pkt.Payload...)
	if len(l4) > 0xffff-60 {
		return nil, fmt.Errorf("trace: a payload of %d bytes does not fit in a packet", len(pkt.Payload))
	}

	frame := make([]byte, ethHeaderLen, ethHeaderLen+40+len(l4))
	copy(frame[0:6], []byte{2, 0, 0, 0, 0, 2})  // destination MAC
	copy(frame[6:12], []byte{2, 0, 0, 0, 0, 1}) // source MAC
	var pseudo []byte                           // the L4 checksum's pseudo-header
	if src.Is4() {
		binary.BigEndian.PutUint16(frame[12:], etherTypeIPv4)
		ip := make([]byte, 20)
		ip[0] = 0x45 // version 4, 5 words
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		ip[6] = 0x40 // don't fragment
		ip[8], ip[9] = 64, proto
		s, d := src.As4(), dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		binary.BigEndian.PutUint16(ip[10:], checksum(ip))
		frame = append(frame, ip...)
		pseudo = append(append(append([]byte{}, s[:]...), d[:]...), 0, proto, byte(len(l4)>>8), byte(len(l4)))
	} else {
		binary.BigEndian.PutUint16(frame[12:], etherTypeIPv6)
		ip := make([]byte, 40)
		ip[0] = 0x60 // version 6
		binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
		ip[6], ip[7] = proto, 64
		s, d := src.As16(), dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
		frame = append(frame, ip...)
		pseudo = append(append(append([]byte{}, s[:]...), d[:]...), 0, 0, byte(len(l4)>>8), byte(len(l4)), 0, 0, 0, proto)
	}
	sum := checksum(append(pseudo, l4...))
	if proto == protoUDP && sum == 0 {
		sum = 0xffff // 0 means none in UDP (RFC 768)
	}
	if proto == protoTCP {
		binary.BigEndian.PutUint16(l4[16:], sum)
	} else {
		binary.BigEndian.PutUint16(l4[6:], sum)
	}
	frame = append(frame, l4...)
	// Short frames are padded to Ethernet's minimum, as on a wire (and as
	// the headers' lengths tell the datapath to ignore).
	return append(frame, make([]byte, max(0, ethMinFrame-len(frame)))...), nil
}

// checksum is the Internet checksum (RFC 1071) of b.
func checksum(b []byte) uint16 {
	var sum uint32
	for ; len(b) >= 2; b = b[2:] {
		sum += uint32(b[0])<<8 | uint32(b[1])
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// summary reads a frame like "tcp 10.0.0.5:43210 -> 10.96.0.10:80 [SYN]":
// the outer IP header's addresses, and the transport after it (past IPv6
// extension headers); what it cannot read it says it cannot.
func summary(frame []byte) string {
	if len(frame) < ethHeaderLen {
		return fmt.Sprintf("%d bytes, not IP", len(frame))
	}
	ip := frame[ethHeaderLen:]
	var src, dst netip.Addr
	var proto byte
	var l4 []byte
	switch binary.BigEndian.Uint16(frame[12:]) {
	case etherTypeIPv4:
		if len(ip) < 20 || ip[0]>>4 != 4 || int(ip[0]&0xf)*4 < 20 || len(ip) < int(ip[0]&0xf)*4 {
			return fmt.Sprintf("%d bytes, a truncated IPv4 header", len(frame))
		}
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		proto = ip[9]
		if binary.BigEndian.Uint16(ip[6:])&0x1fff != 0 { // a later fragment: no transport header
			return fmt.Sprintf("%v -> %v fragment", src, dst)
		}
		l4 = ip[int(ip[0]&0xf)*4:]
	case etherTypeIPv6:
		if len(ip) < 40 {
			return fmt.Sprintf("%d bytes, a truncated IPv6 header", len(frame))
		}
		src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		proto, l4 = ip[6], ip[40:]
		for proto == 0 || proto == 43 || proto == 44 || proto == 60 { // hop-by-hop, routing, fragment, destination options
			if len(l4) < 8 {
				return fmt.Sprintf("%v -> %v truncated", src, dst)
			}
			next, size := l4[0], (int(l4[1])+1)*8
			if proto == 44 {
				if binary.BigEndian.Uint16(l4[2:])&0xfff8 != 0 {
					return fmt.Sprintf("%v -> %v fragment", src, dst)
				}
				size = 8
			}
			if len(l4) < size {
				return fmt.Sprintf("%v -> %v truncated", src, dst)
			}
			proto, l4 = next, l4[size:]
		}
	default:
		return fmt.Sprintf("%d bytes, not IP", len(frame))
	}
	var ports [2]uint16
	if (proto == protoTCP || proto == protoUDP) && len(l4) >= 4 {
		ports = [2]uint16{binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])}
	}
	switch {
	case proto == protoTCP && len(l4) >= tcpHeaderLen:
		var flags []string
		for _, f := range tcpFlags {
			if l4[13]&f.bit != 0 {
				flags = append(flags, f.name)
			}
		}
		return fmt.Sprintf("tcp %v -> %v [%s]", netip.AddrPortFrom(src, ports[0]), netip.AddrPortFrom(dst, ports[1]), strings.Join(flags, ","))
	case proto == protoUDP && len(l4) >= udpHeaderLen:
		return fmt.Sprintf("udp %v -> %v", netip.AddrPortFrom(src, ports[0]), netip.AddrPortFrom(dst, ports[1]))
	case proto == protoICMP && len(l4) >= 2:
		return fmt.Sprintf("icmp %v -> %v type %d code %d", src, dst, l4[0], l4[1])
	case proto == protoICMPv6 && len(l4) >= 2:
		return fmt.Sprintf("icmpv6 %v -> %v type %d code %d", src, dst, l4[0], l4[1])
	}
	return fmt.Sprintf("%v -> %v protocol %d", src, dst, proto)
}
