package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/ifacemgr"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
	"github.com/sluice-net/sluice/netlab"
)

// cluster: nodes (two, or as newClusterOf names them) and an external host
// on one L2 segment (a bridge in its own namespace), each node with pods
// behind veths and its own agent process. The n-th node:
//
//	node-a  data 10.210.0.1  pods 10.1.<i>.2 (gateway 10.1.<i>.1)
//	node-b  data 10.210.0.2  pods 10.2.<i>.2
//	...     data 10.210.0.n  pods 10.n.<i>.2
//	external     10.210.0.100
type cluster struct {
	t        *testing.T
	lab      netlab.Lab
	lan      string
	nodes    map[string]*clusterNode
	order    []string // the nodes' names, in the order of their numbers
	external string
	dir      string
	// agentArgs are added to every agent's command line.
	agentArgs []string
	// frontends is how many frontends a programmed node has (0: the
	// multiNodeServices' 5).
	frontends int
}

type clusterNode struct {
	name, ns, ip, pinDir, manifests string
	num                             int               // 1 for the first node: its addresses' number
	pods                            map[string]string // pod name -> namespace
	agent                           *agentProc
	log                             *os.File
}

func newCluster(t *testing.T) *cluster { return newClusterOf(t, "node-a", "node-b") }

func newClusterOf(t *testing.T, names ...string) *cluster {
	bpftest.Require(t)
	c := &cluster{t: t, lab: netlab.Lab{Prefix: bpftest.UniqueName("slmn")}, nodes: map[string]*clusterNode{}, dir: t.TempDir(), order: names}
	t.Cleanup(c.lab.Close)
	must := func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	c.lan = must(c.lab.Bridge("lan"))
	for i, name := range names {
		n := &clusterNode{name: name, ns: must(c.lab.Router(name)), ip: fmt.Sprintf("10.210.0.%d", i+1), num: i + 1, pods: map[string]string{}}
		must("", c.lab.Plug(n.ns, "sldata0", netip.MustParsePrefix(n.ip+"/24"), c.lan, fmt.Sprintf("port%d", i)))
		for j := range names {
			if j != i {
				must(netlab.IP("-n", n.ns, "route", "add", fmt.Sprintf("10.%d.0.0/16", j+1), "via", fmt.Sprintf("10.210.0.%d", j+1)))
			}
		}
		n.pinDir = filepath.Join(bpftest.PinDir(t), "sluice")
		c.nodes[name] = n
	}
	c.external = must(c.lab.Namespace("ext"))
	must("", c.lab.Plug(c.external, "eth0", netip.MustParsePrefix("10.210.0.100/24"), c.lan, "port9"))
	return c
}

// addPod puts a pod behind a veth on a node: 10.<node>.<idx>.2.
func (c *cluster) addPod(node, name string, idx int) string {
	n := c.nodes[node]
	addr := netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.2/24", n.num, idx))
	gw := netip.MustParseAddr(fmt.Sprintf("10.%d.%d.1", n.num, idx))
	ns, err := c.lab.Pod(n.ns, fmt.Sprintf("slw%d", idx), name, addr, gw)
	if err != nil {
		c.t.Fatal(err)
	}
	n.pods[name] = ns
	return addr.Addr().String()
}

// serveHTTP answers "<name> <client address>" on :8080 in a pod, and streams
// the requested number of bytes on :9000 ("N\n" in, N bytes out).
func (c *cluster) serveHTTP(ns, name string) {
	var ln, stream net.Listener
	err := netlab.Enter(netlab.Path(ns), func() (err error) {
		if ln, err = net.Listen("tcp4", ":8080"); err != nil {
			return err
		}
		stream, err = net.Listen("tcp4", ":9000")
		return err
	})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { ln.Close(); stream.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				buf := make([]byte, 4096)
				for {
					if _, err := conn.Read(buf); err != nil {
						return
					}
					body := fmt.Sprintf("%s %s\n", name, conn.RemoteAddr().(*net.TCPAddr).IP)
					fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				}
			}()
		}
	}()
	go func() {
		for {
			conn, err := stream.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				var n int64
				fmt.Fscanf(conn, "%d\n", &n)
				chunk := make([]byte, 64<<10)
				for sent := int64(0); sent < n; {
					w := min(int64(len(chunk)), n-sent)
					if _, err := conn.Write(chunk[:w]); err != nil {
						return
					}
					sent += w
					time.Sleep(2 * time.Millisecond) // a transfer that lasts
				}
			}()
		}
	}()
}

