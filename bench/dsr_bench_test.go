package bench

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// externalSYNs returns SYNs to dst from distinct external clients: the
// source address and port change with i (checksums are not fixed up: no
// program verifies them). opt, when set, is an IPv4 option every SYN carries.
func externalSYNs(dst netip.AddrPort, opt []byte) func(int) []byte {
	tmpl := bpftest.Build(bpftest.PacketSpec{Src: External, Dst: dst, Proto: layers.IPProtocolTCP, TCPFlags: bpftest.SYN, IPOptions: opt})
	l4 := 14 + 20 + len(opt)
	return func(i int) []byte {
		f := tmpl
		f[14+13], f[14+14], f[14+15] = byte(i>>16), byte(i>>8), byte(i)
		binary.BigEndian.PutUint16(f[l4:], uint16(1024+i%60000))
		return f
	}
}

// dsrOption is the option (bpf/include/dsr.h) the balancing node puts on a
// flow's first packet to a remote backend.
func dsrOption(front netip.AddrPort) []byte {
	opt := []byte{0x9e, 8, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(opt[2:], front.Port())
	copy(opt[4:], front.Addr().AsSlice())
	return opt
}

// BenchmarkDSR: a NodePort flow from outside to a backend on another node,
// SNATed (--external-service-mode=snat, the default) against DSR, on both
// nodes. The balancing node: a new flow's SYN (DSR inserts the option) and an
// established segment; with SNAT it also translates every reply, which DSR
// never sends it. The backend's node: the first packet (DSR removes the
// option and writes the flow's entries; SNAT's arrives as an untranslated
// flow from the balancing node, tracked), an established segment, and the
// backend's reply (DSR's is given the frontend as source and routed by the
// FIB; SNAT's leaves untranslated).
func BenchmarkDSR(b *testing.B) {
	b.Run("floor", benchFloor)
	front := netip.AddrPortFrom(nodeIP, 30080)
	remote := netip.MustParseAddrPort("10.3.0.4:8080")
	for _, mode := range []struct {
		name  string
		flags gen.SluiceConfigFlags
	}{{"snat", 0}, {"dsr", gen.SluiceConfigFlagsCFG_DSR_TCP}} {
		d := bpftest.NewDatapath(b, nodeIP)
		d.Put(d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP), Flags: mode.flags})
		d.AddService(bpftest.Service{ID: 1, Front: front, Proto: bpftest.ProtoTCP,
			Backends: []bpftest.Backend{{AP: remote}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
		b.Run("balancing-new-flow-"+mode.name, func(b *testing.B) {
			// SNAT gives every flow a port of the node's address toward the
			// one backend: a range of about 28,000 fills long before
			// newFlowsPerClear flows (DSR takes none). Emptied (outside the
			// timed runs) every 10,000.
			syns := externalSYNs(front, nil)
			measureNew(b, d.ClearConntrack, d.Objs.SlFromHost, bpftest.ActOK, func(i int) []byte {
				if i > 0 && i%10_000 == 0 {
					d.ClearConntrack()
				}
				return syns(i)
			})
		})
		d.ClearConntrack()
		out := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(External, front, bpftest.SYN))
		b.Run("balancing-established-"+mode.name, func(b *testing.B) {
			measure(b, d.Objs.SlFromHost, bpftest.ActOK, fixed(bpftest.TCPPacket(External, front, bpftest.ACK)))
		})
		if mode.flags == 0 {
			b.Run("balancing-reply-snat", func(b *testing.B) {
				measure(b, d.Objs.SlFromHost, bpftest.ActOK, fixed(bpftest.TCPPacket(remote, out.Src, bpftest.ACK)))
			})
		}

		// The backend's node: remote is its pod. What arrives is what the
		// balancing node sent.
		be := bpftest.NewDatapath(b, netip.MustParseAddr("10.0.0.2"))
		var firstPackets func(int) []byte
		src := External
		if mode.flags == 0 {
			src = out.Src
			firstPackets = func(i int) []byte {
				return bpftest.TCPPacket(netip.AddrPortFrom(nodeIP, uint16(1024+i%60000)), remote, bpftest.SYN)
			}
		} else {
			firstPackets = externalSYNs(remote, dsrOption(front))
		}
		b.Run("backend-first-packet-"+mode.name, func(b *testing.B) {
			measureNew(b, be.ClearConntrack, be.Objs.SlFromHost, bpftest.ActOK, firstPackets)
		})
		be.ClearConntrack()
		first := bpftest.TCPPacket(src, remote, bpftest.SYN)
		if mode.flags != 0 {
			first = bpftest.Build(bpftest.PacketSpec{Src: src, Dst: remote, Proto: layers.IPProtocolTCP, TCPFlags: bpftest.SYN, IPOptions: dsrOption(front)})
		}
		be.RunOK(be.Objs.SlFromHost, first)
		b.Run("backend-established-"+mode.name, func(b *testing.B) {
			measure(b, be.Objs.SlFromHost, bpftest.ActOK, fixed(bpftest.TCPPacket(src, remote, bpftest.ACK)))
		})
		reply := bpftest.TCPPacket(remote, src, bpftest.ACK)
		verdict, _ := be.Run(be.Objs.SlFromWl, reply) // DSR's: FIB-routed, or passed where the FIB does not forward
		b.Run("backend-reply-"+mode.name, func(b *testing.B) {
			measure(b, be.Objs.SlFromWl, verdict, fixed(reply))
		})
	}
}
