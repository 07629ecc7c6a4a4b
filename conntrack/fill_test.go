package conntrack_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

func TestNearlyFullMapWarnsAndReportsByType(t *testing.T) {
	bpftest.Require(t)
	raw := conntrackOfSize(t, 20)
	ct, err := maps.NewMap[gen.SluiceCtKey, gen.SluiceCtValue](raw)
	if err != nil {
		t.Fatal(err)
	}
	now := conntrack.Monotonic()
	for i := range 19 {
		k := gen.SluiceCtKey{Saddr: uint32(i + 1), Proto: 17}
		v := gen.SluiceCtValue{Created: uint64(now), LastSeen: uint64(now), Type: gen.SluiceCtTypeCT_REVERSE}
		if i%2 == 0 {
			v.Type, k.Proto = gen.SluiceCtTypeCT_FORWARD, 6
		}
		if err := ct.Put(k, v, 0); err != nil {
			t.Fatal(err)
		}
	}
	var logs bytes.Buffer
	var seen conntrack.ScanStats
	sc, err := conntrack.NewScanner(conntrack.Options{Conntrack: ct,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), OnScan: func(s conntrack.ScanStats) { seen = s }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Scan(); err != nil {
		t.Fatal(err)
	}
	if seen.Entries != 19 || seen.Forward != 10 || seen.Reverse != 9 || seen.TCP != 10 || seen.UDP != 9 || seen.Capacity != 20 {
		t.Fatalf("stats %+v", seen)
	}
	out := logs.String()
	if !strings.Contains(out, "nearly full") || !strings.Contains(out, "map="+maps.Conntrack.Name) || !strings.Contains(out, "capacity=20") {
		t.Fatalf("no warning naming the map and its size: %q", out)
	}
}

// A flood of new UDP flows fills the conntrack map. The datapath refuses new
// flows and keeps the established ones; once the scanner sees the map under
// pressure, it drops the flows that were never answered (the flood's) and
// keeps the established connection and the answered UDP flow, so that the
// next legitimate flow gets in without waiting for the flood to expire.
func TestUnansweredFlowsDroppedFirstUnderPressure(t *testing.T) {
	bpftest.Require(t)
	raw := conntrackOfSize(t, 64)
	dp := bpftest.NewDatapathWithMaps(t, nodeIP, map[string]*ebpf.Map{maps.Conntrack.Name: raw})
	dp.AddService(bpftest.Service{ID: 1, Front: vipAP, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: be1AP}}})
	dp.AddService(bpftest.Service{ID: 2, Front: dnsAP, Proto: bpftest.ProtoUDP, Backends: []bpftest.Backend{{AP: udpBE}}})
	ct, err := maps.NewMap[gen.SluiceCtKey, gen.SluiceCtValue](raw)
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64
	sc, err := conntrack.NewScanner(conntrack.Options{Conntrack: ct,
		Clock: func() time.Duration { return conntrack.Monotonic() + time.Duration(clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}

	// An established connection and an answered DNS query.
	dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.SYN))
	dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(be1AP, clientAP, bpftest.SYN|bpftest.ACK))
	resolver := netip.MustParseAddrPort("10.1.0.6:5000")
	dp.RunOK(dp.Objs.SlFromWl, bpftest.UDPPacket(resolver, dnsAP, []byte("q")))
	dp.RunOK(dp.Objs.SlFromWl, bpftest.UDPPacket(udpBE, resolver, []byte("a")))
	// The flood: one datagram from each of many ports, never answered.
	flood := func(n int) (refused int) {
		for port := range uint16(n) {
			src := netip.AddrPortFrom(netip.MustParseAddr("10.1.7.7"), 20000+port)
			if ret, _ := dp.Run(dp.Objs.SlFromWl, bpftest.UDPPacket(src, dnsAP, []byte("f"))); ret == 2 /* TC_ACT_SHOT */ {
				refused++
			}
		}
		return refused
	}
	if refused := flood(100); refused == 0 {
		t.Fatal("the flood did not fill the map")
	}
	newcomer := netip.MustParseAddrPort("10.1.0.8:5000")
	if ret, _ := dp.Run(dp.Objs.SlFromWl, bpftest.UDPPacket(newcomer, dnsAP, []byte("q"))); ret != 2 {
		t.Fatal("a new flow was let in while the map was full")
	}

	// The first scan finds the map full; the next one, a second later,
	// drops what was never answered.
	clock.Add(int64(2 * time.Second))
	first, err := sc.Scan()
	if err != nil {
		t.Fatal(err)
	}
	if first.FillRatio < 0.9 || first.DeletedTotal() != 0 {
		t.Fatalf("first scan %+v: want a full map and nothing deleted (every flow is within its creation grace)", first)
	}
	if next := sc.NextInterval(10*time.Second, first); next != time.Second {
		t.Fatalf("next scan after %v under pressure, want the minimum interval", next)
	}
	second, err := sc.Scan()
	if err != nil {
		t.Fatal(err)
	}
	if second.Deleted[conntrack.ReasonEarlyDrop] != first.Entries/2-2 {
		t.Fatalf("early-dropped %d flows, want the flood's %d", second.Deleted[conntrack.ReasonEarlyDrop], first.Entries/2-2)
	}
	// The eviction left the map nearly empty: the next scan comes by the
	// deletion ratio's rule (more than a quarter deleted: halve), not a
	// second later; the kernel's count brings one sooner if it fills again.
	if next := sc.NextInterval(10*time.Second, second); next != 5*time.Second {
		t.Fatalf("next scan after %v once the eviction left %.0f%% of the map, want 5s", next, 100*second.LeftRatio)
	}
	for _, f := range []struct {
		name     string
		src, dst netip.AddrPort
		proto    uint8
	}{{"the established connection", clientAP, vipAP, 6}, {"the answered query", resolver, dnsAP, 17}} {
		if _, ok := dp.CT(bpftest.CtKey(f.src, f.dst, f.proto)); !ok {
			t.Fatalf("%s was dropped under pressure", f.name)
		}
	}
	out := dp.RunOK(dp.Objs.SlFromWl, bpftest.UDPPacket(newcomer, dnsAP, []byte("q")))
	if out.Dst != udpBE {
		t.Fatalf("the next legitimate flow went to %v, want %v", out.Dst, udpBE)
	}
}

