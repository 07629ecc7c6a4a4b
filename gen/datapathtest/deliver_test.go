package datapathtest_test

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// Packets between two pods of one node are handed from one pod's interface
// to the other's by the datapath (bpf/include/deliver.h): the node's stack
// forwards none of them, and each arrives as the stack's forwarding would
// have left it.
func TestLocalDeliveryPastTheNodeStack(t *testing.T) {
	d := newDP(t)
	topo := bpftest.NewTopology(t, d, "client", "b1")
	b1 := netip.AddrPortFrom(topo.PodIP["b1"], 8080)
	echo := netip.AddrPortFrom(topo.PodIP["b1"], 5353)
	bpftest.ServeTCP(t, topo.Pods["b1"], "b1", ":8080")
	bpftest.ServeUDPEcho(t, topo.Pods["b1"], "b1", ":5353")
	vip := netip.MustParseAddrPort("10.96.0.10:80")
	d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: protoTCP, Backends: []bpftest.Backend{{AP: b1, Local: true}}})
	client := topo.Pods["client"]
	exchange := func(t *testing.T, network string, to netip.AddrPort, line string) {
		t.Helper()
		exchangeWithB1(t, client, network, to, line)
	}
	// The node learns the pods' MACs from the first packets, which its
	// stack carries (route_learn does not keep an answer without them).
	exchange(t, "tcp4", b1, "warm-up")
	exchange(t, "udp4", echo, "warm-up")

	t.Run("TCP direct and through a ClusterIP, and UDP: the stack forwards none", func(t *testing.T) {
		forwarded, delivered := forwarded4(t, topo.Node), d.Counter(gen.SluiceCounterCNT_LOCAL_DELIVERED)
		for i := range 10 {
			exchange(t, "tcp4", b1, fmt.Sprintf("direct-%d", i))
			exchange(t, "tcp4", vip, fmt.Sprintf("service-%d", i))
			exchange(t, "udp4", echo, fmt.Sprintf("udp-%d", i))
		}
		if n := forwarded4(t, topo.Node) - forwarded; n != 0 {
			t.Fatalf("the node's stack forwarded %d packets between the pods", n)
		}
		// A TCP exchange is at least 3 packets each way (handshake, line,
		// close); a UDP one, 1 each way.
		if n := d.Counter(gen.SluiceCounterCNT_LOCAL_DELIVERED) - delivered; n < 10*(6+6+2) {
			t.Fatalf("%d packets delivered by the datapath, want at least %d", n, 10*(6+6+2))
		}
	})

	t.Run("the TTL is one less and the header checksum holds", func(t *testing.T) {
		forwarded := forwarded4(t, topo.Node)
		// The reply's TTL: 64 from b1, one less past the node. A header
		// whose checksum did not follow would not be answered.
		if out := client.Run("ping", "-c", "1", "-W", "2", b1.Addr().String()); !strings.Contains(out, "ttl=63") {
			t.Fatalf("ping through the node: %s", out)
		}
		if n := forwarded4(t, topo.Node) - forwarded; n != 0 {
			t.Fatalf("the node's stack forwarded %d of the echoes", n)
		}
	})

	t.Run("--stack-routing leaves them to the stack", func(t *testing.T) {
		setConfigFlags(t, d, gen.SluiceConfigFlagsCFG_STACK_ROUTING)
		defer setConfigFlags(t, d, 0)
		forwarded, delivered := forwarded4(t, topo.Node), d.Counter(gen.SluiceCounterCNT_LOCAL_DELIVERED)
		exchange(t, "tcp4", b1, "by-the-stack")
		if n := forwarded4(t, topo.Node) - forwarded; n < 6 {
			t.Fatalf("the stack forwarded %d packets of a TCP exchange", n)
		}
		if n := d.Counter(gen.SluiceCounterCNT_LOCAL_DELIVERED) - delivered; n != 0 {
			t.Fatalf("%d packets delivered by the datapath", n)
		}
	})

	t.Run("a destination no longer a ready workload goes by the stack at once", func(t *testing.T) {
		var ifindex int
		if err := topo.Node.Do(func() error {
			ifc, err := net.InterfaceByName(topo.PodIface["b1"])
			ifindex = ifc.Index
			return err
		}); err != nil {
			t.Fatal(err)
		}
		key := gen.SluiceIfstateKey{Ifindex: uint32(ifindex)}
		var st gen.SluiceIfstateValue
		if err := d.Objs.SlIfstateV1.Lookup(key, &st); err != nil {
			t.Fatal(err)
		}
		// The answer kept from the packets before names b1's interface.
		exchange(t, "tcp4", b1, "kept")
		if err := d.Objs.SlIfstateV1.Delete(key); err != nil {
			t.Fatal(err)
		}
		forwarded, delivered := forwarded4(t, topo.Node), d.Counter(gen.SluiceCounterCNT_LOCAL_DELIVERED)
		exchange(t, "tcp4", b1, "interface-gone")
		if n := forwarded4(t, topo.Node) - forwarded; n < 3 {
			t.Fatalf("the stack forwarded %d packets to b1", n)
		}
		// b1's replies, to the client's interface, still are delivered.
		if n := d.Counter(gen.SluiceCounterCNT_LOCAL_DELIVERED) - delivered; n < 3 {
			t.Fatalf("%d of b1's replies delivered by the datapath", n)
		}
		d.Put(d.Objs.SlIfstateV1, key, st)
		// The answers learned meanwhile ("not a workload") are kept a
		// second; then b1 is reached past the stack again.
		time.Sleep(1100 * time.Millisecond)
		forwarded = forwarded4(t, topo.Node)
		exchange(t, "tcp4", b1, "interface-back")
		if n := forwarded4(t, topo.Node) - forwarded; n != 0 {
			t.Fatalf("the stack still forwarded %d packets after the interface came back", n)
		}
	})

	t.Run("what the stack must handle goes to it: a TTL that expires here", func(t *testing.T) {
		// ping -t 1: the node's stack answers "time exceeded", as before.
		out := client.Run("sh", "-c", "ping -c 1 -W 2 -t 1 "+b1.Addr().String()+" || true")
		if !strings.Contains(out, "Time to live exceeded") {
			t.Fatalf("ping with TTL 1: %s", out)
		}
	})
}

