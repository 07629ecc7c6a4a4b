package bpftest

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
)

// TC verdicts (linux/pkt_cls.h).
const (
	ActOK       = 0
	ActShot     = 2
	ActRedirect = 7
)

// IP protocol numbers as the maps store them.
const (
	ProtoICMP   = 1
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoSCTP   = 132
	ProtoICMPv6 = 58
)

// Datapath is Sluice's programs loaded with private maps, for tests and
// benchmarks that drive them with BPF_PROG_TEST_RUN.
type Datapath struct {
	TB   testing.TB
	Objs *gen.SluiceObjects
}

// NewDatapath loads the programs and configures nodeIP as the node's address
// (SNAT source and NodePort wildcard match).
func NewDatapath(tb testing.TB, nodeIP netip.Addr) *Datapath {
	tb.Helper()
	return NewDatapathWithMaps(tb, nodeIP, nil)
}

// NewDatapathWithMaps is NewDatapath with some maps given by name (e.g. a
// small conntrack map, to fill it). Without maps, the datapath may be one an
// earlier test of the binary used, its maps emptied (pool.go); with maps, it
// is a new load.
func NewDatapathWithMaps(tb testing.TB, nodeIP netip.Addr, m map[string]*ebpf.Map) *Datapath {
	tb.Helper()
	Require(tb)
	var objs *gen.SluiceObjects
	var err error
	shared := len(m) == 0
	if shared {
		objs, err = acquire()
	} else {
		objs, err = gen.Load(gen.LoadOptions{Maps: m})
	}
	if err != nil {
		tb.Fatalf("%+v", err)
	}
	tb.Cleanup(func() {
		if !shared {
			objs.Close()
			return
		}
		if err := release(objs); err != nil {
			tb.Errorf("datapath left in a state the next test cannot start from: %v", err)
		}
	})
	d := &Datapath{TB: tb, Objs: objs}
	d.Put(objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP)})
	d.Put(objs.SlHostipV1, gen.SluiceHostipKey{Addr: gen.NetAddr(nodeIP)}, gen.SluiceHostipValue{})
	return d
}

// SetNodeIP6 configures nodeIP as the node's IPv6 address (SNAT source of
// IPv6 flows and NodePort wildcard match).
func (d *Datapath) SetNodeIP6(nodeIP netip.Addr) {
	d.TB.Helper()
	d.Put(d.Objs.SlConfig6V1, uint32(0), gen.SluiceConfig6{NodeIp: gen.NetAddr6(nodeIP)})
	d.Put(d.Objs.SlHostip6V1, gen.SluiceHostip6Key{Addr: gen.NetAddr6(nodeIP)}, gen.SluiceHostipValue{})
}

// Put writes one map entry or fails the test.
func (d *Datapath) Put(m *ebpf.Map, k, v any) {
	d.TB.Helper()
	if err := m.Put(k, v); err != nil {
		d.TB.Fatal(err)
	}
}

// Backend is one backend of a Service.
type Backend struct {
	AP    netip.AddrPort
	Local bool
}

// Service is one frontend with its backends.
type Service struct {
	ID       uint32
	Front    netip.AddrPort // the NodePort wildcard is 255.255.255.255 (IPv6: all ones); its family picks the maps
	Proto    uint8
	Backends []Backend // local ones first
	Affinity uint32    // seconds
	Flags    gen.SluiceFeFlags
	// ClusterStart is the first backend of the cluster range; those before
	// it serve external-local traffic only (local but terminating, say).
	ClusterStart uint32
}

// AddService writes the backends, then the frontend that points at them.
func (d *Datapath) AddService(s Service) {
	d.TB.Helper()
	if s.Front.Addr().Is6() {
		d.addService6(s)
		return
	}
	local := uint32(0)
	for i, b := range s.Backends {
		v := gen.SluiceBeValue{Addr: gen.NetAddr(b.AP.Addr()), Port: gen.NetPort(b.AP.Port())}
		if b.Local {
			v.Flags = gen.SluiceBeFlagsBE_LOCAL
			local++
		}
		d.Put(d.Objs.SlBeV1, gen.SluiceBeKey{SvcId: s.ID, Ordinal: uint32(i)}, v)
	}
	d.Put(d.Objs.SlFeV1, FeKey(s.Front, s.Proto), gen.SluiceFeValue{
		SvcId: s.ID, Count: uint32(len(s.Backends)) - s.ClusterStart, LocalCount: local, ClusterStart: s.ClusterStart,
		AffinityTimeout: s.Affinity, Flags: s.Flags,
	})
}

