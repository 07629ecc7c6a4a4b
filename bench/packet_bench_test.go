package bench

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/nat/maglev"
)

var (
	nodeIP   = netip.MustParseAddr("10.0.0.1")
	clientAP = netip.MustParseAddrPort("10.1.0.5:41234")
)

// family is what the per-packet benchmark needs of an address family.
type family struct {
	suffix   string // "" for IPv4, "-ipv6" for IPv6: the sub-benchmark names'
	node     netip.Addr
	client   netip.AddrPort
	wildcard netip.Addr
	service  func(i int) netip.AddrPort
	backend  func(i int) netip.AddrPort
	addr     func(s string) netip.AddrPort // an IPv4-looking "10.a.b.c:p" in the family
	newFlow  func(dst netip.AddrPort) func(int) []byte
	nodePort func(node netip.Addr, port uint16, i int) []byte
	frags    func(src, dst netip.AddrPort, n int) [][]byte
	bad      func(dst netip.AddrPort) []byte
}

var families = []family{
	{suffix: "", node: nodeIP, client: clientAP, wildcard: netip.MustParseAddr("255.255.255.255"),
		service: serviceAddr, backend: backendAddr, addr: netip.MustParseAddrPort,
		newFlow: newFlowFrames, nodePort: NodePortSYN, frags: Fragments, bad: Malformed},
	{suffix: "-ipv6", node: nodeIP6, client: Client6, wildcard: netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
		service: func(i int) netip.AddrPort { return to6(serviceAddr(i)) }, backend: func(i int) netip.AddrPort { return to6(backendAddr(i)) },
		addr:    func(s string) netip.AddrPort { return to6(netip.MustParseAddrPort(s)) },
		newFlow: newFlowFrames6, nodePort: NodePortSYN6, frags: Fragments6, bad: Malformed6},
}

var nodeIP6 = netip.MustParseAddr("fd00::1")

// to6 puts an IPv4 benchmark address into fd00::/96, keeping its last 32 bits.
func to6(ap netip.AddrPort) netip.AddrPort {
	b := [16]byte{0: 0xfd}
	a4 := ap.Addr().As4()
	copy(b[12:], a4[:])
	return netip.AddrPortFrom(netip.AddrFrom16(b), ap.Port())
}

// serviceAddr is the ClusterIP of the i-th benchmark service.
func serviceAddr(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)}), 80)
}

func backendAddr(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 128 + byte(i>>16), byte(i >> 8), byte(i)}), 8080)
}

// programServices writes n services with one backend each, in batches, in
// the maps of f's family.
func programServices(b *testing.B, d *bpftest.Datapath, f family, n int) {
	if f.suffix != "" {
		programServices6(b, d, f, n)
		return
	}
	feKeys, feVals := make([]gen.SluiceFeKey, n), make([]gen.SluiceFeValue, n)
	beKeys, beVals := make([]gen.SluiceBeKey, n), make([]gen.SluiceBeValue, n)
	for i := range n {
		be := backendAddr(i)
		beKeys[i] = gen.SluiceBeKey{SvcId: uint32(i + 1)}
		beVals[i] = gen.SluiceBeValue{Addr: gen.NetAddr(be.Addr()), Port: gen.NetPort(be.Port())}
		feKeys[i] = bpftest.FeKey(serviceAddr(i), bpftest.ProtoTCP)
		feVals[i] = gen.SluiceFeValue{SvcId: uint32(i + 1), Count: 1}
	}
	if _, err := d.Objs.SlBeV1.BatchUpdate(beKeys, beVals, nil); err != nil {
		b.Fatal(err)
	}
	if _, err := d.Objs.SlFeV1.BatchUpdate(feKeys, feVals, nil); err != nil {
		b.Fatal(err)
	}
}