// smallConntrack is a datapath whose conntrack map holds only entries
// entries, and a scanner of it whose clock runs ahead by what the test adds
// to the returned offset.
func smallConntrack(t *testing.T, entries uint32) (*bpftest.Datapath, *conntrack.Scanner, *atomic.Int64) {
	t.Helper()
	raw := conntrackOfSize(t, entries)
	dp := bpftest.NewDatapathWithMaps(t, nodeIP, map[string]*ebpf.Map{maps.Conntrack.Name: raw})
	_, sc, clock := scannerAhead(t, raw, conntrack.Options{})
	return dp, sc, clock
}

// scannerAhead is a scanner of raw with opts, whose clock runs ahead of the
// datapath's by what the test adds to the returned offset, and the typed map
// it scans.
func scannerAhead(t *testing.T, raw *ebpf.Map, opts conntrack.Options) (*maps.Map[gen.SluiceCtKey, gen.SluiceCtValue], *conntrack.Scanner, *atomic.Int64) {
	t.Helper()
	ct, err := maps.NewMap[gen.SluiceCtKey, gen.SluiceCtValue](raw)
	if err != nil {
		t.Fatal(err)
	}
	clock := new(atomic.Int64)
	opts.Conntrack = ct
	opts.Clock = func() time.Duration { return conntrack.Monotonic() + time.Duration(clock.Load()) }
	sc, err := conntrack.NewScanner(opts)
	if err != nil {
		t.Fatal(err)
	}
	return ct, sc, clock
}

// runScanner runs sc until the test ends.
func runScanner(t *testing.T, sc *conntrack.Scanner) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sc.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// walkCounts reads ct's entry count as maps.Filler would, for a map outside
// a maps.Set: the entries a walk of it finds.
func walkCounts(ct *maps.Map[gen.SluiceCtKey, gen.SluiceCtValue]) func() (map[string]int64, error) {
	return func() (map[string]int64, error) {
		n := int64(0)
		err := ct.Iterate(func(gen.SluiceCtKey, gen.SluiceCtValue) bool { n++; return true })
		return map[string]int64{maps.Conntrack.Name: n}, err
	}
}