func (d *Datapath) addService6(s Service) {
	local := uint32(0)
	for i, b := range s.Backends {
		v := gen.SluiceBe6Value{Addr: gen.NetAddr6(b.AP.Addr()), Port: gen.NetPort(b.AP.Port())}
		if b.Local {
			v.Flags = gen.SluiceBeFlagsBE_LOCAL
			local++
		}
		d.Put(d.Objs.SlBe6V1, gen.SluiceBeKey{SvcId: s.ID, Ordinal: uint32(i)}, v)
	}
	d.Put(d.Objs.SlFe6V1, FeKey6(s.Front, s.Proto), gen.SluiceFeValue{
		SvcId: s.ID, Count: uint32(len(s.Backends)) - s.ClusterStart, LocalCount: local, ClusterStart: s.ClusterStart,
		AffinityTimeout: s.Affinity, Flags: s.Flags,
	})
}

// FeKey6 is the IPv6 frontend key of ap and proto.
func FeKey6(ap netip.AddrPort, proto uint8) gen.SluiceFe6Key {
	return gen.SluiceFe6Key{Addr: gen.NetAddr6(ap.Addr()), Port: gen.NetPort(ap.Port()), Proto: proto}
}

// CtKey6 is the IPv6 conntrack key of a packet from src to dst.
func CtKey6(src, dst netip.AddrPort, proto uint8) gen.SluiceCt6Key {
	return gen.SluiceCt6Key{
		Saddr: gen.NetAddr6(src.Addr()), Daddr: gen.NetAddr6(dst.Addr()),
		Sport: gen.NetPort(src.Port()), Dport: gen.NetPort(dst.Port()), Proto: proto,
	}
}

// CT6 returns the IPv6 conntrack entry of k.
func (d *Datapath) CT6(k gen.SluiceCt6Key) (gen.SluiceCt6Value, bool) {
	var v gen.SluiceCt6Value
	err := d.Objs.SlCt6V1.Lookup(k, &v)
	return v, err == nil
}

// FeKey is the frontend key of ap and proto.
func FeKey(ap netip.AddrPort, proto uint8) gen.SluiceFeKey {
	return gen.SluiceFeKey{Addr: gen.NetAddr(ap.Addr()), Port: gen.NetPort(ap.Port()), Proto: proto}
}

// CtKey is the conntrack key of a packet from src to dst.
func CtKey(src, dst netip.AddrPort, proto uint8) gen.SluiceCtKey {
	return gen.SluiceCtKey{
		Saddr: gen.NetAddr(src.Addr()), Daddr: gen.NetAddr(dst.Addr()),
		Sport: gen.NetPort(src.Port()), Dport: gen.NetPort(dst.Port()), Proto: proto,
	}
}

// Run runs prog on frame and returns the verdict and the frame it left.
func (d *Datapath) Run(prog *ebpf.Program, frame []byte) (uint32, []byte) {
	d.TB.Helper()
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256)}
	ret, err := prog.Run(&opts)
	if err != nil {
		d.TB.Fatalf("run %v: %v", prog, err)
	}
	return ret, opts.DataOut
}

// RunOK runs prog, requires TC_ACT_OK and returns the decoded, checksum-verified output.
func (d *Datapath) RunOK(prog *ebpf.Program, frame []byte) *Decoded {
	d.TB.Helper()
	ret, out := d.Run(prog, frame)
	if ret != ActOK {
		d.TB.Fatalf("verdict %d, want TC_ACT_OK", ret)
	}
	dec, err := Decode(out)
	if err != nil {
		d.TB.Fatal(err)
	}
	return dec
}

// Counter sums a per-CPU datapath counter.
func (d *Datapath) Counter(c gen.SluiceCounter) uint64 {
	d.TB.Helper()
	var vs []uint64
	if err := d.Objs.SlCountersV7.Lookup(c, &vs); err != nil {
		d.TB.Fatal(err)
	}
	var sum uint64
	for _, v := range vs {
		sum += v
	}
	return sum
}

// CT returns the conntrack entry of k.
func (d *Datapath) CT(k gen.SluiceCtKey) (gen.SluiceCtValue, bool) {
	var v gen.SluiceCtValue
	err := d.Objs.SlCtV2.Lookup(k, &v)
	return v, err == nil
}

// CT6Count counts IPv6 conntrack entries.
func (d *Datapath) CT6Count() int {
	n := 0
	var k gen.SluiceCt6Key
	var v gen.SluiceCt6Value
	it := d.Objs.SlCt6V1.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n
}

// CTCount counts conntrack entries of both families.
func (d *Datapath) CTCount() int {
	n := 0
	var k gen.SluiceCtKey
	var v gen.SluiceCtValue
	it := d.Objs.SlCtV2.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n + d.CT6Count()
}

