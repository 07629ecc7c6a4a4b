package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-net/sluice/netlab"
)

// dsrServices: web (NodePort 30201 and the external IP 10.210.1.100:80) and
// stream (NodePort 30203) on node-b's pods, a UDP echo (NodePort 30202),
// and web6 (IPv6 NodePort 30211).
const dsrServices = `apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  clusterIP: 10.96.2.1
  externalIPs: [10.210.1.100]
  ports: [{name: http, port: 80, nodePort: 30201}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.2.1.2], nodeName: node-b}, {addresses: [10.2.2.2], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata: {name: echo}
spec:
  type: NodePort
  clusterIP: 10.96.2.2
  ports: [{name: udp, port: 53, protocol: UDP, nodePort: 30202}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: echo, labels: {kubernetes.io/service-name: echo}}
addressType: IPv4
ports: [{name: udp, port: 5353, protocol: UDP}]
endpoints: [{addresses: [10.2.1.2], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata: {name: stream}
spec:
  type: NodePort
  clusterIP: 10.96.2.3
  ports: [{name: s, port: 9000, nodePort: 30203}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: stream, labels: {kubernetes.io/service-name: stream}}
addressType: IPv4
ports: [{name: s, port: 9000}]
endpoints: [{addresses: [10.2.1.2], nodeName: node-b}]
` + web6Services

// serveUDPEcho answers each datagram on :5353 in a pod with "<name> <the
// sender's address>".
func (c *cluster) serveUDPEcho(ns, name string) {
	var pc net.PacketConn
	if err := netlab.Enter(netlab.Path(ns), func() (err error) { pc, err = net.ListenPacket("udp4", ":5353"); return err }); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(fmt.Appendf(nil, "%s %s", name, from.(*net.UDPAddr).IP), from)
		}
	}()
}

// udpAsk sends one datagram of size bytes from the namespace to addr and
// returns the answer. The socket is connected, so only an answer from addr
// itself is read. dontFragment sets DF (IP_PMTUDISC_DO); mtu is the socket's
// path MTU to addr after the exchange (IP_MTU).
func udpAsk(ns, addr string, size int, dontFragment bool, timeout time.Duration) (answer string, mtu int, err error) {
	err = netlab.Enter(ns, func() error {
		conn, err := net.DialTimeout("udp4", addr, timeout)
		if err != nil {
			return err
		}
		defer conn.Close()
		raw, err := conn.(*net.UDPConn).SyscallConn()
		if err != nil {
			return err
		}
		if dontFragment {
			raw.Control(func(fd uintptr) {
				syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_MTU_DISCOVER, syscall.IP_PMTUDISC_DO)
			})
		}
		conn.SetDeadline(time.Now().Add(timeout))
		if _, err := conn.Write(make([]byte, size)); err != nil {
			return err
		}
		buf := make([]byte, 2048)
		n, rerr := conn.Read(buf)
		answer = string(buf[:n])
		raw.Control(func(fd uintptr) { mtu, _ = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_MTU) })
		return rerr
	})
	return answer, mtu, err
}