// A client opening connections faster than closed flows expire (they are
// held 30 s after their FINs, 2 min when the server closed first) fills the
// map with flows that are over. Under
// pressure the scanner drops those, as netfilter's early_drop does, and
// keeps the live connection, so the next connection gets in instead of
// every new flow being refused until the closed ones expire.
func TestEndedFlowsDroppedUnderPressure(t *testing.T) {
	bpftest.Require(t)
	dp, sc, clock := smallConntrack(t, 64)
	dp.AddService(bpftest.Service{ID: 1, Front: vipAP, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: be1AP}}})

	handshake := func(client netip.AddrPort) uint32 {
		if ret, _ := dp.Run(dp.Objs.SlFromWl, bpftest.TCPPacket(client, vipAP, bpftest.SYN)); ret == 2 /* TC_ACT_SHOT */ {
			return ret
		}
		dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(be1AP, client, bpftest.SYN|bpftest.ACK))
		dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(client, vipAP, bpftest.ACK))
		return 0
	}
	live := netip.AddrPortFrom(clientAP.Addr(), 1000)
	if handshake(live) != 0 {
		t.Fatal("the live connection was refused")
	}
	// Connections opened and closed, by the client first and by the server
	// first in turn, until the map refuses one.
	closed := 0
	var serverFirst []netip.AddrPort
	for port := uint16(2000); ; port++ {
		client := netip.AddrPortFrom(clientAP.Addr(), port)
		if handshake(client) != 0 {
			break
		}
		clientFIN := bpftest.TCPPacket(client, vipAP, bpftest.FIN|bpftest.ACK)
		serverFIN := bpftest.TCPPacket(be1AP, client, bpftest.FIN|bpftest.ACK)
		if port%2 == 0 {
			dp.RunOK(dp.Objs.SlFromWl, clientFIN)
			dp.RunOK(dp.Objs.SlFromWl, serverFIN)
			dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(client, vipAP, bpftest.ACK))
		} else {
			dp.RunOK(dp.Objs.SlFromWl, serverFIN)
			dp.RunOK(dp.Objs.SlFromWl, clientFIN)
			dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(be1AP, client, bpftest.ACK))
			serverFirst = append(serverFirst, client)
		}
		closed++
	}
	if closed < 2 || closed > 31 {
		t.Fatalf("%d connections closed before the map refused one: want both orders, at most 31 beside the live one", closed)
	}

	// The first scan finds the map full but the flows within their
	// creation grace; the next, past the grace a closed flow gets, drops
	// them and keeps the live connection. Of the flows whose server closed
	// first it drops only the forward entry: the reverse entry guards the
	// server's TIME_WAIT, and the map is under the low-water mark without
	// dropping it.
	clock.Add(int64(2 * time.Second))
	if first, err := sc.Scan(); err != nil || first.FillRatio < 0.9 || first.DeletedTotal() != 0 {
		t.Fatalf("first scan %+v, %v: want a full map and nothing deleted", first, err)
	}
	second, err := sc.Scan()
	if err != nil {
		t.Fatal(err)
	}
	clientFirst := closed - len(serverFirst)
	if got, guards := second.Deleted[conntrack.ReasonEarlyDrop], second.Deleted[conntrack.ReasonGuardOnly]; got != clientFirst || guards != len(serverFirst) {
		t.Fatalf("early-dropped %d flows and cut %d to their guard, want the %d the client closed first and the %d the server did (deleted %v)",
			got, guards, clientFirst, len(serverFirst), second.Deleted)
	}
	for _, c := range serverFirst {
		if _, ok := dp.CT(bpftest.CtKey(c, vipAP, bpftest.ProtoTCP)); ok {
			t.Fatalf("%v: the forward entry of a flow the server closed first was kept under pressure", c)
		}
		if _, ok := dp.CT(bpftest.CtKey(be1AP, c, bpftest.ProtoTCP)); !ok {
			t.Fatalf("%v: the guard of the server's TIME_WAIT was dropped with the map under the low-water mark", c)
		}
	}
	if _, ok := dp.CT(bpftest.CtKey(live, vipAP, bpftest.ProtoTCP)); !ok {
		t.Fatal("the live connection was dropped under pressure")
	}
	if handshake(netip.AddrPortFrom(clientAP.Addr(), 3000)) != 0 {
		t.Fatal("the next connection was refused after the scan")
	}
	// The eviction left the live connection's 2 entries and the guards;
	// the next scan sees the new connection's 2 as growth (what a scan
	// leaves counts entries, both of each deleted flow, not flows).
	clock.Add(int64(time.Second))
	third, err := sc.Scan()
	if err != nil {
		t.Fatal(err)
	}
	if want := 4 + len(serverFirst); third.Entries != want || third.TimeToPressure == 0 {
		t.Fatalf("third scan %+v: want %d entries and the growth of 2 since the eviction", third, want)
	}
}

