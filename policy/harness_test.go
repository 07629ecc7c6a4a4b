package policy_test

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/policy"
)

// skbContext is struct __sk_buff as BPF_PROG_TEST_RUN takes it: a test may
// set cb (and a few other fields); the kernel writes the whole struct back.
type skbContext struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex, TcIndex                                  uint32
	Cb                                                                          [5]uint32
	Rest                                                                        [(192 - 68) / 4]uint32
}

type env struct {
	tb   testing.TB
	dp   *bpftest.Datapath
	maps policy.Maps
}

func newEnv(tb testing.TB) *env {
	dp := bpftest.NewDatapath(tb, netip.MustParseAddr("10.0.0.1"))
	return &env{tb: tb, dp: dp, maps: policy.Maps{Programs: dp.Objs.SlPolprogV1, IPSets: dp.Objs.SlIpsetV1, RuleCounters: dp.Objs.SlRulectrV1}}
}

// load compiles p into slots 1.. and returns the entry program.
func (e *env) load(p *policy.EndpointPolicy, perProgram int) *ebpf.Program {
	e.tb.Helper()
	c := policy.Compiler{Maps: e.maps, RulesPerProgram: perProgram}
	specs, err := c.Compile("test", p, 1)
	if err != nil {
		e.tb.Fatal(err)
	}
	var entry *ebpf.Program
	for i, s := range specs {
		prog, err := ebpf.NewProgram(s)
		if err != nil {
			e.tb.Fatalf("load program %d: %v", i, err)
		}
		if err := e.maps.Programs.Put(uint32(1+i), prog); err != nil {
			e.tb.Fatal(err)
		}
		if i == 0 {
			entry = prog
			e.tb.Cleanup(func() { entry.Close() })
		} else {
			prog.Close()
		}
	}
	return entry
}

func (e *env) setIPSets(sets policy.IPSets) {
	for id, members := range sets {
		for _, m := range members {
			k := gen.SluiceIpsetKey{Prefixlen: 32 + uint32(m.Bits()), SetId: gen.NetUint32(id), Addr: gen.NetAddr(m.Masked().Addr())}
			e.dp.Put(e.dp.Objs.SlIpsetV1, k, gen.SluiceIpsetValue{})
		}
	}
}

func netOrder16(v uint16) uint32 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return uint32(binary.LittleEndian.Uint16(b[:]))
}

// frame is any valid frame: the policy reads the tuple from cb, not the packet.
var frame = bpftest.UDPPacket(netip.MustParseAddrPort("192.0.2.1:1"), netip.MustParseAddrPort("192.0.2.2:2"), nil)

// run evaluates pkt with prog and returns (allowed, rule id).
func (e *env) run(prog *ebpf.Program, pkt policy.Packet, ingress bool) (bool, uint32) {
	e.tb.Helper()
	ctx := skbContext{}
	ctx.Cb[0] = gen.NetAddr(pkt.Src)
	ctx.Cb[1] = gen.NetAddr(pkt.Dst)
	ctx.Cb[2] = netOrder16(pkt.SrcPort) | netOrder16(pkt.DstPort)<<16
	ctx.Cb[3] = uint32(pkt.Protocol) | uint32(pkt.ICMPType)<<8 | uint32(pkt.ICMPCode)<<16
	if ingress {
		ctx.Cb[3] |= 1 << 24
	}
	var out skbContext
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, Context: ctx, ContextOut: &out})
	if err != nil {
		e.tb.Fatal(err)
	}
	allowed := ret == 0
	if !allowed && ret != 2 {
		e.tb.Fatalf("verdict %d", ret)
	}
	wantBit := uint32(1 << 29)
	if allowed {
		wantBit = 1 << 28
	}
	if out.Cb[3]&wantBit == 0 {
		e.tb.Fatalf("return %d but cb verdict bits %#x", ret, out.Cb[3])
	}
	return allowed, out.Cb[4]
}