// setConfigFlags sets the node-wide config flags, keeping the rest.
func setConfigFlags(t *testing.T, d *bpftest.Datapath, flags gen.SluiceConfigFlags) {
	t.Helper()
	var cfg gen.SluiceConfig
	if err := d.Objs.SlConfigV1.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Flags = flags
	if err := d.Objs.SlConfigV1.Update(uint32(0), cfg, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
}

// IPv6 between two pods of one node goes past the node's stack too: TCP
// directly and through an IPv6 ClusterIP, UDP, and an echo whose reply
// arrives with the hop limit one less.
func TestLocalDeliveryIPv6(t *testing.T) {
	d := newDP(t)
	topo := bpftest.NewTopology(t, d, "client", "b1")
	topo.EnableIPv6(t)
	b1 := netip.AddrPortFrom(topo.PodIP6["b1"], 8080)
	echo := netip.AddrPortFrom(topo.PodIP6["b1"], 5353)
	bpftest.ServeTCP(t, topo.Pods["b1"], "b1", "[::]:8080")
	bpftest.ServeUDPEcho(t, topo.Pods["b1"], "b1", "[::]:5353")
	vip := netip.MustParseAddrPort("[fd00:96::10]:80")
	d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: protoTCP, Backends: []bpftest.Backend{{AP: b1, Local: true}}})
	client := topo.Pods["client"]
	exchange := func(t *testing.T, network string, to netip.AddrPort, line string) {
		t.Helper()
		exchangeWithB1(t, client, network, to, line)
	}
	exchange(t, "tcp6", b1, "warm-up") // the node learns the pods' MACs
	exchange(t, "udp6", echo, "warm-up")

	forwarded, delivered := forwarded6(t, topo.Node), d.Counter(gen.SluiceCounterCNT_LOCAL_DELIVERED)
	for i := range 10 {
		exchange(t, "tcp6", b1, fmt.Sprintf("direct-%d", i))
		exchange(t, "tcp6", vip, fmt.Sprintf("service-%d", i))
		exchange(t, "udp6", echo, fmt.Sprintf("udp-%d", i))
	}
	if out := client.Run("ping", "-6", "-c", "1", "-W", "2", b1.Addr().String()); !strings.Contains(out, "ttl=63") {
		t.Fatalf("ping through the node: %s", out)
	}
	if n := forwarded6(t, topo.Node) - forwarded; n != 0 {
		t.Fatalf("the node's stack forwarded %d IPv6 packets between the pods", n)
	}
	if n := d.Counter(gen.SluiceCounterCNT_LOCAL_DELIVERED) - delivered; n < 10*(6+6+2)+2 {
		t.Fatalf("%d packets delivered by the datapath, want at least %d", n, 10*(6+6+2)+2)
	}

	// A hop limit that expires at the node is the stack's to answer.
	if out := client.Run("sh", "-c", "ping -6 -c 1 -W 2 -t 1 "+b1.Addr().String()+" || true"); !strings.Contains(out, "Time exceeded") {
		t.Fatalf("ping with hop limit 1: %s", out)
	}
}

