package policy

import (
	"encoding/binary"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
)

// skbContext is struct __sk_buff as BPF_PROG_TEST_RUN takes it: cb is set,
// and the kernel writes the whole struct back.
type skbContext struct {
	Head [cbOffset / 4]uint32
	Cb   [5]uint32
	Rest [(192 - cbOffset - 20) / 4]uint32
}

// anyFrame is the packet Run passes: a policy program reads the flow's tuple
// from skb->cb, not from the packet.
var anyFrame = func() []byte {
	f := make([]byte, 14+20+8)
	binary.BigEndian.PutUint16(f[12:], 0x0800) // IPv4
	f[14] = 0x45
	binary.BigEndian.PutUint16(f[16:], 28)
	f[22], f[23] = 64, 17
	return f
}()

// Run judges one IPv4 packet with a compiled policy's entry program (or
// any program of its chain), as the datapath would hand it over: the tuple in
// skb->cb (bpf/include/policy.h), ingress or egress. It returns whether the
// policy allows the packet and the id of the rule that decided. It needs
// BPF privileges, like loading the program. Maps.Run judges packets of
// either family.
func Run(prog *ebpf.Program, pkt Packet, ingress bool) (allowed bool, rule uint32, err error) {
	return Maps{}.Run(prog, pkt, ingress)
}

// Run is the package's Run for a packet of either family: an IPv6 packet's
// addresses go where the datapath's hand-off leaves them, in m.Scratch6 (on
// every CPU: the test run may take any).
func (m Maps) Run(prog *ebpf.Program, pkt Packet, ingress bool) (allowed bool, rule uint32, err error) {
	var ctx, out skbContext
	if pkt.Src.Is6() {
		if m.Scratch6 == nil {
			return false, 0, fmt.Errorf("policy: run an IPv6 packet: no Scratch6 map")
		}
		var sc gen.SluiceCt6Scratch
		sc.Pol.Saddr, sc.Pol.Daddr = pkt.Src.As16(), pkt.Dst.As16()
		all := make([]gen.SluiceCt6Scratch, ebpf.MustPossibleCPU())
		for i := range all {
			all[i] = sc
		}
		if err := m.Scratch6.Put(uint32(0), all); err != nil {
			return false, 0, fmt.Errorf("policy: run: %w", err)
		}
		ctx.Cb[3] = familyIPv6
	} else {
		ctx.Cb[0] = gen.NetAddr(pkt.Src)
		ctx.Cb[1] = gen.NetAddr(pkt.Dst)
	}
	ctx.Cb[2] = uint32(gen.NetPort(pkt.SrcPort)) | uint32(gen.NetPort(pkt.DstPort))<<16
	ctx.Cb[3] |= uint32(pkt.Protocol) | uint32(pkt.ICMPType)<<8 | uint32(pkt.ICMPCode)<<16
	if ingress {
		ctx.Cb[3] |= 1 << dirShift
	}
	ret, err := prog.Run(&ebpf.RunOptions{Data: anyFrame, Context: ctx, ContextOut: &out})
	if err != nil {
		return false, 0, fmt.Errorf("policy: run: %w", err)
	}
	switch {
	case ret == tcActOK && out.Cb[3]&verdictAllow != 0:
		return true, out.Cb[4], nil
	case ret == tcActShot && out.Cb[3]&verdictDeny != 0:
		return false, out.Cb[4], nil
	}
	return false, 0, fmt.Errorf("policy: program returned %d with verdict bits %#x", ret, out.Cb[3]>>28)
}