// writeManifests gives each node the shared services and every Node object
// (node-a's pods are in 10.1.0.0/16, node-b's in 10.2.0.0/16, ...).
func (c *cluster) writeManifests(services string) {
	var nodes strings.Builder
	for i, name := range c.order {
		fmt.Fprintf(&nodes, "---\napiVersion: v1\nkind: Node\nmetadata: {name: %s}\nspec: {podCIDR: 10.%d.0.0/16}\n"+
			"status: {addresses: [{type: InternalIP, address: %s}]}\n", name, i+1, c.nodes[name].ip)
	}
	for _, n := range c.nodes {
		n.manifests = filepath.Join(c.dir, n.name)
		os.MkdirAll(n.manifests, 0o755)
		os.WriteFile(filepath.Join(n.manifests, "nodes.yaml"), []byte(nodes.String()), 0o644)
		os.WriteFile(filepath.Join(n.manifests, "services.yaml"), []byte(services), 0o644)
	}
}

// startAgent runs `sluice agent` as its own process inside the node.
func (c *cluster) startAgent(node string) {
	n := c.nodes[node]
	var err error
	if n.log == nil {
		if n.log, err = os.Create(filepath.Join(c.dir, node+".log")); err != nil {
			c.t.Fatal(err)
		}
	}
	args := []string{"--manifests", n.manifests, "--hostname-override", n.name,
		"--bpf-pin-dir", n.pinDir, "--workload-iface-prefixes", "slw", "--data-ifaces", "^sldata", "--cgroup=",
		"--healthz-bind-address", n.ip + ":10256", "--metrics-bind-address=", "--min-sync-period", "50ms"}
	n.agent = startAgentProc(c.t, n.ns, n.log, append(args, c.agentArgs...)...)
	// Ready when its health endpoint answers 200 after a sync.
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err = get(netlab.Path(n.ns), n.ip+":10256/healthz", "", time.Second); err == nil {
			break
		}
		if time.Now().After(deadline) {
			logs := n.agent.logs()
			c.t.Fatalf("agent on %s not healthy: %v\n%s", node, err, logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Programmed: the pins show every interface ready and the services in place.
	for !c.programmed(n) {
		if time.Now().After(deadline) {
			logs := n.agent.logs()
			c.t.Fatalf("agent on %s did not program its node\n%s", node, logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *cluster) programmed(n *clusterNode) bool {
	set, err := maps.Open(maps.OpenOptions{PinDir: n.pinDir, NoCreate: true})
	if err != nil {
		return false
	}
	defer set.Close()
	ifstate, err := maps.IfState.In(set)
	if err != nil {
		return false
	}
	ifaces, err := ifacemgr.ReadInterfaces(filepath.Join(n.pinDir, "links"), ifstate)
	if err != nil || len(ifaces) != len(n.pods)+1 {
		return false
	}
	for _, i := range ifaces {
		if !i.Ready {
			return false
		}
	}
	fes, err := nat.ReadFrontends(set)
	return err == nil && len(fes) >= cmp.Or(c.frontends, 5)
}

// backendsOf lists the backends a node programs for a frontend ("ip:port").
func (c *cluster) backendsOf(node, frontend string) []string {
	set, err := maps.Open(maps.OpenOptions{PinDir: c.nodes[node].pinDir, NoCreate: true})
	if err != nil {
		return nil
	}
	defer set.Close()
	fes, err := nat.ReadFrontends(set)
	if err != nil {
		return nil
	}
	var out []string
	for _, fe := range fes {
		if fe.Address.String() == frontend {
			for _, b := range fe.Backends {
				out = append(out, b.Address.Addr().String())
			}
		}
	}
	return out
}

// waitBackends waits until every node programs exactly these backends for a
// frontend.
func (c *cluster) waitBackends(t *testing.T, frontend string, want ...string) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%s: backends %v on every node", frontend, want), func() bool {
		for node := range c.nodes {
			if !slices.Equal(slices.Sorted(slices.Values(c.backendsOf(node, frontend))), slices.Sorted(slices.Values(want))) {
				return false
			}
		}
		return true
	}, nil)
}

// natList is `sluice nat list` on a node's pins.
func (c *cluster) natList(node string) string {
	out, err := run2(func() error {
		return run(context.Background(), []string{"nat", "list", "--bpf-pin-dir", c.nodes[node].pinDir})
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

func (c *cluster) stopAgent(node string) {
	n := c.nodes[node]
	if n.agent != nil {
		n.agent.stop()
		n.agent = nil
	}
}

const multiNodeServices = `apiVersion: v1
kind: Service
metadata: {name: only-b}
spec:
  type: NodePort
  clusterIP: 10.96.1.1
  ports: [{name: http, port: 80, nodePort: 30102}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: only-b, labels: {kubernetes.io/service-name: only-b}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.2.1.2], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata: {name: local}
spec:
  type: LoadBalancer
  clusterIP: 10.96.1.2
  externalTrafficPolicy: Local
  healthCheckNodePort: 32101
  ports: [{name: http, port: 80, nodePort: 30101}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local, labels: {kubernetes.io/service-name: local}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.2.1.2], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata: {name: both}
spec:
  type: NodePort
  clusterIP: 10.96.1.3
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30104}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: both, labels: {kubernetes.io/service-name: both}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.1.1.2], nodeName: node-a}, {addresses: [10.2.1.2], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata: {name: sticky}
spec:
  clusterIP: 10.96.1.4
  sessionAffinity: ClientIP
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sticky, labels: {kubernetes.io/service-name: sticky}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.1.1.2], nodeName: node-a}, {addresses: [10.2.1.2], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata: {name: stream}
spec:
  type: NodePort
  clusterIP: 10.96.1.5
  ports: [{name: s, port: 9000, nodePort: 30103}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: stream, labels: {kubernetes.io/service-name: stream}}
addressType: IPv4
ports: [{name: s, port: 9000}]
endpoints: [{addresses: [10.2.1.2], nodeName: node-b}]
`

func TestMultiNode(t *testing.T) {
	c := newCluster(t)
	c.addPod("node-a", "a1", 1) // 10.1.1.2
	c.addPod("node-b", "b1", 1) // 10.2.1.2
	c.addPod("node-a", "client-a", 9)
	c.serveHTTP(c.nodes["node-a"].pods["a1"], "a1")
	c.serveHTTP(c.nodes["node-b"].pods["b1"], "b1")
	c.writeManifests(multiNodeServices)
	c.startAgent("node-a")
	c.startAgent("node-b")
	ext := netlab.Path(c.external)
	clientA := netlab.Path(c.nodes["node-a"].pods["client-a"])

	t.Run("NodePort to a backend on another node is SNATed and answers", func(t *testing.T) {
		body, err := get(ext, "10.210.0.1:30102", "", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(body); len(f) != 2 || f[0] != "b1" || f[1] != "10.210.0.1" {
			t.Fatalf("answer %q: want b1, seeing node-a's address (SNAT)", body)
		}
	})

	t.Run("externalTrafficPolicy Local: source kept where local, dropped elsewhere, health checks", func(t *testing.T) {
		body, err := get(ext, "10.210.0.2:30101", "", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(body); len(f) != 2 || f[1] != "10.210.0.100" {
			t.Fatalf("answer %q: want the external client's own address", body)
		}
		if _, err := get(ext, "10.210.0.1:30101", "", 700*time.Millisecond); err == nil {
			t.Fatal("node without a local endpoint served an externalTrafficPolicy Local service")
		}
		code := func(node string) int {
			status, _, err := fetchIn(ext, node+":32101", "", time.Second)
			if err != nil {
				t.Fatalf("health check on %s: %v", node, err)
			}
			return status
		}
		if a, b := code("10.210.0.1"), code("10.210.0.2"); a != 503 || b != 200 {
			t.Fatalf("health-check NodePort: node-a %d (want 503), node-b %d (want 200)", a, b)
		}
	})

	t.Run("internalTrafficPolicy Local keeps a pod on its node", func(t *testing.T) {
		for range 10 {
			body, err := get(clientA, "10.96.1.3:80", "", 2*time.Second)
			if err != nil || !strings.HasPrefix(body, "a1 ") {
				t.Fatalf("answer %q %v: want the local a1 only", body, err)
			}
		}
	})

	t.Run("internalTrafficPolicy Local NodePort of another node reaches that node's pods", func(t *testing.T) {
		// node-a places node-b's endpoints by node-b's pod CIDR and programs
		// node-b's NodePort with them: the pod's packets go straight to
		// b1, not SNATed, and never to a1.
		if !strings.Contains(c.natList("node-a"), "10.210.0.2:30104") {
			t.Fatalf("node-a has no entry for node-b's NodePort:\n%s", c.natList("node-a"))
		}
		for range 10 {
			body, err := get(clientA, "10.210.0.2:30104", "", 2*time.Second)
			if err != nil || body != "b1 10.1.9.2" {
				t.Fatalf("answer %q %v: want b1, seeing the pod's own address", body, err)
			}
		}
	})

	t.Run("session affinity across nodes", func(t *testing.T) {
		first := ""
		for i := range 10 {
			body, err := get(clientA, "10.96.1.4:80", "", 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				first = backendOf(body)
			} else if backendOf(body) != first {
				t.Fatalf("request %d went to %s, affinity said %s", i, backendOf(body), first)
			}
		}
	})

	t.Run("agent restarted mid-transfer loses no connection", func(t *testing.T) {
		const size = 32 << 20 // about a second at the server's pace
		var received atomic.Int64
		errc := make(chan error, 1)
		err := netlab.Enter(ext, func() error {
			conn, err := net.DialTimeout("tcp4", "10.210.0.1:30103", 2*time.Second)
			if err != nil {
				return err
			}
			fmt.Fprintf(conn, "%d\n", size)
			go func() {
				defer conn.Close()
				conn.SetReadDeadline(time.Now().Add(30 * time.Second))
				_, err := io.Copy(countingWriter{&received}, conn)
				errc <- err
			}()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		// At least 256 KiB more each time: flowing before the stop, while
		// no agent runs, and after the new one started.
		grows := func(what string) {
			t.Helper()
			from := received.Load()
			for deadline := time.Now().Add(10 * time.Second); received.Load() < min(from+256<<10, size); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the transfer stalled %s at %d bytes", what, received.Load())
				}
			}
		}
		grows("before the restart")
		c.stopAgent("node-a") // the node that SNATs this flow
		grows("while node-a's agent is stopped")
		atRestart := received.Load()
		c.startAgent("node-a")
		t.Logf("%d of %d bytes received when node-a's agent started again", atRestart, size)
		if atRestart == size {
			t.Fatal("the transfer ended before the agent was back: make it longer")
		}
		err = <-errc
		if n := received.Load(); n != size {
			t.Fatalf("transfer across the agent restart: %d bytes, want %d (%v)", n, size, err)
		}
	})

	t.Run("a backend leaving keeps its open connection", func(t *testing.T) {
		var conn net.Conn
		if err := netlab.Enter(clientA, func() (err error) { conn, err = net.DialTimeout("tcp4", "10.96.1.4:80", 2*time.Second); return err }); err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ask := func() (string, error) {
			conn.SetDeadline(time.Now().Add(2 * time.Second))
			fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			buf := make([]byte, 512)
			n, err := conn.Read(buf)
			parts := strings.SplitN(string(buf[:n]), "\r\n\r\n", 2)
			return backendOf(parts[len(parts)-1]), err
		}
		before, err := ask()
		if err != nil {
			t.Fatal(err)
		}
		// The sticky service loses that backend (both nodes' manifests).
		keep := map[string]string{"a1": "10.2.1.2", "b1": "10.1.1.2"}[before]
		node := map[string]string{"10.2.1.2": "node-b", "10.1.1.2": "node-a"}[keep]
		edited := strings.Replace(multiNodeServices,
			"metadata: {name: sticky, labels: {kubernetes.io/service-name: sticky}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints: [{addresses: [10.1.1.2], nodeName: node-a}, {addresses: [10.2.1.2], nodeName: node-b}]",
			fmt.Sprintf("metadata: {name: sticky, labels: {kubernetes.io/service-name: sticky}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints: [{addresses: [%s], nodeName: %s}]", keep, node), 1)
		if edited == multiNodeServices {
			t.Fatal("test bug: the edit matched nothing")
		}
		c.writeManifests(edited)
		t.Cleanup(func() { // the other subtests' cluster again
			c.writeManifests(multiNodeServices)
			c.waitBackends(t, "10.96.1.4:80", "10.1.1.2", "10.2.1.2")
		})
		c.waitBackends(t, "10.96.1.4:80", keep)
		for range 3 {
			if after, err := ask(); err != nil || after != before {
				t.Fatalf("open connection after its backend left: %q %v (was %q)", after, err, before)
			}
		}
		if body, err := get(clientA, "10.96.1.4:80", "", 2*time.Second); err != nil || backendOf(body) == before {
			t.Fatalf("a new connection went to %q (%v), the backend that left", body, err)
		}
	})
	if t.Failed() {
		for _, n := range c.nodes {
			logs, _ := os.ReadFile(n.log.Name())
			t.Logf("agent %s log:\n%s", n.name, logs)
		}
	}
}

// countingWriter counts what is written to it.
type countingWriter struct{ n *atomic.Int64 }

func (w countingWriter) Write(p []byte) (int, error) {
	w.n.Add(int64(len(p)))
	return len(p), nil
}
