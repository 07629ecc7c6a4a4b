package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/netlab"
	"github.com/sluice-net/sluice/trace"
)

// wireLikeNICs makes the LAN's bridge ports behave as a NIC's wire toward the
// nodes: a port completes a checksum a sender on this machine left partial
// (a NIC never hands a receiver a CHECKSUM_PARTIAL packet; a veth does), and
// runs an XDP program that passes everything, so a node's veth can send it
// frames from XDP (a veth drops the XDP_TX and redirected frames of a peer
// without an XDP program; GRO on instead loses every one of them).
func (c *cluster) wireLikeNICs(ports ...string) {
	c.t.Helper()
	lan := &bpftest.NetNS{Name: c.lan}
	for _, port := range ports {
		lan.SetChecksumOffload(c.t, port, false, true)
		lan.PassXDP(c.t, port)
	}
}

// xdpDecisions reads a node's XDP acceleration decisions from its pins.
func (c *cluster) xdpDecisions(node string) map[string]uint64 {
	c.t.Helper()
	set, err := maps.Open(maps.OpenOptions{PinDir: c.nodes[node].pinDir, NoCreate: true})
	if err != nil {
		c.t.Fatal(err)
	}
	defer set.Close()
	m, err := maps.XDPDecisions.In(set)
	if err != nil {
		c.t.Fatal(err)
	}
	names, err := maps.XDPDecisionNames()
	if err != nil {
		c.t.Fatal(err)
	}
	d, err := maps.ReadXDPDecisions(m, names)
	if err != nil {
		c.t.Fatal(err)
	}
	return d
}

