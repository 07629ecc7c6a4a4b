package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/netlab"
)

// The two-node cluster of TestMultiNode made dual-stack: each node also has
// an IPv6 address on the LAN (fd00:210::1, ::2; the external host ::100),
// each pod an IPv6 address (fd00:<node>:<i>::2), routes between the nodes'
// IPv6 pod CIDRs, and dual-stack Services with an EndpointSlice per family.
func (c *cluster) enableIPv6(pods ...podRef) {
	must := func(_ string, err error) {
		c.t.Helper()
		if err != nil {
			c.t.Fatal(err)
		}
	}
	for i, name := range c.order {
		n := c.nodes[name]
		must(netlab.IP("netns", "exec", n.ns, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"))
		must(netlab.IP("-n", n.ns, "addr", "add", fmt.Sprintf("fd00:210::%d/64", i+1), "dev", "sldata0", "nodad"))
		for j := range c.order {
			if j != i {
				must(netlab.IP("-n", n.ns, "-6", "route", "add", fmt.Sprintf("fd00:%d::/32", j+1), "via", fmt.Sprintf("fd00:210::%d", j+1)))
			}
		}
		for _, p := range pods {
			if p.node != name {
				continue
			}
			pod := n.pods[p.name]
			must(netlab.IP("-n", n.ns, "addr", "add", fmt.Sprintf("fd00:%d:%d::1/64", i+1, p.idx), "dev", fmt.Sprintf("slw%d", p.idx), "nodad"))
			must(netlab.IP("-n", pod, "addr", "add", fmt.Sprintf("fd00:%d:%d::2/64", i+1, p.idx), "dev", "eth0", "nodad"))
			must(netlab.IP("-n", pod, "-6", "route", "add", "default", "via", fmt.Sprintf("fd00:%d:%d::1", i+1, p.idx)))
		}
	}
	must(netlab.IP("-n", c.external, "addr", "add", "fd00:210::100/64", "dev", "eth0", "nodad"))
}

// podRef names a pod made by addPod: its node, name and index.
type podRef struct {
	node, name string
	idx        int
}

// serveHTTP6 is serveHTTP's answer on [::]:8080.
func (c *cluster) serveHTTP6(ns, name string) {
	var ln net.Listener
	if err := netlab.Enter(netlab.Path(ns), func() (err error) { ln, err = net.Listen("tcp6", "[::]:8080"); return err }); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { ln.Close() })
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
}

// writeManifests6 is writeManifests with dual-stack Nodes.
func (c *cluster) writeManifests6(services string) {
	var nodes strings.Builder
	for i, name := range c.order {
		fmt.Fprintf(&nodes, "---\napiVersion: v1\nkind: Node\nmetadata: {name: %s}\nspec: {podCIDRs: [10.%d.0.0/16, 'fd00:%d::/32']}\n"+
			"status: {addresses: [{type: InternalIP, address: %s}, {type: InternalIP, address: 'fd00:210::%d'}]}\n", name, i+1, i+1, c.nodes[name].ip, i+1)
	}
	for _, n := range c.nodes {
		n.manifests = filepath.Join(c.dir, n.name)
		os.MkdirAll(n.manifests, 0o755)
		os.WriteFile(filepath.Join(n.manifests, "nodes.yaml"), []byte(nodes.String()), 0o644)
		os.WriteFile(filepath.Join(n.manifests, "services.yaml"), []byte(services), 0o644)
	}
}

const dualStackServices = `apiVersion: v1
kind: Service
metadata: {name: only-b}
spec:
  type: NodePort
  clusterIP: 10.96.1.1
  clusterIPs: [10.96.1.1, 'fd00:96::1:1']
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports: [{name: http, port: 80, nodePort: 30102}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: only-b, labels: {kubernetes.io/service-name: only-b}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.2.1.2], nodeName: node-b}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: only-b-v6, labels: {kubernetes.io/service-name: only-b}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ['fd00:2:1::2'], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata: {name: local}
spec:
  type: LoadBalancer
  clusterIP: 10.96.1.2
  clusterIPs: [10.96.1.2, 'fd00:96::1:2']
  ipFamilies: [IPv4, IPv6]
  externalTrafficPolicy: Local
  healthCheckNodePort: 32101
  ports: [{name: http, port: 80, nodePort: 30101}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-v6, labels: {kubernetes.io/service-name: local}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ['fd00:2:1::2'], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata: {name: both}
spec:
  clusterIP: 10.96.1.3
  clusterIPs: [10.96.1.3, 'fd00:96::1:3']
  ipFamilies: [IPv4, IPv6]
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: both-v6, labels: {kubernetes.io/service-name: both}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ['fd00:1:1::2'], nodeName: node-a}, {addresses: ['fd00:2:1::2'], nodeName: node-b}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: both-v4, labels: {kubernetes.io/service-name: both}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.1.1.2], nodeName: node-a}, {addresses: [10.2.1.2], nodeName: node-b}]
`

// TestMultiNodeDualStack: agents in two node namespaces with dual-stack
// Services from manifests; IPv6 traffic from an external host and from pods
// crosses nodes, beside IPv4.
func TestMultiNodeDualStack(t *testing.T) {
	c := newCluster(t)
	pods := []podRef{{"node-a", "a1", 1}, {"node-b", "b1", 1}, {"node-a", "client-a", 9}}
	for _, p := range pods {
		c.addPod(p.node, p.name, p.idx)
	}
	c.enableIPv6(pods...)
	for _, p := range []struct{ node, pod string }{{"node-a", "a1"}, {"node-b", "b1"}} {
		c.serveHTTP(c.nodes[p.node].pods[p.pod], p.pod)
		c.serveHTTP6(c.nodes[p.node].pods[p.pod], p.pod)
	}
	c.writeManifests6(dualStackServices)
	c.startAgent("node-a")
	c.startAgent("node-b")
	ext := netlab.Path(c.external)
	clientA := netlab.Path(c.nodes["node-a"].pods["client-a"])

	t.Run("both families programmed on both nodes", func(t *testing.T) {
		c.waitBackends(t, "[fd00:96::1:3]:80", "fd00:1:1::2", "fd00:2:1::2")
		c.waitBackends(t, "10.96.1.3:80", "10.1.1.2", "10.2.1.2")
		list := c.natList("node-a")
		for _, want := range []string{"[fd00:210::1]:30102", "10.210.0.1:30102", "[fd00:96::1:1]:80"} {
			if !strings.Contains(list, want) {
				t.Fatalf("node-a's nat list lacks %s:\n%s", want, list)
			}
		}
	})

	t.Run("IPv6 NodePort to a backend on another node is SNATed to the node's IPv6 address", func(t *testing.T) {
		body, err := get(ext, "[fd00:210::1]:30102", "", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(body); len(f) != 2 || f[0] != "b1" || f[1] != "fd00:210::1" {
			t.Fatalf("answer %q: want b1, seeing node-a's IPv6 address (SNAT)", body)
		}
		// The IPv4 half of the same Service beside it.
		if body, err := get(ext, "10.210.0.1:30102", "", 2*time.Second); err != nil || !strings.HasPrefix(body, "b1 10.210.0.1") {
			t.Fatalf("IPv4 NodePort: %q %v", body, err)
		}
	})

	t.Run("IPv6 externalTrafficPolicy Local keeps the client's address, only where local, and its health check", func(t *testing.T) {
		body, err := get(ext, "[fd00:210::2]:30101", "", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(body); len(f) != 2 || f[1] != "fd00:210::100" {
			t.Fatalf("answer %q: want the external client's own address", body)
		}
		if _, err := get(ext, "[fd00:210::1]:30101", "", 700*time.Millisecond); err == nil {
			t.Fatal("node without a local endpoint served an externalTrafficPolicy Local service")
		}
		// The health-check NodePort answers on the nodes' IPv6 addresses.
		code := func(node string) int {
			status, _, err := fetchIn(ext, node+":32101", "", time.Second)
			if err != nil {
				t.Fatalf("health check on %s: %v", node, err)
			}
			return status
		}
		if a, b := code("[fd00:210::1]"), code("[fd00:210::2]"); a != 503 || b != 200 {
			t.Fatalf("health-check NodePort over IPv6: node-a %d (want 503), node-b %d (want 200)", a, b)
		}
	})

	t.Run("a pod reaches IPv6 ClusterIP backends on both nodes, its address kept", func(t *testing.T) {
		seen := map[string]bool{}
		for range 20 {
			body, err := get(clientA, "[fd00:96::1:3]:80", "", 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if f := strings.Fields(body); len(f) != 2 || f[1] != "fd00:1:9::2" {
				t.Fatalf("answer %q: want the pod's own IPv6 address", body)
			}
			seen[backendOf(body)] = true
		}
		if !seen["a1"] || !seen["b1"] {
			t.Fatalf("20 requests reached %v, want a1 and b1", seen)
		}
	})

	t.Run("IPv6 conntrack is listed", func(t *testing.T) {
		out, err := run2(func() error {
			return run(t.Context(), []string{"ct", "list", "--bpf-pin-dir", c.nodes["node-a"].pinDir})
		})
		if err != nil || !strings.Contains(out, "[fd00:96::1:3]:80") {
			t.Fatalf("sluice ct list on node-a: %v\n%s", err, out)
		}
	})
	if t.Failed() {
		for _, n := range c.nodes {
			logs, _ := os.ReadFile(n.log.Name())
			t.Logf("agent %s log:\n%s", n.name, logs)
		}
	}
}