func programServices6(b *testing.B, d *bpftest.Datapath, f family, n int) {
	feKeys, feVals := make([]gen.SluiceFe6Key, n), make([]gen.SluiceFeValue, n)
	beKeys, beVals := make([]gen.SluiceBeKey, n), make([]gen.SluiceBe6Value, n)
	for i := range n {
		be := f.backend(i)
		beKeys[i] = gen.SluiceBeKey{SvcId: uint32(i + 1)}
		beVals[i] = gen.SluiceBe6Value{Addr: gen.NetAddr6(be.Addr()), Port: gen.NetPort(be.Port())}
		feKeys[i] = bpftest.FeKey6(f.service(i), bpftest.ProtoTCP)
		feVals[i] = gen.SluiceFeValue{SvcId: uint32(i + 1), Count: 1}
	}
	if _, err := d.Objs.SlBe6V1.BatchUpdate(beKeys, beVals, nil); err != nil {
		b.Fatal(err)
	}
	if _, err := d.Objs.SlFe6V1.BatchUpdate(feKeys, feVals, nil); err != nil {
		b.Fatal(err)
	}
}

// pairChunk is how many packets of a path run between two runs of as many
// floor packets (pairedFloor).
const pairChunk = 1_000

// pairedFloor is the floor program and its packet, loaded once per process,
// that every path runs in alternation with, so that its x-floor is the ratio
// of two sums taken over the same seconds. A ratio to a floor measured once,
// at the start, moved with this machine's speed in between: the floor ran
// 128-169 ns a packet in runs minutes apart, and a single run's ratio by as
// much.
var pairedFloor struct {
	once  sync.Once
	objs  FloorObjects
	frame []byte
	err   error
}

// floorProgram loads pairedFloor on first use; the process keeps it.
func floorProgram(b *testing.B) (*ebpf.Program, []byte) {
	b.Helper()
	pairedFloor.once.Do(func() {
		if pairedFloor.err = LoadFloorObjects(&pairedFloor.objs, nil); pairedFloor.err != nil {
			return
		}
		pairedFloor.frame = bpftest.TCPPacket(clientAP, serviceAddr(0), bpftest.ACK)
		key := bpftest.CtKey(clientAP, serviceAddr(0), bpftest.ProtoTCP)
		pairedFloor.err = pairedFloor.objs.FloorFlows.Put(key, uint64(1))
	})
	if pairedFloor.err != nil {
		b.Fatalf("paired floor: %v", pairedFloor.err)
	}
	return pairedFloor.objs.FloorParseLookup, pairedFloor.frame
}

// runFloor makes n calls of the floor, of repeat runs each (1 as measureNew
// calls, hotRepeat as measureHot does), and sums the kernel's timing of a
// run over them.
func runFloor(b *testing.B, n int, repeat int) time.Duration {
	b.Helper()
	prog, frame := floorProgram(b)
	var total time.Duration
	for range n {
		ret, dur, err := prog.Benchmark(frame, repeat, nil)
		if err != nil {
			b.Fatal(err)
		}
		if ret != bpftest.ActOK {
			b.Fatalf("floor: verdict %d", ret)
		}
		total += dur
	}
	return total
}

// measure runs prog once per packet and sums the kernel's own timing of each
// run. One run per BPF_PROG_TEST_RUN call matters: with repeat > 1 the kernel
// re-runs the program on the packet it already rewrote, which would measure
// another path.
func measure(b *testing.B, prog *ebpf.Program, want uint32, frame func(i int) []byte) float64 {
	b.Helper()
	return measureNew(b, nil, prog, want, frame)
}

// newFlowsPerClear is how many new flows a benchmark creates before it
// empties conntrack: the map refuses new flows when full (it never evicts),
// and a second of new flows is more than it holds.
const newFlowsPerClear = 100_000

// measureNew is measure for paths that create flows: clear empties their
// conntrack every newFlowsPerClear packets, outside the timed runs. Every
// pairChunk packets the floor runs as many (pairedFloor): x-floor is the
// ratio of the two sums.
func measureNew(b *testing.B, clear func(), prog *ebpf.Program, want uint32, frame func(i int) []byte) float64 {
	b.Helper()
	var total, floor time.Duration
	i := 0
	for b.Loop() {
		if clear != nil && i > 0 && i%newFlowsPerClear == 0 {
			clear()
		}
		ret, dur, err := prog.Benchmark(frame(i), 1, nil)
		if err != nil {
			b.Fatal(err)
		}
		if ret != want {
			b.Fatalf("packet %d: verdict %d, want %d", i, ret, want)
		}
		total += dur
		i++
		if i%pairChunk == 0 {
			floor += runFloor(b, pairChunk, 1)
		}
	}
	floor += runFloor(b, i%pairChunk, 1)
	ns := float64(total.Nanoseconds()) / float64(i)
	b.ReportMetric(ns, "ns/packet")
	if floor > 0 {
		b.ReportMetric(float64(total)/float64(floor), "x-floor")
	}
	return ns
}