// Under pressure, a flow whose server closed first keeps its reverse entry
// alone, which goes on guarding the server's TIME_WAIT: the client reopening
// its tuple takes it back, another flow that would land on the tuple (the
// same client port to another Service on that backend) is remapped rather
// than meet PAWS there. The guards are dropped only while the map stays
// past the low-water mark, 10 points under PressureFill, oldest first.
func TestGuardsOfServerTimeWaitDroppedOldestFirst(t *testing.T) {
	bpftest.Require(t)
	raw := conntrackOfSize(t, 64)
	dp := bpftest.NewDatapathWithMaps(t, nodeIP, map[string]*ebpf.Map{maps.Conntrack.Name: raw})
	dp.AddService(bpftest.Service{ID: 1, Front: vipAP, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: be1AP}}})
	vip2 := netip.MustParseAddrPort("10.96.0.99:80")
	dp.AddService(bpftest.Service{ID: 2, Front: vip2, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: be1AP}}})
	_, sc, clock := scannerAhead(t, raw, conntrack.Options{PressureFill: 0.5})
	// Flows closed by the server first, one every 10 ms (the datapath's
	// clock is the coarse one), until the map refuses one.
	var flows []netip.AddrPort
	for port := uint16(2000); ; port++ {
		c := netip.AddrPortFrom(clientAP.Addr(), port)
		if ret, _ := dp.Run(dp.Objs.SlFromWl, bpftest.TCPPacket(c, vipAP, bpftest.SYN)); ret == 2 /* TC_ACT_SHOT */ {
			break
		}
		dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(be1AP, c, bpftest.SYN|bpftest.ACK))
		dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(c, vipAP, bpftest.ACK))
		dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(be1AP, c, bpftest.FIN|bpftest.ACK))
		dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(c, vipAP, bpftest.FIN|bpftest.ACK))
		dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(be1AP, c, bpftest.ACK))
		flows = append(flows, c)
		time.Sleep(10 * time.Millisecond)
	}
	if len(flows) != 32 {
		t.Fatalf("%d flows before the map refused one, want 32", len(flows))
	}
	guarded := func(c netip.AddrPort) bool {
		_, ok := dp.CT(bpftest.CtKey(be1AP, c, bpftest.ProtoTCP))
		return ok
	}
	clock.Add(int64(2 * time.Second))
	scan := func() conntrack.ScanStats {
		st, err := sc.Scan()
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	scan() // finds the map full: the next one is under pressure
	// Every flow is cut to its guard: 32 of 64 entries, past the mark of
	// 40% (25). The 7 oldest guards go.
	if st := scan(); st.Deleted[conntrack.ReasonGuardOnly] != 32 || st.Deleted[conntrack.ReasonEarlyDrop] != 7 {
		t.Fatalf("the first scan under pressure deleted %v, want every flow cut to its guard and the 7 oldest guards dropped", st.Deleted)
	}
	for i, c := range flows {
		if _, ok := dp.CT(bpftest.CtKey(c, vipAP, bpftest.ProtoTCP)); ok {
			t.Fatalf("flow %d (%v): forward entry kept", i, c)
		}
		if guarded(c) != (i >= 7) {
			t.Fatalf("flow %d (%v): guard kept %v, want the 7 oldest dropped", i, c, guarded(c))
		}
	}

	// A guard keeps the tuple: another Service's flow from the client's
	// port to the same backend would be the same connection there. It is
	// remapped to another port, and the client reopening its own tuple
	// takes its guard back and keeps its port.
	out := dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(flows[31], vip2, bpftest.SYN))
	if out.Src == flows[31] {
		t.Fatalf("a flow to another Service took the tuple %v the guard holds", flows[31])
	}
	dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(be1AP, out.Src, bpftest.SYN|bpftest.ACK))
	out = dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(flows[30], vipAP, bpftest.SYN))
	if out.Src != flows[30] || out.Dst != be1AP {
		t.Fatalf("the client reopening its tuple left as %v to %v, want its own port to %v", out.Src, out.Dst, be1AP)
	}
	dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(be1AP, flows[30], bpftest.SYN|bpftest.ACK))
	if e, ok := dp.CT(bpftest.CtKey(be1AP, flows[30], bpftest.ProtoTCP)); !ok || e.Peer != bpftest.CtKey(flows[30], vipAP, bpftest.ProtoTCP) {
		t.Fatalf("the reopened flow's reverse entry %+v (found %v) is not its own", e, ok)
	}

	// 24 guards, the reopened flow's guard taken back and its forward
	// entry, the remapped flow's 2: 28, past the mark. The 3 oldest guards
	// go; the reopened flow's is its own now, live.
	if st := scan(); st.Deleted[conntrack.ReasonEarlyDrop] != 3 {
		t.Fatalf("dropped %v, want the 3 oldest guards early", st.Deleted)
	}
	for i, c := range flows {
		if guarded(c) != (i >= 10) {
			t.Fatalf("flow %d (%v): guard kept %v, want %v", i, c, guarded(c), i >= 10)
		}
	}
}