// txBytes is what a node's data interface has sent.
func (c *cluster) txBytes(node string) int64 {
	c.t.Helper()
	out, err := netlab.IP("-n", c.nodes[node].ns, "-j", "-s", "link", "show", "sldata0")
	if err != nil {
		c.t.Fatal(err)
	}
	var links []struct {
		Stats struct {
			TX struct{ Bytes int64 } `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		c.t.Fatalf("ip -s link: %v in %s", err, out)
	}
	return links[0].Stats.TX.Bytes
}

// ctList is `sluice ct list` on a node's pins.
func (c *cluster) ctList(node string, args ...string) string {
	out, err := run2(func() error {
		return run(context.Background(), append([]string{"ct", "list", "--bpf-pin-dir", c.nodes[node].pinDir}, args...))
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// keepAsking is one HTTP/1.1 connection on which requests are asked in turn.
type keepAsking struct{ conn net.Conn }

func dialIn(ns, addr string) (*keepAsking, error) {
	var conn net.Conn
	err := netlab.Enter(ns, func() (err error) { conn, err = net.DialTimeout("tcp4", addr, 2*time.Second); return err })
	return &keepAsking{conn}, err
}

// ask returns the answer's body ("<backend> <client address>").
func (k *keepAsking) ask(timeout time.Duration) (string, error) {
	k.conn.SetDeadline(time.Now().Add(timeout))
	fmt.Fprintf(k.conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	buf := make([]byte, 512)
	n, err := k.conn.Read(buf)
	parts := strings.SplitN(string(buf[:n]), "\r\n\r\n", 2)
	return strings.TrimSpace(parts[len(parts)-1]), err
}

// Three nodes with --external-service-mode=hybrid and Maglev; the backends
// are on node-b, the external client reaches node-a (and node-c). DSR: the
// backend sees the client, and its replies leave node-b straight to the
// client, from the frontend; UDP stays SNATed in hybrid mode. A connection
// whose packets an upstream router moves from node-a to node-c goes on with
// the same backend; one whose backend has left gets a RST. Then node-a in
// dsr mode: UDP keeps the client too, and a datagram the option would make
// too big is answered with the path MTU less the option.
func TestMultiNodeDSR(t *testing.T) {
	c := newClusterOf(t, "node-a", "node-b", "node-c")
	// With the XDP acceleration on: node-a starts each family's flows at
	// XDP, the option or header inserted there, and sends their DNATed
	// segments from XDP.
	c.agentArgs = []string{"--external-service-mode=hybrid", "--lb-algorithm=maglev", "--maglev-table-size=4093", "--xdp-acceleration=native"}
	c.frontends = 9             // web: ClusterIP, NodePort, external IP; echo, stream and web6: ClusterIP, NodePort
	c.addPod("node-b", "b1", 1) // 10.2.1.2, fd00:2:1::2
	c.addPod("node-b", "b2", 2) // 10.2.2.2
	c.enableIPv6(podRef{node: "node-b", name: "b1", idx: 1})
	for _, name := range []string{"b1", "b2"} {
		c.serveHTTP(c.nodes["node-b"].pods[name], name)
	}
	c.serveHTTP6(c.nodes["node-b"].pods["b1"], "b1")
	c.serveUDPEcho(c.nodes["node-b"].pods["b1"], "b1")
	c.writeManifests6(dsrServices)
	c.wireLikeNICs("port0", "port1", "port2")
	for _, n := range c.order {
		c.startAgent(n)
	}
	ext := netlab.Path(c.external)
	defer func() {
		if t.Failed() {
			for _, n := range c.order {
				logs, _ := os.ReadFile(c.nodes[n].log.Name())
				t.Logf("agent %s log:\n%s", n, logs)
			}
		}
	}()

	for _, fam := range []struct{ name, nodePort, client string }{
		{"IPv4", "10.210.0.1:30201", "10.210.0.100"},
		{"IPv6", "[fd00:210::1]:30211", "fd00:210::100"},
	} {
		t.Run(fam.name+": the backend sees the client and answers it directly", func(t *testing.T) {
			before := c.xdpDecisions("node-a")
			body, err := get(ext, fam.nodePort, "", 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			// The SYN with its option or header, and the client's ACKs.
			xdp := c.xdpDecisions("node-a")
			if _, ok := xdp["pass_new_at_tc"]; !ok {
				t.Fatalf("no pass_new_at_tc among node-a's XDP decisions %v", xdp)
			}
			if xdp["tx"] < before["tx"]+2 || xdp["pass_new_at_tc"] != before["pass_new_at_tc"] {
				t.Fatalf("node-a sent %d packets of the request at XDP and passed %d new flows to TC; want its SYN and ACKs at XDP: decisions %v",
					xdp["tx"]-before["tx"], xdp["pass_new_at_tc"]-before["pass_new_at_tc"], xdp)
			}
			if f := strings.Fields(body); len(f) != 2 || f[1] != fam.client {
				t.Fatalf("answer %q: want the external client's own address", body)
			}
			if list := c.ctList("node-a", "--address", fam.client); !strings.Contains(list, "dsr sent") {
				t.Fatalf("node-a's flow is not marked DSR:\n%s", list)
			}
			if list := c.ctList("node-b", "--address", fam.client); !strings.Contains(list, "-> "+fam.nodePort) || !strings.Contains(list, "dsr answered") {
				t.Fatalf("node-b does not answer from the NodePort:\n%s", list)
			}
		})
	}

	t.Run("a 100 MB download leaves node-b without passing node-a", func(t *testing.T) {
		const size = 100 << 20
		aBefore, bBefore := c.txBytes("node-a"), c.txBytes("node-b")
		xdpBefore := c.xdpDecisions("node-a")
		var received atomic.Int64
		err := netlab.Enter(ext, func() error {
			conn, err := net.DialTimeout("tcp4", "10.210.0.1:30203", 2*time.Second)
			if err != nil {
				return err
			}
			defer conn.Close()
			fmt.Fprintf(conn, "%d\n", size)
			conn.SetReadDeadline(time.Now().Add(60 * time.Second))
			_, err = io.Copy(countingWriter{&received}, conn)
			return err
		})
		if n := received.Load(); err != nil || n != size {
			t.Fatalf("received %d of %d bytes: %v", n, size, err)
		}
		aSent, bSent := c.txBytes("node-a")-aBefore, c.txBytes("node-b")-bBefore
		t.Logf("100 MiB download: node-a sent %d bytes, node-b %d", aSent, bSent)
		// node-a forwards the client's ACKs only; node-b sends the data.
		if bSent < size || aSent > size/10 {
			t.Fatalf("node-a sent %d bytes and node-b %d: the replies did not go directly", aSent, bSent)
		}
		// The ACKs (a few thousand for 100 MiB) went out of node-a at XDP,
		// the SYN with the option among them.
		xdp := c.xdpDecisions("node-a")
		t.Logf("node-a's XDP sent %d packets of it", xdp["tx"]-xdpBefore["tx"])
		if tx := xdp["tx"] - xdpBefore["tx"]; tx < 1000 {
			t.Fatalf("node-a sent %d packets of the download at XDP, want the client's ACKs (≥ 1000): decisions %v", tx, xdp)
		}
	})

	t.Run("UDP is SNATed in hybrid mode", func(t *testing.T) {
		answer, _, err := udpAsk(ext, "10.210.0.1:30202", 16, false, 2*time.Second)
		if err != nil || answer != "b1 10.210.0.1" {
			t.Fatalf("answer %q (%v): want b1 seeing node-a's address", answer, err)
		}
	})

	routeVIP := func(t *testing.T, via string) {
		t.Helper()
		if _, err := netlab.IP("-n", c.external, "route", "replace", "10.210.1.100/32", "via", via); err != nil {
			t.Fatal(err)
		}
	}
	// connectThroughA opens a connection to the external IP through node-a
	// and returns it with its first answer.
	connectThroughA := func(t *testing.T) (*keepAsking, string) {
		t.Helper()
		routeVIP(t, "10.210.0.1")
		k, err := dialIn(ext, "10.210.1.100:80")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { k.conn.Close() })
		first, err := k.ask(2 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return k, first
	}

	t.Run("a connection moved to another node keeps its backend", func(t *testing.T) {
		k, before := connectThroughA(t)
		routeVIP(t, "10.210.0.3") // as an ECMP rehash would: node-c has no state for it
		for i := range 5 {
			after, err := k.ask(2 * time.Second)
			if err != nil || after != before {
				t.Fatalf("request %d after the move: %q %v, before it %q", i, after, err, before)
			}
		}
		if list := c.ctList("node-c", "--address", "10.210.0.100"); !strings.Contains(list, "10.210.1.100:80") || !strings.Contains(list, "dsr sent") {
			t.Fatalf("the moved connection did not pass node-c:\n%s", list)
		}
	})

	t.Run("a moved connection whose backend left gets a RST", func(t *testing.T) {
		k, before := connectThroughA(t)
		gone := strings.Fields(before)[0]
		keep := map[string]string{"b1": "10.2.2.2", "b2": "10.2.1.2"}[gone]
		edited := strings.Replace(dsrServices, "endpoints: [{addresses: [10.2.1.2], nodeName: node-b}, {addresses: [10.2.2.2], nodeName: node-b}]",
			fmt.Sprintf("endpoints: [{addresses: [%s], nodeName: node-b}]", keep), 1)
		c.writeManifests6(edited)
		t.Cleanup(func() { c.writeManifests6(dsrServices) })
		c.waitBackends(t, "10.210.1.100:80", keep)
		routeVIP(t, "10.210.0.3")
		answer, err := k.ask(3 * time.Second)
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("after its backend %s left and the move: %q %v, want a reset", gone, answer, err)
		}
	})

	t.Run("dsr mode: UDP keeps the client; a datagram too big for the option learns the path MTU", func(t *testing.T) {
		c.stopAgent("node-a")
		c.agentArgs[0] = "--external-service-mode=dsr"
		c.startAgent("node-a")
		answer, _, err := udpAsk(ext, "10.210.0.1:30202", 16, false, 2*time.Second)
		if err != nil || answer != "b1 10.210.0.100" {
			t.Fatalf("answer %q (%v): want b1 seeing the client's own address, from the NodePort", answer, err)
		}
		// 1472 bytes of payload fill the 1500-byte link; with the 8-byte
		// option the datagram would not fit: node-a says so.
		_, mtu, err := udpAsk(ext, "10.210.0.1:30202", 1472, true, time.Second)
		if mtu != 1492 {
			t.Fatalf("path MTU after a full-size datagram with DF: %d (%v), want 1492", mtu, err)
		}
		answer, _, err = udpAsk(ext, "10.210.0.1:30202", 1464, true, 2*time.Second)
		if err != nil || answer != "b1 10.210.0.100" {
			t.Fatalf("a datagram that fits with the option: %q %v", answer, err)
		}
	})
}
