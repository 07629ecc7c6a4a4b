package gen_test

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// TC verdicts (linux/pkt_cls.h).
const (
	actOK       = 0
	actShot     = 2
	actRedirect = 7
)

const (
	protoICMP = 1
	protoTCP  = 6
	protoUDP  = 17
)

var (
	clientAP = netip.MustParseAddrPort("10.1.0.5:41234")
	vipAP    = netip.MustParseAddrPort("10.96.0.10:80")
	be1AP    = netip.MustParseAddrPort("10.2.0.7:8080")
	be2AP    = netip.MustParseAddrPort("10.2.0.8:8080")
	nodeIP   = netip.MustParseAddr("10.0.0.1")
	extAP    = netip.MustParseAddrPort("198.51.100.9:50000")
)

// dp is the datapath loaded with private maps, configured with nodeIP.
type dp struct {
	tb   testing.TB
	objs *gen.SluiceObjects
}

func newDP(tb testing.TB) *dp {
	tb.Helper()
	bpftest.Require(tb)
	objs, err := gen.Load(gen.LoadOptions{})
	if err != nil {
		tb.Fatalf("%+v", err)
	}
	tb.Cleanup(func() { objs.Close() })
	d := &dp{tb: tb, objs: objs}
	d.put(objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP)})
	d.put(objs.SlHostipV1, gen.SluiceHostipKey{Addr: gen.NetAddr(nodeIP)}, gen.SluiceHostipValue{})
	return d
}

func (d *dp) put(m *ebpf.Map, k, v any) {
	d.tb.Helper()
	if err := m.Put(k, v); err != nil {
		d.tb.Fatal(err)
	}
}

type backend struct {
	ap    netip.AddrPort
	local bool
}

// service is one frontend with its backends, written backends first.
type service struct {
	id       uint32
	front    netip.AddrPort // the wildcard NodePort entry uses 255.255.255.255
	proto    uint8
	backends []backend // local ones first
	affinity uint32
	flags    gen.SluiceFeFlags
}

func (d *dp) addService(s service) {
	d.tb.Helper()
	local := uint32(0)
	for i, b := range s.backends {
		v := gen.SluiceBeValue{Addr: gen.NetAddr(b.ap.Addr()), Port: gen.NetPort(b.ap.Port())}
		if b.local {
			v.Flags = gen.SluiceBeFlagsBE_LOCAL
			local++
		}
		d.put(d.objs.SlBeV1, gen.SluiceBeKey{SvcId: s.id, Ordinal: uint32(i)}, v)
	}
	d.put(d.objs.SlFeV1, feKey(s.front, s.proto), gen.SluiceFeValue{
		SvcId: s.id, Count: uint32(len(s.backends)), LocalCount: local,
		AffinityTimeout: s.affinity, Flags: s.flags,
	})
}

func feKey(ap netip.AddrPort, proto uint8) gen.SluiceFeKey {
	return gen.SluiceFeKey{Addr: gen.NetAddr(ap.Addr()), Port: gen.NetPort(ap.Port()), Proto: proto}
}

func ctKey(src, dst netip.AddrPort, proto uint8) gen.SluiceCtKey {
	return gen.SluiceCtKey{
		Saddr: gen.NetAddr(src.Addr()), Daddr: gen.NetAddr(dst.Addr()),
		Sport: gen.NetPort(src.Port()), Dport: gen.NetPort(dst.Port()), Proto: proto,
	}
}

// run runs prog on frame and returns the verdict and the frame it left.
func (d *dp) run(prog *ebpf.Program, frame []byte) (uint32, []byte) {
	d.tb.Helper()
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256)}
	ret, err := prog.Run(&opts)
	if err != nil {
		d.tb.Fatalf("run %v: %v", prog, err)
	}
	return ret, opts.DataOut
}

// runOK runs prog, requires TC_ACT_OK and returns the decoded, checksum-verified output.
func (d *dp) runOK(prog *ebpf.Program, frame []byte) *bpftest.Decoded {
	d.tb.Helper()
	ret, out := d.run(prog, frame)
	if ret != actOK {
		d.tb.Fatalf("verdict %d, want TC_ACT_OK", ret)
	}
	dec, err := bpftest.Decode(out)
	if err != nil {
		d.tb.Fatal(err)
	}
	return dec
}

func (d *dp) counter(c gen.SluiceCounter) uint64 {
	d.tb.Helper()
	var vs []uint64
	if err := d.objs.SlCountersV1.Lookup(c, &vs); err != nil {
		d.tb.Fatal(err)
	}
	var sum uint64
	for _, v := range vs {
		sum += v
	}
	return sum
}

func (d *dp) ct(k gen.SluiceCtKey) (gen.SluiceCtValue, bool) {
	var v gen.SluiceCtValue
	err := d.objs.SlCtV1.Lookup(k, &v)
	return v, err == nil
}

func (d *dp) ctCount() int {
	n := 0
	var k gen.SluiceCtKey
	var v gen.SluiceCtValue
	it := d.objs.SlCtV1.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n
}

func wantAP(tb testing.TB, what string, got, want netip.AddrPort) {
	tb.Helper()
	if got != want {
		tb.Fatalf("%s: %v, want %v", what, got, want)
	}
}
