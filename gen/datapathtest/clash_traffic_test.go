package datapathtest_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// A pod client alternating Service and direct connections to the same
// backends, behind servers that close first, at full rate with its ephemeral
// ports narrowed so that they are reused across destinations: every
// connection must succeed at once, over IPv4 and over IPv6. A tuple clash
// shows as a SYN the backend drops (PAWS against its TIME_WAIT, or a segment
// of another connection) and the client retransmits a second later.
func TestRealClientsReusingPortsAcrossServiceAndDirect(t *testing.T) {
	for _, f := range []struct {
		name, listen string
		vip          netip.AddrPort
		podIP        func(*bpftest.Topology, string) netip.Addr
	}{
		{"IPv4", ":8080", netip.MustParseAddrPort("10.96.0.10:80"), func(topo *bpftest.Topology, n string) netip.Addr { return topo.PodIP[n] }},
		{"IPv6", "[::]:8080", netip.MustParseAddrPort("[fd00:96::10]:80"), func(topo *bpftest.Topology, n string) netip.Addr { return topo.PodIP6[n] }},
	} {
		t.Run(f.name, func(t *testing.T) {
			d := newDP(t)
			names := []string{"b1", "b2", "b3"}
			topo := bpftest.NewTopology(t, d, append([]string{"client"}, names...)...)
			topo.EnableIPv6(t)
			var backends []bpftest.Backend
			for _, n := range names {
				bpftest.ServeCloseFirst(t, topo.Pods[n], n, f.listen)
				backends = append(backends, bpftest.Backend{AP: netip.AddrPortFrom(f.podIP(topo, n), 8080), Local: true})
			}
			d.AddService(bpftest.Service{ID: 1, Front: f.vip, Proto: protoTCP, Backends: backends})
			client := topo.Pods["client"]
			// The range is the IPv4 sysctl's name; it binds IPv6 sockets too.
			client.Run("sysctl", "-qw", "net.ipv4.ip_local_port_range=40000 40063")
			reuseAtFullRate(t, d, topo, client, names, f.vip, backends)
		})
	}
}

// reuseAtFullRate runs the clients against the Service and each backend
// directly, and checks that no connection failed or waited.
func reuseAtFullRate(t *testing.T, d *bpftest.Datapath, topo *bpftest.Topology, client *bpftest.NetNS, names []string,
	vip netip.AddrPort, backends []bpftest.Backend) {
	stats := clientStats{ns: client, backends: names, topo: topo}
	stats.snapshot(t)
	targets := []string{vip.String()}
	for _, b := range backends {
		targets = append(targets, b.AP.String())
	}
	res := bpftest.RunClients(client, targets, 4, 5*time.Second)
	retrans, paws := stats.delta(t)
	t.Logf("%d connections in %v (%.0f/s), %d failed, %d SYN retransmits, %d PAWS TIME_WAIT rejects, %d tuples remapped, %d reopened",
		res.OK+res.Failed, res.Elapsed, res.Rate(), res.Failed, retrans, paws,
		d.Counter(gen.SluiceCounterCNT_TUPLE_REMAPPED), d.Counter(gen.SluiceCounterCNT_TUPLE_REUSED))
	if t.Failed() || res.Failed != 0 || retrans != 0 || paws != 0 {
		logCounters(t, d)
	}
	if res.Failed != 0 || res.NoLocalPort != 0 {
		t.Errorf("%d connections failed, %d refused by the client's kernel for want of a port; first error: %v", res.Failed, res.NoLocalPort, res.FirstErr)
	}
	if retrans != 0 {
		t.Errorf("client retransmitted %d SYNs", retrans)
	}
	if paws != 0 {
		t.Errorf("backends rejected %d SYNs against TIME_WAIT (PAWS)", paws)
	}
	if res.OK < 1000 {
		t.Errorf("only %d connections in %v", res.OK, res.Elapsed)
	}
	if d.Counter(gen.SluiceCounterCNT_TUPLE_REMAPPED) == 0 {
		t.Error("no tuple was remapped: the test did not make ports clash")
	}
}

type clientStats struct {
	ns       *bpftest.NetNS
	backends []string
	topo     *bpftest.Topology
	retrans  uint64
	paws     uint64
}

func (s *clientStats) read(t *testing.T) (retrans, paws uint64) {
	t.Helper()
	c, err := bpftest.Netstat(s.ns, "TcpExt", "TCPSynRetrans")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range s.backends {
		v, err := bpftest.Netstat(s.topo.Pods[b], "TcpExt", "PAWSTimewait")
		if err != nil {
			t.Fatal(err)
		}
		paws += v["PAWSTimewait"]
	}
	return c["TCPSynRetrans"], paws
}

func (s *clientStats) snapshot(t *testing.T) { s.retrans, s.paws = s.read(t) }

func (s *clientStats) delta(t *testing.T) (retrans, paws uint64) {
	r, p := s.read(t)
	return r - s.retrans, p - s.paws
}