// newFlowFrames returns distinct SYNs to dst: the source address and port
// change with i, so every packet misses conntrack. Checksums are not fixed up
// (no program verifies them).
func newFlowFrames(dst netip.AddrPort) func(int) []byte {
	tmpl := bpftest.TCPPacket(clientAP, dst, bpftest.SYN)
	return func(i int) []byte {
		f := tmpl // the kernel copies the data in: reusing the buffer is safe
		f[14+13], f[14+14], f[14+15] = byte(i>>16), byte(i>>8), byte(i)
		port := 1024 + i%60000
		f[34], f[35] = byte(port>>8), byte(port)
		return f
	}
}

// newFlowFrames6 is newFlowFrames over IPv6.
func newFlowFrames6(dst netip.AddrPort) func(int) []byte {
	tmpl := bpftest.TCPPacket(Client6, dst, bpftest.SYN)
	return func(i int) []byte {
		f := tmpl
		f[14+8+13], f[14+8+14], f[14+8+15] = byte(i>>16), byte(i>>8), byte(i)
		port := 1024 + i%60000
		f[14+40], f[14+41] = byte(port>>8), byte(port)
		return f
	}
}

func fixed(frame []byte) func(int) []byte { return func(int) []byte { return frame } }

// benchFloor measures the floor program (parse and one hash lookup): its
// ns/packet is the floor's own; its x-floor, against itself, shows how
// closely two alternating sums agree on this machine.
func benchFloor(b *testing.B) {
	bpftest.Require(b)
	var objs FloorObjects
	if err := LoadFloorObjects(&objs, nil); err != nil {
		b.Fatal(err)
	}
	defer objs.Close()
	frame := bpftest.TCPPacket(clientAP, serviceAddr(0), bpftest.ACK)
	key := bpftest.CtKey(clientAP, serviceAddr(0), bpftest.ProtoTCP)
	if err := objs.FloorFlows.Put(key, uint64(1)); err != nil {
		b.Fatal(err)
	}
	measure(b, objs.FloorParseLookup, bpftest.ActOK, fixed(frame))
}

func BenchmarkPacket(b *testing.B) {
	b.Run("floor", benchFloor)
	b.Run("floor-ipv6", func(b *testing.B) {
		bpftest.Require(b)
		var objs FloorObjects
		if err := LoadFloorObjects(&objs, nil); err != nil {
			b.Fatal(err)
		}
		defer objs.Close()
		vip := to6(serviceAddr(0))
		k := bpftest.CtKey6(Client6, vip, bpftest.ProtoTCP)
		if err := objs.FloorFlows6.Put(k, uint64(1)); err != nil {
			b.Fatal(err)
		}
		measure(b, objs.FloorParseLookup6, bpftest.ActOK, fixed(bpftest.TCPPacket(Client6, vip, bpftest.ACK)))
	})
	for _, services := range []int{10, 1_000, 100_000} {
		b.Run(fmt.Sprintf("services=%d", services), func(b *testing.B) {
			for _, f := range families {
				benchmarkPaths(b, f, services)
			}
		})
	}
}

