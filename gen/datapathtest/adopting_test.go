package datapathtest_test

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// A TCP segment leaving a workload that no conntrack entry knows (a
// connection netfilter translated before Sluice took the node over, or one
// whose entries are gone) goes to the node's stack, never to local delivery:
// only the stack can apply netfilter's translation to it. The test opens a
// connection between two pods, deletes Sluice's entries of it and goes on
// talking: every later segment is forwarded by the node's stack, none
// delivered by the datapath. Both families.
func TestUnknownSegmentsGoByTheStack(t *testing.T) {
	d := newDP(t)
	topo := bpftest.NewTopology(t, d, "client", "b1")
	topo.EnableIPv6(t)
	bpftest.ServeTCP(t, topo.Pods["b1"], "b1", ":8080")
	bpftest.ServeTCP(t, topo.Pods["b1"], "b1", "[::]:8081")
	for _, family := range []struct {
		name      string
		b1        netip.AddrPort
		forwarded func(*testing.T, *bpftest.NetNS) uint64
	}{
		{"IPv4", netip.AddrPortFrom(topo.PodIP["b1"], 8080), forwarded4},
		{"IPv6", netip.AddrPortFrom(topo.PodIP6["b1"], 8081), forwarded6},
	} {
		t.Run(family.name, func(t *testing.T) {
			var conn net.Conn
			if err := topo.Pods["client"].Do(func() (err error) {
				conn, err = net.DialTimeout("tcp", family.b1.String(), 2*time.Second)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			r := bufio.NewReader(conn)
			talk := func(line string) {
				t.Helper()
				conn.SetDeadline(time.Now().Add(2 * time.Second))
				if _, err := fmt.Fprintln(conn, line); err != nil {
					t.Fatal(err)
				}
				answer, err := r.ReadString('\n')
				if err != nil || !strings.HasPrefix(answer, "b1 ") || !strings.HasSuffix(answer, line+"\n") {
					t.Fatalf("%q answered %q, %v", line, answer, err)
				}
			}
			talk("tracked")
			client := netip.MustParseAddrPort(conn.LocalAddr().String())
			client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
			d.DeleteCT(client, family.b1, protoTCP)
			d.DeleteCT(family.b1, client, protoTCP)

			forwarded, delivered := family.forwarded(t, topo.Node), d.Counter(gen.SluiceCounterCNT_LOCAL_DELIVERED)
			for i := range 5 {
				talk(fmt.Sprintf("untracked-%d", i))
			}
			if n := d.Counter(gen.SluiceCounterCNT_LOCAL_DELIVERED) - delivered; n != 0 {
				t.Fatalf("%d segments of a connection Sluice does not track were delivered past the stack", n)
			}
			// Each line is a segment each way, and at least one
			// acknowledgement.
			if n := family.forwarded(t, topo.Node) - forwarded; n < 10 {
				t.Fatalf("the node's stack forwarded %d segments of 5 exchanges", n)
			}
			if _, ok := d.Flow(client, family.b1, protoTCP); ok {
				t.Fatal("a segment that is not a SYN started a flow")
			}
		})
	}
}

// While a takeover adopts netfilter's flows (CFG_ADOPTING), a datagram no
// entry knows passes untouched and starts no flow, even to a Service: it may
// be a flow netfilter keeps on its backend. Leaving a workload, it goes to
// the stack. Once the flag is cleared, the same datagram is balanced.
func TestAdoptingLeavesUnknownDatagramsToNetfilter(t *testing.T) {
	d := newDP6(t)
	client := netip.MustParseAddrPort("10.1.0.5:40000")
	vip := netip.MustParseAddrPort("10.96.0.53:53")
	backend := netip.MustParseAddrPort("10.1.1.2:5353")
	d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: protoUDP, Backends: []bpftest.Backend{{AP: backend}}})
	client6 := netip.MustParseAddrPort("[fd00:1::5]:40000")
	vip6 := netip.MustParseAddrPort("[fd00:96::53]:53")
	backend6 := netip.MustParseAddrPort("[fd00:1:1::2]:5353")
	d.AddService(bpftest.Service{ID: 2, Front: vip6, Proto: protoUDP, Backends: []bpftest.Backend{{AP: backend6}}})

	for _, c := range []struct {
		name             string
		src, dst, wantTo netip.AddrPort
	}{
		{"IPv4", client, vip, backend},
		{"IPv6", client6, vip6, backend6},
	} {
		t.Run(c.name, func(t *testing.T) {
			frame := bpftest.UDPPacket(c.src, c.dst, []byte("q"))
			setConfigFlags(t, d, gen.SluiceConfigFlagsCFG_ADOPTING)
			for _, prog := range []struct {
				name string
				run  func() (uint32, []byte)
			}{
				{"from a workload", func() (uint32, []byte) { return d.Run(d.Objs.SlFromWl, frame) }},
				{"from outside", func() (uint32, []byte) { return d.Run(d.Objs.SlFromHost, frame) }},
				{"into a workload", func() (uint32, []byte) { return d.Run(d.Objs.SlToWl, frame) }},
			} {
				verdict, out := prog.run()
				if verdict != actOK {
					t.Fatalf("%s: verdict %d, want TC_ACT_OK", prog.name, verdict)
				}
				dec, err := bpftest.Decode(out)
				if err != nil {
					t.Fatal(err)
				}
				if dec.Dst != c.dst {
					t.Fatalf("%s: the datagram left for %v, want %v untouched", prog.name, dec.Dst, c.dst)
				}
				if _, ok := d.Flow(c.src, c.dst, protoUDP); ok {
					t.Fatalf("%s: a flow was started while adopting", prog.name)
				}
			}
			setConfigFlags(t, d, 0)
			if dec := d.RunOK(d.Objs.SlFromWl, frame); dec.Dst != c.wantTo {
				t.Fatalf("after the adoption the datagram left for %v, want the backend %v", dec.Dst, c.wantTo)
			}
		})
	}
}