// exchangeWithB1 sends line from ns to b1's server at to and checks that b1
// answered it.
func exchangeWithB1(t *testing.T, ns *bpftest.NetNS, network string, to netip.AddrPort, line string) {
	t.Helper()
	answer, err := bpftest.Exchange(ns, network, to.String(), line)
	if err != nil {
		t.Fatalf("%s to %v: %v", network, to, err)
	}
	if f := strings.Fields(answer); len(f) < 2 || f[0] != "b1" || f[len(f)-1] != line {
		t.Fatalf("%s to %v: answer %q", network, to, answer)
	}
}

// forwarded4 and forwarded6: the datagrams a namespace's stack has forwarded.
func forwarded4(t *testing.T, ns *bpftest.NetNS) uint64 { v4, _ := ns.Forwarded(t); return v4 }
func forwarded6(t *testing.T, ns *bpftest.NetNS) uint64 { _, v6 := ns.Forwarded(t); return v6 }

// A flow whose destination is not behind a workload interface of this node
// is marked on its conntrack entry (CT_SEEN_STACK_ROUTED) the first time one
// of its established packets asks local delivery, and then asks no more:
// with the kept answers gone, a marked flow's packets leave sl_route empty,
// where an unmarked flow's first established packet asks again. A flow's
// first packet marks nothing (it asks with no entry in hand). Direct and
// through a ClusterIP, IPv4 and IPv6.
func TestStackRoutedFlowsAskOnce(t *testing.T) {
	// Run in a namespace of no routes, so that the FIB's answer ("not
	// here") is the same on every machine.
	ns := bpftest.NewNetNS(t)
	run := func(t *testing.T, d *bpftest.Datapath, frame []byte) {
		t.Helper()
		var ret uint32
		if err := ns.Do(func() error {
			var err error
			ret, err = d.Objs.SlFromWl.Run(&ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256)})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if ret != actOK {
			t.Fatalf("verdict %d, want TC_ACT_OK (to the stack)", ret)
		}
	}
	marked := func(t *testing.T, d *bpftest.Datapath, src, dst netip.AddrPort) bool {
		t.Helper()
		f, ok := d.Flow(src, dst, protoTCP)
		if !ok {
			t.Fatalf("no conntrack entry %v -> %v", src, dst)
		}
		return f.TCPSeen&uint32(gen.SluiceCtSeenCT_SEEN_STACK_ROUTED) != 0
	}
	for _, tc := range []struct {
		name     string
		d        *bpftest.Datapath
		vip, dst netip.AddrPort
		client   netip.Addr
	}{
		{"IPv4", newDP(t), vipAP, netip.MustParseAddrPort("10.9.0.9:80"), clientAP.Addr()},
		{"IPv6", newDP6(t), vip6, netip.MustParseAddrPort("[fd00:9::9]:80"), client6.Addr()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.d
			routes := d.Objs.SlRouteV1
			if tc.client.Is6() {
				routes = d.Objs.SlRoute6V1
			}
			d.AddService(bpftest.Service{ID: 1, Front: tc.vip, Proto: protoTCP, Backends: []bpftest.Backend{{AP: tc.dst}}})
			direct := netip.AddrPortFrom(tc.client, 40001)
			viaService := netip.AddrPortFrom(tc.client, 40002)
			unmarked := netip.AddrPortFrom(tc.client, 40003)
			flows := []struct{ src, dst netip.AddrPort }{{direct, tc.dst}, {viaService, tc.vip}}

			for _, f := range flows {
				run(t, d, bpftest.TCPPacket(f.src, f.dst, bpftest.SYN))
				if marked(t, d, f.src, f.dst) {
					t.Fatalf("%v -> %v marked by its SYN", f.src, f.dst)
				}
				run(t, d, bpftest.TCPPacket(f.src, f.dst, bpftest.ACK))
				if !marked(t, d, f.src, f.dst) {
					t.Fatalf("%v -> %v not marked after its first established packet", f.src, f.dst)
				}
			}
			run(t, d, bpftest.TCPPacket(unmarked, tc.dst, bpftest.SYN))

			bpftest.ClearMap(t, routes)
			for _, f := range flows {
				run(t, d, bpftest.TCPPacket(f.src, f.dst, bpftest.ACK))
			}
			if n := entries(t, routes); n != 0 {
				t.Fatalf("marked flows' packets asked the FIB again: %d answers kept", n)
			}
			run(t, d, bpftest.TCPPacket(unmarked, tc.dst, bpftest.ACK))
			if n := entries(t, routes); n != 1 {
				t.Fatalf("an unmarked flow's packet left %d answers kept, want 1", n)
			}
			if !marked(t, d, unmarked, tc.dst) {
				t.Fatalf("%v -> %v not marked after its first established packet", unmarked, tc.dst)
			}
		})
	}
}

// entries counts a map's entries.
func entries(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	var k, v []byte
	n := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