// benchmarkPaths measures every path of one family with services Services
// programmed; the sub-benchmarks are named with the family's suffix.
func benchmarkPaths(b *testing.B, f family, services int) {
	d := bpftest.NewDatapath(b, nodeIP)
	d.SetNodeIP6(nodeIP6)
	programServices(b, d, f, services)
	vip := f.service(services / 2)
	be := f.backend(services / 2)
	// One established flow for the established and reply paths.
	d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(f.client, vip, bpftest.SYN))
	run := func(name string, fn func(b *testing.B)) { b.Run(name+f.suffix, fn) }

	run("established", func(b *testing.B) {
		measure(b, d.Objs.SlFromWl, bpftest.ActOK, fixed(bpftest.TCPPacket(f.client, vip, bpftest.ACK)))
	})
	run("reply", func(b *testing.B) {
		measure(b, d.Objs.SlFromWl, bpftest.ActOK, fixed(bpftest.TCPPacket(be, f.client, bpftest.ACK)))
	})
	run("new-flow", func(b *testing.B) {
		measureNew(b, d.ClearConntrack, d.Objs.SlFromWl, bpftest.ActOK, f.newFlow(vip))
	})
	run("new-flow-affinity", func(b *testing.B) {
		// Same client address, new ports: the affinity entry decides.
		sticky := f.addr("10.127.0.1:80")
		d.AddService(bpftest.Service{ID: 900_001, Front: sticky, Proto: bpftest.ProtoTCP, Affinity: 600,
			Backends: []bpftest.Backend{{AP: f.backend(1)}, {AP: f.backend(2)}}})
		measureNew(b, d.ClearConntrack, d.Objs.SlFromWl, bpftest.ActOK, func(i int) []byte {
			return bpftest.TCPPacket(netip.AddrPortFrom(f.client.Addr(), uint16(1024+i%60000)), sticky, bpftest.SYN)
		})
	})
	run("nodeport-new-flow", func(b *testing.B) {
		d.AddService(bpftest.Service{ID: 900_002, Front: netip.AddrPortFrom(f.wildcard, 30080), Proto: bpftest.ProtoTCP,
			Backends: []bpftest.Backend{{AP: be, Local: true}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
		measureNew(b, d.ClearConntrack, d.Objs.SlFromHost, bpftest.ActOK, func(i int) []byte { return f.nodePort(f.node, 30080, i) })
	})
	run("nodeport-new-flow-maglev", func(b *testing.B) {
		// The same NodePort picking by its Maglev table (one backend: only
		// the pick's cost differs from nodeport-new-flow).
		d.AddService(bpftest.Service{ID: 900_004, Front: netip.AddrPortFrom(f.wildcard, 30081), Proto: bpftest.ProtoTCP,
			Backends: []bpftest.Backend{{AP: be, Local: true}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL | gen.SluiceFeFlagsFE_MAGLEV})
		table, err := maglev.Build([]maglev.Backend{{Name: be.String()}}, gen.MaglevDefaultTableSize)
		if err != nil {
			b.Fatal(err)
		}
		d.SetMaglevTable(900_004, table)
		// nodeport-new-flow's flows hold this client's ports at the backend.
		d.ClearConntrack()
		measureNew(b, d.ClearConntrack, d.Objs.SlFromHost, bpftest.ActOK, func(i int) []byte { return f.nodePort(f.node, 30081, i) })
	})
	// Untranslated (pod to pod) traffic is tracked too, for the clash
	// check: its established packets against the untracked path they took
	// before (an ACK with no entry passes untouched), and the cost of
	// starting a tracked direct flow.
	peer := f.addr("10.1.9.9:8080")
	d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(f.client, peer, bpftest.SYN))
	run("direct-established", func(b *testing.B) {
		measure(b, d.Objs.SlFromWl, bpftest.ActOK, fixed(bpftest.TCPPacket(f.client, peer, bpftest.ACK)))
	})
	run("direct-untracked", func(b *testing.B) {
		measure(b, d.Objs.SlFromWl, bpftest.ActOK, fixed(bpftest.TCPPacket(f.client, f.addr("10.1.9.10:8080"), bpftest.ACK)))
	})
	run("direct-new-flow", func(b *testing.B) {
		measureNew(b, d.ClearConntrack, d.Objs.SlFromWl, bpftest.ActOK, f.newFlow(peer))
	})
	run("fragment", func(b *testing.B) {
		// A later fragment of a datagram whose first fragment set up its
		// flow through a UDP Service.
		dns := f.addr("10.127.0.2:53")
		d.AddService(bpftest.Service{ID: 900_003, Front: dns, Proto: bpftest.ProtoUDP,
			Backends: []bpftest.Backend{{AP: f.backend(3)}}})
		frags := f.frags(f.client, dns, 3000)
		d.RunOK(d.Objs.SlFromWl, frags[0])
		measure(b, d.Objs.SlFromWl, bpftest.ActOK, fixed(frags[1]))
	})
	run("malformed", func(b *testing.B) {
		measure(b, d.Objs.SlFromWl, bpftest.ActShot, fixed(f.bad(vip)))
	})
}

// hotRepeat runs of one BPF_PROG_TEST_RUN call make a hot loop: the program
// and its map entries stay in cache, as under real traffic, and the kernel's
// own per-call overhead is spread over them.
const hotRepeat = 100_000

// measureHot runs prog hotRepeat times per iteration on frame; the kernel
// reruns it on the packet the previous run left, so frame must take the
// same path every time. Each iteration runs the floor as many times
// (pairedFloor): x-floor is the ratio of the two sums.
func measureHot(b *testing.B, prog *ebpf.Program, frame []byte) float64 {
	b.Helper()
	var total, floor time.Duration
	n := 0
	for b.Loop() {
		ret, dur, err := prog.Benchmark(frame, hotRepeat, nil)
		if err != nil {
			b.Fatal(err)
		}
		if ret != bpftest.ActOK {
			b.Fatalf("verdict %d", ret)
		}
		total += dur // per run, averaged by the kernel
		n++
		floor += runFloor(b, 1, hotRepeat)
	}
	ns := float64(total.Nanoseconds()) / float64(n)
	b.ReportMetric(ns, "ns/packet")
	b.ReportMetric(float64(total)/float64(floor), "x-floor")
	return ns
}

// BenchmarkPacketHot measures the established paths in a hot loop. A
// translated packet is rewritten by each run, so two forward entries that
// translate into each other (ClusterIP -> backend, backend -> ClusterIP)
// make every run an established, translated packet; a direct (untranslated)
// flow's packet is left as it is.
func BenchmarkPacketHot(b *testing.B) {
	b.Run("floor", func(b *testing.B) {
		bpftest.Require(b)
		var objs FloorObjects
		if err := LoadFloorObjects(&objs, nil); err != nil {
			b.Fatal(err)
		}
		defer objs.Close()
		vip := serviceAddr(0)
		if err := objs.FloorFlows.Put(bpftest.CtKey(clientAP, vip, bpftest.ProtoTCP), uint64(1)); err != nil {
			b.Fatal(err)
		}
		measureHot(b, objs.FloorParseLookup, bpftest.TCPPacket(clientAP, vip, bpftest.ACK))
	})
	d := bpftest.NewDatapath(b, nodeIP)
	vip, be := serviceAddr(0), backendAddr(0)
	for _, p := range [][2]netip.AddrPort{{vip, be}, {be, vip}} {
		d.Put(d.Objs.SlCtV2, bpftest.CtKey(clientAP, p[0], bpftest.ProtoTCP), gen.SluiceCtValue{
			Created: 1, LastSeen: 1 << 62, Peer: bpftest.CtKey(p[1], clientAP, bpftest.ProtoTCP),
			NatAddr: gen.NetAddr(p[1].Addr()), NatPort: gen.NetPort(p[1].Port()), SvcId: 1, TcpSeen: 0x12,
			Type: gen.SluiceCtTypeCT_FORWARD, PolEgress: gen.SluicePolVerdictPOL_ALLOWED, PolIngress: gen.SluicePolVerdictPOL_ALLOWED})
	}
	b.Run("established", func(b *testing.B) {
		measureHot(b, d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vip, bpftest.ACK))
	})
	peer := netip.MustParseAddrPort("10.1.9.9:8080")
	d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, peer, bpftest.SYN))
	b.Run("direct-established", func(b *testing.B) {
		measureHot(b, d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, peer, bpftest.ACK))
	})
	b.Run("direct-untracked", func(b *testing.B) {
		measureHot(b, d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, netip.MustParseAddrPort("10.1.9.10:8080"), bpftest.ACK))
	})
}

