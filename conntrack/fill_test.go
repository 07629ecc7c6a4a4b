package conntrack_test

import (
	"bytes"
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
	spec, err := gen.Spec()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps[maps.Conntrack.Name].Copy()
	ms.MaxEntries = 20
	raw, err := ebpf.NewMap(ms)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
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
	spec, err := gen.Spec()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps[maps.Conntrack.Name].Copy()
	ms.MaxEntries = 64
	raw, err := ebpf.NewMap(ms)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
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