// --xdp-acceleration=native on real traffic: an external client downloads
// through node-a's NodePort from a backend on node-b (SNAT). node-a's veth runs
// the acceleration in driver mode; the flow's established packets both ways
// are sent back out at XDP, and every byte arrives. While one download runs,
// node-a's agent is restarted with the acceleration disabled (the flow goes
// on through TC: XDP sends nothing more) and again with it native (the same
// flow is carried at XDP again); the download completes, byte for byte.
func TestMultiNodeXDPAcceleration(t *testing.T) {
	c := newCluster(t)
	c.addPod("node-b", "b1", 1) // 10.2.1.2, fd00:2:1::2
	c.enableIPv6(podRef{node: "node-b", name: "b1", idx: 1})
	c.serveHTTP(c.nodes["node-b"].pods["b1"], "b1")
	c.serveHTTP6(c.nodes["node-b"].pods["b1"], "b1")
	c.writeManifests6(multiNodeServices + web6Services)
	c.frontends = 7 // multiNodeServices' 5; web6's ClusterIP and NodePort
	c.wireLikeNICs("port0", "port1")
	native := []string{"--xdp-acceleration=native", "--metrics-bind-address=10.210.0.1:10249"}
	c.agentArgs = native
	c.startAgent("node-a")
	c.agentArgs = []string{"--xdp-acceleration=native"}
	c.startAgent("node-b")
	defer func() {
		if t.Failed() {
			for _, n := range c.order {
				logs, _ := os.ReadFile(c.nodes[n].log.Name())
				t.Logf("agent %s log:\n%s", n, logs)
			}
		}
	}()
	ext := netlab.Path(c.external)
	a := netlab.Path(c.nodes["node-a"].ns)

	ifaceMode := func() string {
		t.Helper()
		out, err := run2(func() error {
			return run(context.Background(), []string{"iface", "list", "--bpf-pin-dir", c.nodes["node-a"].pinDir})
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) == 6 && f[1] == "sldata0" {
				return f[5]
			}
		}
		t.Fatalf("no sldata0 in sluice iface list:\n%s", out)
		return ""
	}
	if mode := ifaceMode(); mode != "driver" {
		t.Fatalf("sluice iface list: sldata0's XDP runs in %q mode, want driver", mode)
	}
	if logs := c.nodes["node-a"].agent.logs(); !strings.Contains(logs, "a veth data interface runs the XDP acceleration") {
		t.Fatalf("the agent does not say what a veth's peer needs:\n%s", logs)
	}

	// download reads size bytes of the stream Service through node-a,
	// slowly until paced is closed.
	download := func(size int64, paced chan struct{}, received *atomic.Int64) error {
		return netlab.Enter(ext, func() error {
			conn, err := net.DialTimeout("tcp4", "10.210.0.1:30103", 2*time.Second)
			if err != nil {
				return err
			}
			defer conn.Close()
			fmt.Fprintf(conn, "%d\n", size)
			buf := make([]byte, 64<<10)
			for received.Load() < size {
				conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				n, err := conn.Read(buf)
				received.Add(int64(n))
				if err != nil {
					if err == io.EOF && received.Load() == size {
						return nil
					}
					return err
				}
				select {
				case <-paced:
				default:
					time.Sleep(5 * time.Millisecond)
				}
			}
			return nil
		})
	}

	t.Run("established packets both ways are sent at XDP", func(t *testing.T) {
		const size = 30 << 20
		before := c.xdpDecisions("node-a")
		done := make(chan struct{})
		close(done)
		var received atomic.Int64
		if err := download(size, done, &received); err != nil || received.Load() != size {
			t.Fatalf("received %d of %d bytes: %v", received.Load(), size, err)
		}
		after := c.xdpDecisions("node-a")
		tx := after["tx"] - before["tx"]
		t.Logf("30 MiB download: node-a's XDP decisions %v (before %v)", after, before)
		// ~21,700 full-sized segments to the client and its ACKs to node-b.
		if tx < 15000 {
			t.Fatalf("node-a sent %d packets at XDP; the download's established packets should go there", tx)
		}
		body, err := get(a, "10.210.0.1:10249/metrics", "", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^sluice_xdp_packets_total\{decision="tx"\} (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("/metrics has no sluice_xdp_packets_total{decision=\"tx\"}:\n%s", grepLines(body, "sluice_xdp"))
		}
		if v, _ := strconv.ParseFloat(m[1], 64); uint64(v) < after["tx"] {
			t.Fatalf("sluice_xdp_packets_total{decision=\"tx\"} %s, below the map's %d", m[1], after["tx"])
		}
	})

	t.Run("IPv6: established packets both ways are sent at XDP", func(t *testing.T) {
		var conn net.Conn
		if err := netlab.Enter(ext, func() (err error) {
			conn, err = net.DialTimeout("tcp6", "[fd00:210::1]:30211", 2*time.Second)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		k := &keepAsking{conn}
		if _, err := k.ask(2 * time.Second); err != nil { // the flow established through TC
			t.Fatal(err)
		}
		before := c.xdpDecisions("node-a")["tx"]
		const asks = 200
		for i := range asks {
			body, err := k.ask(2 * time.Second)
			if f := strings.Fields(body); err != nil || len(f) != 2 || f[0] != "b1" || f[1] != "fd00:210::1" {
				t.Fatalf("ask %d: %q %v: want b1 seeing node-a's address", i, body, err)
			}
		}
		// Each ask: the request and the answer, at least.
		if tx := c.xdpDecisions("node-a")["tx"] - before; tx < 2*asks {
			t.Fatalf("%d asks over IPv6 sent %d packets at XDP, want at least %d", asks, tx, 2*asks)
		}
	})

	t.Run("sluice trace follows the packet through XDP", func(t *testing.T) {
		traceOnA := func(src, flags string) trace.Result {
			t.Helper()
			out, err := run2(func() error {
				return netlab.Enter(a, func() error {
					return run(context.Background(), []string{"trace", "tcp", src, "->", "10.210.0.1:30102", "--iface", "sldata0",
						"--flags", flags, "--bpf-pin-dir", c.nodes["node-a"].pinDir, "--json"})
				})
			})
			var r trace.Result
			if err == nil {
				err = json.Unmarshal([]byte(out), &r)
			}
			if err != nil {
				t.Fatalf("sluice trace: %v\n%s", err, out)
			}
			t.Logf("trace %s [%s]: %s; verdict %s, xdp %s", src, flags, strings.Join(r.Steps, "; "), r.Verdict, r.XDP)
			return r
		}
		k, err := dialIn(ext, "10.210.0.1:30102")
		if err != nil {
			t.Fatal(err)
		}
		defer k.conn.Close()
		if _, err := k.ask(2 * time.Second); err != nil {
			t.Fatal(err)
		}
		r := traceOnA(k.conn.LocalAddr().String(), "ack")
		if r.Program != "sl_xdp_accel" || r.XDP != "tx" || r.Verdict != "xdp_tx" || !strings.Contains(r.Output, "-> 10.2.1.2:8080") {
			t.Fatalf("an established connection's packet: %+v, want sent at XDP to 10.2.1.2:8080", r)
		}
		r = traceOnA("10.210.0.100:45999", "syn")
		if r.XDP != "tx" || r.Program != "sl_xdp_accel" || r.Verdict != "xdp_tx" || !strings.HasPrefix(r.SNAT, "10.210.0.1:") ||
			r.Backend != "10.2.1.2:8080" {
			t.Fatalf("a new connection's SYN: %+v, want started at XDP, SNATed to 10.2.1.2:8080", r)
		}
		r = traceOnA("10.210.0.100:45998", "ack")
		if r.XDP != "pass_no_flow" || r.Program != "sl_from_host" {
			t.Fatalf("a segment of no known connection: %+v, want passed to TC", r)
		}
	})

	t.Run("a download goes on from XDP to TC and back, byte for byte", func(t *testing.T) {
		const size = 200 << 20
		paced := make(chan struct{})
		var received atomic.Int64
		result := make(chan error, 1)
		go func() { result <- download(size, paced, &received) }()
		progress := func(what string, atLeast int64) {
			t.Helper()
			// A packet lost while an agent restarts costs a retransmission
			// timeout, which doubles with each loss: allow for a few.
			waitFor(t, 45*time.Second, what, func() bool { return received.Load() >= atLeast }, func() string {
				return fmt.Sprintf("received %d bytes; node-a's XDP decisions %v; its flows:\n%s", received.Load(),
					c.xdpDecisions("node-a"), c.ctList("node-a", "--address", "10.210.0.100"))
			})
		}
		progress("the download under way", 4<<20)

		c.stopAgent("node-a")
		c.agentArgs = []string{"--xdp-acceleration=disabled"}
		c.startAgent("node-a")
		if mode := ifaceMode(); mode != "driver" {
			t.Fatalf("disabled: sldata0's prefilter runs in %q mode, want driver", mode)
		}
		atTC := c.xdpDecisions("node-a")["tx"]
		mark := received.Load()
		progress("the download going on through TC", mark+8<<20)
		if tx := c.xdpDecisions("node-a")["tx"]; tx != atTC {
			t.Fatalf("acceleration disabled, yet %d more packets were sent at XDP", tx-atTC)
		}

		c.stopAgent("node-a")
		c.agentArgs = native
		c.startAgent("node-a")
		mark = received.Load()
		progress("the download going on at XDP again", mark+8<<20)
		if tx := c.xdpDecisions("node-a")["tx"]; tx < atTC+2000 {
			t.Fatalf("acceleration back on, yet only %d packets were sent at XDP", tx-atTC)
		}
		close(paced)
		select {
		case err := <-result:
			if err != nil || received.Load() != size {
				t.Fatalf("received %d of %d bytes: %v", received.Load(), size, err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("the download stalled at %d of %d bytes", received.Load(), size)
		}
	})

	t.Run("native refuses a device without driver-mode XDP, and says so", func(t *testing.T) {
		// A bridge as a second data interface: its driver has no XDP.
		if _, err := netlab.IP("-n", c.nodes["node-a"].ns, "link", "add", "sldata1", "type", "bridge"); err != nil {
			t.Fatal(err)
		}
		if _, err := netlab.IP("-n", c.nodes["node-a"].ns, "link", "set", "sldata1", "up"); err != nil {
			t.Fatal(err)
		}
		n := c.nodes["node-a"]
		var body string
		waitFor(t, 25*time.Second, "/healthz 503 naming sldata1", func() bool {
			var code int
			code, body, _ = fetchIn(a, n.ip+":10256/healthz", "", time.Second)
			return code == 503 && strings.Contains(body, "sldata1")
		}, func() string { return body + "\n" + n.agent.logs() })
		if logs := n.agent.logs(); !strings.Contains(logs, "sldata1") || !strings.Contains(logs, "driver mode") {
			t.Fatalf("the log does not say why sldata1 is not ready:\n%s", logs)
		}
	})
}

// web6Services: web6, an IPv6 NodePort (30211) to b1 on node-b
// (fd00:2:1::2:8080).
const web6Services = `---
apiVersion: v1
kind: Service
metadata: {name: web6}
spec:
  type: NodePort
  clusterIP: 'fd00:96::2:1'
  clusterIPs: ['fd00:96::2:1']
  ipFamilies: [IPv6]
  ipFamilyPolicy: SingleStack
  ports: [{name: http, port: 80, nodePort: 30211}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web6, labels: {kubernetes.io/service-name: web6}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ['fd00:2:1::2'], nodeName: node-b}]
`
