package conntrack_test

import (
	"cmp"
	"net"
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

// Resolver-like clients ask a UDP Service from a new port for every query,
// over the whole unprivileged range: each query is a flow of its own,
// answered once, and the UDP timeout would keep it a minute. Here one of
// them fills a table of 65,536 entries (an eighth of the built-in one) within
// seconds, over and over. The scanner under pressure drops the idle datagram
// flows least recently used first, so every query is answered and none is
// refused for a full table.
func TestOneShotUDPQueriesKeepFlowingThroughAFullTable(t *testing.T) {
	raw := conntrackOfSize(t, 65536)
	dp := bpftest.NewDatapathWithMaps(t, nodeIP, map[string]*ebpf.Map{maps.Conntrack.Name: raw})
	topo := bpftest.NewTopology(t, dp, "client", "b1", "b2")
	vip := netip.MustParseAddrPort("10.96.0.53:53")
	var backends []bpftest.Backend
	for _, n := range []string{"b1", "b2"} {
		bpftest.ServeUDPEcho(t, topo.Pods[n], n, ":5353")
		backends = append(backends, bpftest.Backend{AP: netip.AddrPortFrom(topo.PodIP[n], 5353), Local: true})
	}
	dp.AddService(bpftest.Service{ID: 9, Front: vip, Proto: bpftest.ProtoUDP, Backends: backends})
	// More client ports than the table holds flows: a port reused within
	// the minute would continue its old flow instead of making a new one.
	topo.Pods["client"].Run("sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65535")
	ct, err := maps.NewMap[gen.SluiceCtKey, gen.SluiceCtValue](raw)
	if err != nil {
		t.Fatal(err)
	}
	var dropped, lastScan, longestGap atomic.Int64
	sc, err := conntrack.NewScanner(conntrack.Options{Conntrack: ct, Entries: walkCounts(ct), MinInterval: 100 * time.Millisecond,
		OnScan: func(st conntrack.ScanStats) {
			dropped.Add(int64(st.Deleted[conntrack.ReasonEarlyDrop]))
			now := time.Now().UnixNano()
			if prev := lastScan.Swap(now); prev != 0 && now-prev > longestGap.Load() {
				longestGap.Store(now - prev) // one scanner goroutine calls this
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	runScanner(t, sc)

	// A datagram a socket had no room for (Udp RcvbufErrors, in any of the
	// three pods) is lost on a busy machine whatever the datapath does: a
	// query lost so is not the table's.
	socketDrops := func() uint64 {
		var sum uint64
		for _, pod := range topo.Pods {
			c, err := bpftest.SNMP(pod, "Udp", "RcvbufErrors")
			if err != nil {
				t.Fatal(err)
			}
			sum += c["RcvbufErrors"]
		}
		return sum
	}
	socketDropsBefore := socketDrops()
	var answered, failed int
	var firstErr error
	deadline := time.Now().Add(20 * time.Second)
	err = topo.Pods["client"].Do(func() error {
		buf := make([]byte, 64)
		for time.Now().Before(deadline) {
			err := func() error {
				c, err := net.Dial("udp4", vip.String()) // a new port each query
				if err != nil {
					return err
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(time.Second))
				if _, err := c.Write([]byte("q")); err != nil {
					return err
				}
				_, err = c.Read(buf)
				return err
			}()
			if err != nil {
				failed++
				firstErr = cmp.Or(firstErr, err)
				continue
			}
			answered++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	full := dp.Counter(gen.SluiceCounterCNT_DROP_CT_FULL)
	lostToSockets := socketDrops() - socketDropsBefore
	t.Logf("%d queries answered, %d failed (%d datagrams found no room in a socket), %d refused for a full table, %d flows dropped early; scans at most %v apart",
		answered, failed, lostToSockets, full, dropped.Load(), time.Duration(longestGap.Load()))
	// Every failure is a socket's drop or a refusal, and refusals are
	// rarer than one query in 100,000. None is refused on a quiet machine;
	// with other packages' tests beside it, CI once saw 1 of 281,825 (an
	// answered flow is dropped only once idle for a second, so a scanner
	// held off the CPU for long enough lets the table fill).
	if uint64(failed) > lostToSockets+full || full*100_000 > uint64(answered) {
		t.Errorf("%d queries failed (first: %v), %d of them neither lost to a socket's buffer nor refused; %d refused for a full table",
			failed, firstErr, uint64(failed)-min(uint64(failed), lostToSockets+full), full)
	}
	if answered < 65536 { // 2 entries each: 2 tables' worth
		t.Errorf("only %d queries: the table did not fill over and over", answered)
	}
	if dropped.Load() == 0 {
		t.Error("nothing dropped early: the table never came under pressure")
	}
}
