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

// A connection of the node's own and a flow SNATed to the node's address
// never share a tuple at their common destination, in either order, as with
// netfilter, which tracks the node's connections too: the node's flows
// leaving a data interface are tracked, so a SNATed flow does not take their
// port, and a node connection on a tuple a SNATed flow holds gets another
// port as it leaves. Both connections of each pair must carry their own
// lines at once, from the same client port.
func TestNodeConnectionAndSNATedFlowNeverShareATuple(t *testing.T) {
	for _, nodeFirst := range []bool{false, true} {
		name := "SNATed flow first"
		if nodeFirst {
			name = "node connection first"
		}
		t.Run(name, func(t *testing.T) {
			d := newDP(t)
			topo := bpftest.NewTopology(t, d, "client")
			// The external host is the Service's backend (another node's
			// pod, as far as this node can tell); every flow to it is
			// SNATed to the node's address (--masquerade-all).
			bpftest.ServeTCP(t, topo.External, "ext", ":9090")
			backend := netip.AddrPortFrom(netip.MustParseAddr("10.210.0.2"), 9090)
			vip := netip.MustParseAddrPort("10.96.0.10:80")
			d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: protoTCP, Backends: []bpftest.Backend{{AP: backend}}})
			d.Put(d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(topo.NodeIP), Flags: gen.SluiceConfigFlagsCFG_MASQUERADE_ALL})

			const port = 41000
			podConn := func() net.Conn {
				return dialFrom(t, topo.Pods["client"], netip.AddrPortFrom(topo.PodIP["client"], port), vip)
			}
			nodeConn := func() net.Conn { return dialFrom(t, topo.Node, netip.AddrPortFrom(topo.NodeIP, port), backend) }
			var first, second net.Conn
			if nodeFirst {
				first, second = nodeConn(), podConn()
			} else {
				first, second = podConn(), nodeConn()
			}
			// The backend sees the node's address on both; the ports
			// it answers to must differ, and each line must come back
			// to its own connection.
			for i, c := range []net.Conn{first, second, first, second} {
				line := fmt.Sprintf("line %d", i)
				got := exchangeOn(t, c, line)
				if !strings.HasSuffix(got, line) {
					t.Fatalf("connection %d got %q for %q", i%2, got, line)
				}
			}
			if n := d.Counter(gen.SluiceCounterCNT_SNAT_PORT_DRAWN) + d.Counter(gen.SluiceCounterCNT_TUPLE_REMAPPED); n == 0 {
				t.Fatal("neither flow changed port: they shared the tuple at the backend")
			}
		})
	}
}

// dialFrom connects from ns, bound to local, to remote.
func dialFrom(t *testing.T, ns *bpftest.NetNS, local, remote netip.AddrPort) net.Conn {
	t.Helper()
	var c net.Conn
	err := ns.Do(func() (err error) {
		dl := net.Dialer{Timeout: 3 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(local)}
		c, err = dl.Dial("tcp4", remote.String())
		return err
	})
	if err != nil {
		t.Fatalf("dial %v from %v: %v", remote, local, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// exchangeOn sends a line on c and returns the answer.
func exchangeOn(t *testing.T, c net.Conn, line string) string {
	t.Helper()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(c, "%s\n", line); err != nil {
		t.Fatal(err)
	}
	answer, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	return strings.TrimSpace(answer)
}
