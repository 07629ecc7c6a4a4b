package datapathtest_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// snatChurnDuration is how long the client dials in each case of
// TestOffClusterClientAtFullRateThroughSNAT.
const snatChurnDuration = 10 * time.Second

// A client outside the cluster's pod CIDR (so its ClusterIP flows are
// masqueraded to the node, as kube-proxy does with --cluster-cidr), behind a
// workload interface or outside the node on its data interface, dials one
// ClusterIP as fast as it can, its servers closing first (HTTP/1.0, idle
// keep-alives closed by nginx), with a small ephemeral range so that every
// port is reused many times a second — what a client with 28,000 ports does
// at thousands of connections a second, compressed. Each flow leaves the node as node:port, and each reuse of a
// client port reopens its tuple while the backends still hold the last
// connection on it in TIME_WAIT. Netfilter replaces such an ended flow and
// keeps the port; the datapath must too, or every reopen takes a port of the
// SNAT range for the 120 s a server-closed flow is held, and the range runs
// out. Nothing may fail, retransmit or be dropped for want of a port.
func TestOffClusterClientAtFullRateThroughSNAT(t *testing.T) {
	for _, f := range []struct {
		name, listen string
		vip          netip.AddrPort
		podIP        func(*bpftest.Topology, string) netip.Addr
		masquerade   func(*bpftest.Datapath, *bpftest.Topology)
	}{
		{"IPv4", ":8080", netip.MustParseAddrPort("10.96.0.10:80"),
			func(topo *bpftest.Topology, n string) netip.Addr { return topo.PodIP[n] },
			func(d *bpftest.Datapath, topo *bpftest.Topology) {
				// The backends' CIDR (10.200.0.0/14): the client
				// (10.204.0.2) is outside it.
				d.Put(d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(topo.NodeIP),
					ClusterNet: gen.NetAddr(netip.MustParseAddr("10.200.0.0")), ClusterMask: gen.NetAddr(netip.MustParseAddr("255.252.0.0"))})
			}},
		{"IPv6", "[::]:8080", netip.MustParseAddrPort("[fd00:96::10]:80"),
			func(topo *bpftest.Topology, n string) netip.Addr { return topo.PodIP6[n] },
			func(d *bpftest.Datapath, topo *bpftest.Topology) {
				// fd00:200::/30 holds the backends, not fd00:204::2.
				d.Put(d.Objs.SlConfig6V1, uint32(0), gen.SluiceConfig6{NodeIp: gen.NetAddr6(topo.NodeIP6),
					ClusterNet: gen.NetAddr6(netip.MustParseAddr("fd00:200::")), ClusterMask: gen.NetAddr6(netip.MustParseAddr("ffff:fffc::"))})
			}},
	} {
		for _, external := range []bool{false, true} {
			name := f.name + "/workload client"
			if external {
				name = f.name + "/external client"
			}
			t.Run(name, func(t *testing.T) {
				d := newDP(t)
				names := []string{"b1", "b2", "b3", "b4"}
				topo := bpftest.NewTopology(t, d, append(names, "client")...)
				topo.EnableIPv6(t)
				f.masquerade(d, topo)
				var backends []bpftest.Backend
				for _, n := range names {
					bpftest.ServeCloseFirst(t, topo.Pods[n], n, f.listen)
					backends = append(backends, bpftest.Backend{AP: netip.AddrPortFrom(f.podIP(topo, n), 8080), Local: true})
				}
				d.AddService(bpftest.Service{ID: 1, Front: f.vip, Proto: protoTCP, Backends: backends})
				client := topo.Pods["client"]
				if external {
					client = topo.External
				}
				client.Run("sysctl", "-qw", "net.ipv4.ip_local_port_range=40000 40255")

				stats := clientStats{ns: client, backends: names, topo: topo}
				stats.snapshot(t)
				res := bpftest.RunClients(client, []string{f.vip.String()}, 4, snatChurnDuration)
				retrans, paws := stats.delta(t)
				drops := d.Counter(gen.SluiceCounterCNT_DROP_SNAT_PORTS)
				reused := d.Counter(gen.SluiceCounterCNT_TUPLE_REUSED)
				drawn := d.Counter(gen.SluiceCounterCNT_SNAT_PORT_DRAWN)
				t.Logf("%d connections in %v (%.0f/s), %d failed, %d SYN retransmits, %d PAWS rejects, %d reopened, %d refused for want of a SNAT port",
					res.OK+res.Failed, res.Elapsed, res.Rate(), res.Failed, retrans, paws, reused, drops)
				if res.Failed != 0 || retrans != 0 || paws != 0 || drops != 0 {
					logCounters(t, d)
				}
				for what, n := range map[string]uint64{"connections failed": uint64(res.Failed), "SYNs retransmitted": retrans,
					"dials the client's kernel refused for want of a port": uint64(res.NoLocalPort),
					"SYNs rejected against TIME_WAIT (PAWS)":               paws, "flows refused for want of a SNAT port": drops,
					// One client: every reopened tuple keeps its port.
					"SNAT ports drawn": drawn} {
					if n != 0 {
						t.Errorf("%s: %d (first error: %v)", what, n, res.FirstErr)
					}
				}
				// 256 client ports: the run must have reopened tuples for it
				// to test anything.
				if reused < 1000 {
					t.Errorf("only %d tuples reopened: the client did not reuse its ports", reused)
				}
				// Bounded by the client's ports: a forward entry per client
				// tuple, and per backend at most one reverse entry of that
				// tuple (a reopened tuple replaces its old flow; an ended
				// flow's reverse entry stays only while its server holds the
				// tuple in TIME_WAIT, and only the same client takes it back).
				entries, snat := conntrackEntries(d)
				t.Logf("%d conntrack entries left, %d forward entries SNATed", entries, snat)
				if snat == 0 {
					t.Error("no flow was SNATed to the node's address")
				}
				if limit := 256 * (1 + len(names)); entries > limit {
					t.Errorf("%d conntrack entries for 256 client ports and %d backends: want at most %d", entries, len(names), limit)
				}
			})
		}
	}
}

// conntrackEntries counts both families' entries, and the forward entries
// whose source is translated.
func conntrackEntries(d *bpftest.Datapath) (entries, snat int) {
	var k gen.SluiceCtKey
	var v gen.SluiceCtValue
	for it := d.Objs.SlCtV2.Iterate(); it.Next(&k, &v); {
		entries++
		if v.Type == gen.SluiceCtTypeCT_FORWARD && v.Flags&gen.SluiceCtFlagsCT_SNAT != 0 {
			snat++
		}
	}
	var k6 gen.SluiceCt6Key
	var v6 gen.SluiceCt6Value
	for it := d.Objs.SlCt6V1.Iterate(); it.Next(&k6, &v6); {
		entries++
		if v6.Type == gen.SluiceCtTypeCT_FORWARD && v6.Flags&gen.SluiceCtFlagsCT_SNAT != 0 {
			snat++
		}
	}
	return entries, snat
}