// FlowState is what the family-neutral tests read from a conntrack entry.
type FlowState struct {
	SvcID   uint32
	TCPSeen uint32
}

// Flow returns the conntrack entry of a packet from src to dst, from
// whichever family's map the addresses belong to.
func (d *Datapath) Flow(src, dst netip.AddrPort, proto uint8) (FlowState, bool) {
	if src.Addr().Is4() {
		v, ok := d.CT(CtKey(src, dst, proto))
		return FlowState{SvcID: v.SvcId, TCPSeen: v.TcpSeen}, ok
	}
	v, ok := d.CT6(CtKey6(src, dst, proto))
	return FlowState{SvcID: v.SvcId, TCPSeen: v.TcpSeen}, ok
}

// AgeFlow moves the last-seen time of the conntrack entry of a packet from
// src to dst back by age, as if no packet had refreshed it since.
func (d *Datapath) AgeFlow(src, dst netip.AddrPort, proto uint8, age time.Duration) {
	d.TB.Helper()
	if src.Addr().Is4() {
		k := CtKey(src, dst, proto)
		v, ok := d.CT(k)
		if !ok {
			d.TB.Fatalf("no conntrack entry %v -> %v", src, dst)
		}
		v.LastSeen -= uint64(age)
		d.Put(d.Objs.SlCtV2, k, v)
		return
	}
	k := CtKey6(src, dst, proto)
	v, ok := d.CT6(k)
	if !ok {
		d.TB.Fatalf("no conntrack entry %v -> %v", src, dst)
	}
	v.LastSeen -= uint64(age)
	d.Put(d.Objs.SlCt6V1, k, v)
}

// DeleteCT removes the conntrack entry of a packet from src to dst, as the
// conntrack scanner would.
func (d *Datapath) DeleteCT(src, dst netip.AddrPort, proto uint8) {
	d.TB.Helper()
	var err error
	if src.Addr().Is4() {
		err = d.Objs.SlCtV2.Delete(CtKey(src, dst, proto))
	} else {
		err = d.Objs.SlCt6V1.Delete(CtKey6(src, dst, proto))
	}
	if err != nil {
		d.TB.Fatalf("delete conntrack entry %v -> %v: %v", src, dst, err)
	}
}

// AgeAffinity moves the time of client's affinity to service id back by age,
// as the clock would.
func (d *Datapath) AgeAffinity(id uint32, client netip.Addr, age time.Duration) {
	d.TB.Helper()
	if client.Is4() {
		var a gen.SluiceAffValue
		k := gen.SluiceAffKey{SvcId: id, Client: gen.NetAddr(client)}
		if err := d.Objs.SlAffV1.Lookup(k, &a); err != nil {
			d.TB.Fatalf("affinity of %v: %v", client, err)
		}
		a.Ts -= uint64(age)
		d.Put(d.Objs.SlAffV1, k, a)
		return
	}
	var a gen.SluiceAff6Value
	k := gen.SluiceAff6Key{SvcId: id, Client: gen.NetAddr6(client)}
	if err := d.Objs.SlAff6V1.Lookup(k, &a); err != nil {
		d.TB.Fatalf("affinity of %v: %v", client, err)
	}
	a.Ts -= uint64(age)
	d.Put(d.Objs.SlAff6V1, k, a)
}

// SetMaglevTable installs service id's Maglev table (slot -> backend
// ordinal), as the NAT syncer does: a new inner map, then one update of
// sl_maglev_v1. len(table) must be the programs' table size.
func (d *Datapath) SetMaglevTable(id uint32, table []uint32) {
	d.TB.Helper()
	inner, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: uint32(len(table)) * 4, MaxEntries: 1})
	if err != nil {
		d.TB.Fatal(err)
	}
	defer inner.Close()
	if err := inner.Put(uint32(0), table); err != nil {
		d.TB.Fatal(err)
	}
	if err := d.Objs.SlMaglevV1.Put(id, inner); err != nil {
		d.TB.Fatalf("maglev table of service id %d: %v", id, err)
	}
}

// ClearConntrack deletes every conntrack entry of both families, as if every
// flow had ended and been removed.
func (d *Datapath) ClearConntrack() {
	d.TB.Helper()
	ClearMap(d.TB, d.Objs.SlCtV2)
	ClearMap(d.TB, d.Objs.SlCt6V1)
}

// ClearMap deletes every entry of a hash, LRU or LPM map.
func ClearMap(tb testing.TB, m *ebpf.Map) {
	tb.Helper()
	if err := deleteEveryKey(m); err != nil {
		tb.Fatal(err)
	}
}