// BenchmarkNewFlowFloor is the new-flow floor series: the floor, then the
// floor with one conntrack-sized map write, a pair of them, and the pair with
// the clock read each entry carries, beside Sluice's own new-flow paths in the
// same run. What the datapath adds to a new flow is its cost over the
// write-pair-clock step; what the kernel's map writes cost is each step's over
// the one before. The table-* steps make the same writes into an
// open-addressing table in an array map (bpf/tablefloor.c), the floor another
// conntrack structure would have.
func BenchmarkNewFlowFloor(b *testing.B) {
	b.Run("floor", benchFloor)
	var objs FloorObjects
	if err := LoadFloorObjects(&objs, nil); err != nil {
		b.Fatal(err)
	}
	defer objs.Close()
	clear := func() { bpftest.ClearMap(b, objs.FloorCt) }
	vip := serviceAddr(5)
	for _, step := range []struct {
		name string
		prog *ebpf.Program
	}{
		{"write-one", objs.FloorWriteOne},
		{"write-pair", objs.FloorWritePair},
		{"write-pair-clock", objs.FloorWritePairClock},
	} {
		b.Run(step.name, func(b *testing.B) {
			clear()
			measureNew(b, clear, step.prog, bpftest.ActOK, newFlowFrames(vip))
		})
	}
	// The same writes into an open-addressing table in an array map
	// (bpf/tablefloor.c): the floor of another conntrack structure.
	var table TableFloorObjects
	if err := LoadTableFloorObjects(&table, nil); err != nil {
		b.Fatal(err)
	}
	defer table.Close()
	emptyTable := tableEmptier(b, table.TableFloorSlots)
	for _, step := range []struct {
		name    string
		prog    *ebpf.Program
		perFlow int
	}{
		{"table-write-one", table.TableFloorWriteOne, 1},
		{"table-write-pair-clock", table.TableFloorWritePair, 2},
	} {
		b.Run(step.name, func(b *testing.B) {
			emptyTable()
			measureNew(b, emptyTable, step.prog, bpftest.ActOK, newFlowFrames(vip))
			// Every flow since the table was last emptied is in it.
			if got, want := liveSlots(b, table.TableFloorSlots), ((b.N-1)%newFlowsPerClear+1)*step.perFlow; got != want {
				b.Fatalf("the table holds %d entries after %d flows, want %d", got, b.N, want)
			}
		})
	}
	d := bpftest.NewDatapath(b, nodeIP)
	programServices(b, d, families[0], 10)
	b.Run("sluice-direct-new-flow", func(b *testing.B) {
		d.ClearConntrack()
		measureNew(b, d.ClearConntrack, d.Objs.SlFromWl, bpftest.ActOK, newFlowFrames(netip.MustParseAddrPort("10.1.9.9:8080")))
	})
	b.Run("sluice-new-flow", func(b *testing.B) {
		d.ClearConntrack()
		measureNew(b, d.ClearConntrack, d.Objs.SlFromWl, bpftest.ActOK, newFlowFrames(vip))
	})
}

// The table floor's layout (bpf/tablefloor.c): struct table_slot's size,
// and TABLE_LIVE, the state (a slot's first 32-bit word) of a written slot.
const (
	tableSlotSize = 64
	tableLive     = 2
)

// tableEmptier returns a func that empties the table floor's slots through
// its memory mapping, without a syscall per entry as a hash's deletes take.
func tableEmptier(b *testing.B, slots *ebpf.Map) func() {
	mem, err := slots.Memory()
	if err != nil {
		b.Fatal(err)
	}
	zeros := make([]byte, 1<<20)
	return func() {
		for off := int64(0); off < int64(mem.Size()); off += int64(len(zeros)) {
			if _, err := mem.WriteAt(zeros, off); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// liveSlots counts the table floor's slots in state TABLE_LIVE.
func liveSlots(b *testing.B, slots *ebpf.Map) int {
	mem, err := slots.Memory()
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, mem.Size())
	if _, err := mem.ReadAt(buf, 0); err != nil {
		b.Fatal(err)
	}
	live := 0
	for off := 0; off+tableSlotSize <= len(buf); off += tableSlotSize {
		if binary.LittleEndian.Uint32(buf[off:]) == tableLive {
			live++
		}
	}
	return live
}