// A closed flow that saw a packet within EndedGrace is kept under pressure:
// a lost last ACK brings the server's FIN again, and it needs the flow's
// reverse translation to reach the client.
func TestRecentlyEndedFlowKeptUnderPressure(t *testing.T) {
	bpftest.Require(t)
	dp, sc, clock := smallConntrack(t, 2)
	dp.AddService(bpftest.Service{ID: 1, Front: vipAP, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: be1AP}}})
	for _, flags := range []uint8{bpftest.SYN, bpftest.ACK, bpftest.FIN | bpftest.ACK} {
		dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, flags))
		if flags == bpftest.SYN {
			dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(be1AP, clientAP, bpftest.SYN|bpftest.ACK))
		}
	}
	dp.RunOK(dp.Objs.SlFromWl, bpftest.TCPPacket(be1AP, clientAP, bpftest.FIN|bpftest.ACK))
	clock.Add(int64(500 * time.Millisecond))
	for range 2 {
		st, err := sc.Scan()
		if err != nil {
			t.Fatal(err)
		}
		if st.FillRatio < 1 || st.DeletedTotal() != 0 {
			t.Fatalf("scan %+v: want the full map's closed flow kept within its grace", st)
		}
	}
}

// The scan interval shrinks before the map fills: the growth since the last
// scan predicts when the map passes PressureFill, and the next scan comes
// at half that time, whatever the deletion ratio says; a scan that expects
// the map past the mark evicts at once.
func TestScanComesBeforeTheMapFills(t *testing.T) {
	bpftest.Require(t)
	raw := conntrackOfSize(t, 1000)
	ct, err := maps.NewMap[gen.SluiceCtKey, gen.SluiceCtValue](raw)
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64
	sc, err := conntrack.NewScanner(conntrack.Options{Conntrack: ct, MinInterval: time.Second, MaxInterval: time.Minute,
		Clock: func() time.Duration { return conntrack.Monotonic() + time.Duration(clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	add := func(from, n int) {
		now := uint64(conntrack.Monotonic()) + uint64(clock.Load())
		for i := from; i < from+n; i++ {
			k := gen.SluiceCtKey{Saddr: uint32(i + 1), Proto: 17}
			v := gen.SluiceCtValue{Created: now, LastSeen: now, Type: gen.SluiceCtTypeCT_FORWARD}
			if err := ct.Put(k, v, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	add(0, 100)
	first, err := sc.Scan()
	if err != nil || first.TimeToPressure != 0 {
		t.Fatalf("first scan %+v, %v: no growth is known yet", first, err)
	}
	// 200 entries in 10 s: 600 more reach 90% in 30 s.
	clock.Add(int64(10 * time.Second))
	add(100, 200)
	second, err := sc.Scan()
	if err != nil {
		t.Fatal(err)
	}
	if second.TimeToPressure < 29*time.Second || second.TimeToPressure > 31*time.Second {
		t.Fatalf("time to pressure %v, want 30s", second.TimeToPressure)
	}
	// Nothing was deleted: the ratio rule alone would double the interval.
	if next := sc.NextInterval(40*time.Second, second); next != second.TimeToPressure/2 {
		t.Fatalf("next scan after %v, want half the time to pressure, %v", next, second.TimeToPressure/2)
	}
	// Fast growth never brings the interval under the minimum.
	clock.Add(int64(time.Second))
	add(300, 550)
	third, err := sc.Scan()
	if err != nil {
		t.Fatal(err)
	}
	if next := sc.NextInterval(10*time.Second, third); next != time.Second {
		t.Fatalf("next scan after %v at %v to pressure, want the minimum", next, third.TimeToPressure)
	}
	// The third scan left the map at 85%, under the mark; at 550 entries a
	// second it has passed it since, so the next scan evicts at once (here
	// the flows never answered) rather than a scan later.
	clock.Add(int64(2 * time.Second))
	fourth, err := sc.Scan()
	if err != nil {
		t.Fatal(err)
	}
	if got := fourth.Deleted[conntrack.ReasonEarlyDrop]; got != 850 {
		t.Fatalf("early-dropped %d flows, want the 850 never answered (deleted %v)", got, fourth.Deleted)
	}
}

// A burst fills the map long before the interval of an idle one ends (up to
// a minute). With the maps' entry counts to read, Run looks every
// MinInterval, and the scan it starts when the map is past the mark evicts
// at once: here the never-answered flows of a flood, within a second of the
// map filling, with the next interval an hour away.
func TestRunScansAtOnceWhenTheCountShowsPressure(t *testing.T) {
	bpftest.Require(t)
	raw := conntrackOfSize(t, 100)
	ct, err := maps.NewMap[gen.SluiceCtKey, gen.SluiceCtValue](raw)
	if err != nil {
		t.Fatal(err)
	}
	scans := make(chan conntrack.ScanStats, 16)
	sc, err := conntrack.NewScanner(conntrack.Options{Conntrack: ct, Entries: walkCounts(ct),
		Interval: time.Hour, MinInterval: 20 * time.Millisecond, MaxInterval: time.Hour,
		OnScan: func(st conntrack.ScanStats) { scans <- st }})
	if err != nil {
		t.Fatal(err)
	}
	runScanner(t, sc)

	time.Sleep(100 * time.Millisecond)
	select {
	case st := <-scans:
		t.Fatalf("a scan of the nearly empty map before its interval: %+v", st)
	default:
	}
	// The flood: 95 flows never answered, created 2 s ago.
	old := uint64(conntrack.Monotonic() - 2*time.Second)
	for i := range 95 {
		k := gen.SluiceCtKey{Saddr: uint32(i + 1), Proto: 17}
		if err := ct.Put(k, gen.SluiceCtValue{Created: old, LastSeen: old, Type: gen.SluiceCtTypeCT_FORWARD}, 0); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case st := <-scans:
		if st.Deleted[conntrack.ReasonEarlyDrop] != 95 {
			t.Fatalf("the scan the count started deleted %v, want the flood's 95 flows early-dropped", st.Deleted)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no scan within 5 s of the map filling")
	}
}

// conntrackOfSize is a conntrack map of the datapath's layout that holds
// only entries entries, closed when the test ends.
func conntrackOfSize(t *testing.T, entries uint32) *ebpf.Map {
	t.Helper()
	spec, err := gen.Spec()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps[maps.Conntrack.Name].Copy()
	ms.MaxEntries = entries
	raw, err := ebpf.NewMap(ms)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return raw
}

// Under pressure, datagram flows idle past a second go after the flows
// never answered, and only while the map stays past the low-water mark,
// least recently used first. A resolver asking thousands of queries a
// second from new ports would otherwise fill the map with answered flows
// kept for the UDP timeout, and every new query would be refused.
func TestIdleDatagramFlowsDroppedLeastRecentlyUsedFirst(t *testing.T) {
	bpftest.Require(t)
	raw := conntrackOfSize(t, 64)
	dp := bpftest.NewDatapathWithMaps(t, nodeIP, map[string]*ebpf.Map{maps.Conntrack.Name: raw})
	dp.AddService(bpftest.Service{ID: 2, Front: dnsAP, Proto: bpftest.ProtoUDP, Backends: []bpftest.Backend{{AP: udpBE}}})
	_, sc, clock := scannerAhead(t, raw, conntrack.Options{PressureFill: 0.5})
	// A flow whose client sends again after the queries: the oldest, but
	// the most recently used.
	stream := netip.AddrPortFrom(clientAP.Addr(), 1000)
	dp.RunOK(dp.Objs.SlFromWl, bpftest.UDPPacket(stream, dnsAP, []byte("q")))
	dp.RunOK(dp.Objs.SlFromWl, bpftest.UDPPacket(udpBE, stream, []byte("a")))
	// Queries from new ports, each answered, one every 10 ms (the
	// datapath's clock is the coarse one), until the map refuses one.
	var queries []netip.AddrPort
	for port := uint16(2000); ; port++ {
		c := netip.AddrPortFrom(clientAP.Addr(), port)
		if ret, _ := dp.Run(dp.Objs.SlFromWl, bpftest.UDPPacket(c, dnsAP, []byte("q"))); ret == 2 /* TC_ACT_SHOT */ {
			break
		}
		dp.RunOK(dp.Objs.SlFromWl, bpftest.UDPPacket(udpBE, c, []byte("a")))
		queries = append(queries, c)
		time.Sleep(10 * time.Millisecond)
	}
	if len(queries) != 31 {
		t.Fatalf("%d queries before the map refused one, want 31 beside the stream", len(queries))
	}
	// Past the datapath's refresh of an entry's last packet (250 ms).
	dp.RunOK(dp.Objs.SlFromWl, bpftest.UDPPacket(stream, dnsAP, []byte("q2")))
	clock.Add(int64(2 * time.Second))
	for i := range 2 { // the first finds the map full, the second is under pressure
		if _, err := sc.Scan(); err != nil {
			t.Fatalf("scan %d: %v", i, err)
		}
	}
	// 64 entries, the mark at 40% (25): the 20 oldest queries' 40 go.
	for i, c := range queries {
		_, fwd := dp.CT(bpftest.CtKey(c, dnsAP, bpftest.ProtoUDP))
		_, rev := dp.CT(bpftest.CtKey(udpBE, c, bpftest.ProtoUDP))
		if want := i >= 20; fwd != want || rev != want {
			t.Fatalf("query %d (%v): entries kept %v and %v, want %v: the 20 oldest dropped whole", i, c, fwd, rev, want)
		}
	}
	if _, ok := dp.CT(bpftest.CtKey(stream, dnsAP, bpftest.ProtoUDP)); !ok {
		t.Fatal("the flow used last was dropped")
	}
}

// A map growing fast gets more room from an eviction: the low-water mark
// drops by what the map gains in two polls of its count at the growth seen
// between the last two scans, so that the flows still coming do not fill it
// before the scan after.
func TestEvictionLeavesRoomForTheGrowth(t *testing.T) {
	bpftest.Require(t)
	raw := conntrackOfSize(t, 100)
	ct, sc, clock := scannerAhead(t, raw, conntrack.Options{MinInterval: time.Second})
	// Answered datagram flows, idle for 5 s (the scanner's clock runs
	// ahead): both entries each.
	add := func(from, n int) {
		old := uint64(conntrack.Monotonic() - 5*time.Second)
		for i := from; i < from+n; i++ {
			fwd := gen.SluiceCtKey{Saddr: uint32(i + 1), Daddr: 1 << 20, Proto: 17}
			rev := gen.SluiceCtKey{Saddr: 1 << 20, Daddr: uint32(i + 1), Proto: 17}
			for k, v := range map[gen.SluiceCtKey]gen.SluiceCtValue{
				fwd: {Created: old - 1, LastSeen: old + uint64(i), Peer: rev, Type: gen.SluiceCtTypeCT_FORWARD},
				rev: {Created: old - 1, LastSeen: old + uint64(i), Peer: fwd, Type: gen.SluiceCtTypeCT_REVERSE, TcpSeen: uint32(gen.SluiceCtSeenCT_SEEN_PACKET)},
			} {
				if err := ct.Put(k, v, 0); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	clock.Add(int64(10 * time.Second)) // past the creation grace
	add(0, 10)
	scan := func() conntrack.ScanStats {
		st, err := sc.Scan()
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	scan()
	// 72 entries in a second: the next scan finds 92% and knows the growth.
	clock.Add(int64(time.Second))
	add(10, 36)
	if st := scan(); st.DeletedTotal() != 0 || st.FillRatio < 0.9 {
		t.Fatalf("%+v: want the map past the mark, nothing deleted yet", st)
	}
	// Under pressure: 2 polls of 1 s at 72 entries a second is 144, more
	// than the map; the mark stops at 30 points under PressureFill, 60%.
	// The 16 least recently used flows go, not the 6 of the 80% mark.
	st := scan()
	if got := st.Deleted[conntrack.ReasonEarlyDrop]; got != 16 {
		t.Fatalf("early-dropped %d flows, want 16: the map left at 60%% (deleted %v)", got, st.Deleted)
	}
	if st.LeftRatio != 0.6 {
		t.Fatalf("left %.2f of the map, want 0.60", st.LeftRatio)
	}
}
