package bench

import (
	"net/netip"

	"github.com/sluice-net/sluice/gen/bpftest"
)

// Frames for every datapath path, reusable by any module's tests and
// benchmarks. Each builder returns a fresh frame.
var (
	// Client is the workload that starts flows.
	Client = netip.MustParseAddrPort("10.1.0.5:41234")
	// External is a client outside the cluster.
	External = netip.MustParseAddrPort("198.51.100.9:50000")
)

// NewFlow is the first packet (SYN) of the i-th distinct flow from Client's
// address to dst: source port and address change with i.
func NewFlow(dst netip.AddrPort, i int) []byte {
	b := Client.Addr().As4()
	b[1], b[2], b[3] = byte(i>>16), byte(i>>8), byte(i)
	return bpftest.TCPPacket(netip.AddrPortFrom(netip.AddrFrom4(b), uint16(1024+i%60000)), dst, bpftest.SYN)
}

// Established is a later packet of the flow Client -> dst.
func Established(dst netip.AddrPort) []byte { return bpftest.TCPPacket(Client, dst, bpftest.ACK) }

// Reply is the backend's answer to Client.
func Reply(backend netip.AddrPort) []byte {
	return bpftest.TCPPacket(backend, Client, bpftest.ACK)
}

// NodePortSYN is an external client's first packet to a NodePort.
func NodePortSYN(node netip.Addr, port uint16, i int) []byte {
	return bpftest.TCPPacket(netip.AddrPortFrom(External.Addr(), uint16(1024+i%60000)), netip.AddrPortFrom(node, port), bpftest.SYN)
}

// Malformed is a TCP SYN cut inside its TCP header.
func Malformed(dst netip.AddrPort) []byte {
	f := bpftest.TCPPacket(Client, dst, bpftest.SYN)
	return f[:14+20+10]
}

// Fragments is a UDP datagram of n payload bytes from src to dst, split into
// IPv4 fragments of at most 1480 payload bytes (a 1500-byte MTU).
func Fragments(src, dst netip.AddrPort, n int) [][]byte {
	return bpftest.Fragment(bpftest.UDPPacket(src, dst, make([]byte, n)), 1480)
}

// The IPv6 twins of the paths above.
var (
	// Client6 is the workload that starts IPv6 flows.
	Client6 = netip.MustParseAddrPort("[fd00:1::5]:41234")
	// External6 is an IPv6 client outside the cluster.
	External6 = netip.MustParseAddrPort("[2001:db8::9]:50000")
)

// NewFlow6 is NewFlow from Client6's address.
func NewFlow6(dst netip.AddrPort, i int) []byte {
	b := Client6.Addr().As16()
	b[13], b[14], b[15] = byte(i>>16), byte(i>>8), byte(i)
	return bpftest.TCPPacket(netip.AddrPortFrom(netip.AddrFrom16(b), uint16(1024+i%60000)), dst, bpftest.SYN)
}

// NodePortSYN6 is an external IPv6 client's first packet to a NodePort.
func NodePortSYN6(node netip.Addr, port uint16, i int) []byte {
	return bpftest.TCPPacket(netip.AddrPortFrom(External6.Addr(), uint16(1024+i%60000)), netip.AddrPortFrom(node, port), bpftest.SYN)
}

// Malformed6 is an IPv6 TCP SYN cut inside its TCP header.
func Malformed6(dst netip.AddrPort) []byte {
	f := bpftest.TCPPacket(Client6, dst, bpftest.SYN)
	return f[:14+40+10]
}

// Fragments6 is Fragments over IPv6: fragments of at most 1448 bytes after
// the IPv6 and fragment headers (a 1500-byte MTU).
func Fragments6(src, dst netip.AddrPort, n int) [][]byte {
	return bpftest.Fragment6(bpftest.UDPPacket(src, dst, make([]byte, n)), 1448, 0x5eed)
}
