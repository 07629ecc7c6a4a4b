package conntrack_test

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

// A DNS-like client keeps one socket with a fixed source port. Its backend pod
// is replaced; once the sync flushes the old backend's flows, the very next
// datagram reaches the new backend instead of the dead one.
func TestFixedPortUDPClientFollowsReplacedBackend(t *testing.T) {
	dp := bpftest.NewDatapath(t, nodeIP)
	topo := bpftest.NewTopology(t, dp, "client", "b1", "b2")
	b1 := netip.AddrPortFrom(topo.PodIP["b1"], 5353)
	b2 := netip.AddrPortFrom(topo.PodIP["b2"], 5353)
	vip := netip.MustParseAddrPort("10.96.0.10:53")
	dp.AddService(bpftest.Service{ID: 7, Front: vip, Proto: bpftest.ProtoUDP, Backends: []bpftest.Backend{{AP: b1, Local: true}}})
	stopB1 := bpftest.ServeUDPEcho(t, topo.Pods["b1"], "b1", ":5353")
	bpftest.ServeUDPEcho(t, topo.Pods["b2"], "b2", ":5353")

	var conn *net.UDPConn
	if err := topo.Pods["client"].Do(func() (err error) {
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 5000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func(q string, wait time.Duration) (string, error) {
		if _, err := conn.WriteToUDPAddrPort([]byte(q), vip); err != nil {
			return "", err
		}
		conn.SetReadDeadline(time.Now().Add(wait))
		buf := make([]byte, 512)
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err == nil && from != vip {
			t.Fatalf("answer from %v, want the service address", from)
		}
		return string(buf[:n]), err
	}
	if got, err := ask("q1", 2*time.Second); err != nil || got != "b1 q1" {
		t.Fatalf("first query: %q %v", got, err)
	}

	// b1 goes away and the sync replaces it with b2 in the maps.
	stopB1()
	dp.Put(dp.Objs.SlBeV1, gen.SluiceBeKey{SvcId: 7}, gen.SluiceBeValue{Addr: gen.NetAddr(b2.Addr()), Port: gen.NetPort(b2.Port()), Flags: gen.SluiceBeFlagsBE_LOCAL})
	// Without the flush, conntrack still pins the client to the dead b1.
	if got, err := ask("q-stale", 300*time.Millisecond); err == nil {
		t.Fatalf("answered %q before the flush: the test would not show the remedy", got)
	}

	ct, err := maps.NewMap[gen.SluiceCtKey, gen.SluiceCtValue](dp.Objs.SlCtV2)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := conntrack.NewScanner(conntrack.Options{Conntrack: ct})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := sc.FlushBackends([]conntrack.Backend{{ServiceID: 7, Addr: b1}}); err != nil || n != 1 {
		t.Fatalf("flushed %d flows: %v", n, err)
	}
	got, err := ask("q2", 2*time.Second)
	if err != nil || !strings.HasPrefix(got, "b2 ") {
		t.Fatalf("after the flush: %q %v, want an answer from b2", got, err)
	}
}
