package main

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-net/sluice/netlab"
)

const maglevServices = `apiVersion: v1
kind: Service
metadata: {name: spread}
spec:
  type: NodePort
  clusterIP: 10.96.1.10
  clusterIPs: [10.96.1.10, 'fd00:96::1:10']
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports: [{name: http, port: 80, nodePort: 30110}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: spread, labels: {kubernetes.io/service-name: spread}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.1.1.2], nodeName: node-a}
- {addresses: [10.1.2.2], nodeName: node-a}
- {addresses: [10.2.1.2], nodeName: node-b}
- {addresses: [10.2.2.2], nodeName: node-b}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: spread-v6, labels: {kubernetes.io/service-name: spread}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: ['fd00:1:1::2'], nodeName: node-a}
- {addresses: ['fd00:1:2::2'], nodeName: node-a}
- {addresses: ['fd00:2:1::2'], nodeName: node-b}
- {addresses: ['fd00:2:2::2'], nodeName: node-b}
`

// With --lb-algorithm=maglev, two agents pick the same backend for a flow
// from outside whichever node it reaches, in both families: the external
// client connects from one source port to node-a's NodePort, then to
// node-b's, and both answers name the same backend, for every port tried.
// (Each node lists its own pods first, so without consistent hashing they
// would agree on about a quarter of the ports: with --lb-algorithm=random
// this test fails on its first port.)
func TestMultiNodeMaglevPicksTheSameBackendOnEveryNode(t *testing.T) {
	c := newCluster(t)
	c.agentArgs = []string{"--lb-algorithm=maglev", "--maglev-table-size=4093"}
	c.frontends = 4 // the ClusterIP and the NodePort, per family
	var pods []podRef
	for node, names := range map[string][]string{"node-a": {"a1", "a2"}, "node-b": {"b1", "b2"}} {
		for i, name := range names {
			c.addPod(node, name, i+1)
			pods = append(pods, podRef{node: node, name: name, idx: i + 1})
		}
	}
	c.enableIPv6(pods...)
	for _, p := range pods {
		c.serveHTTP(c.nodes[p.node].pods[p.name], p.name)
		c.serveHTTP6(c.nodes[p.node].pods[p.name], p.name)
	}
	c.writeManifests6(maglevServices)
	c.startAgent("node-a")
	c.startAgent("node-b")
	ext := netlab.Path(c.external)
	if list := c.natList("node-a"); !strings.Contains(list, "external,maglev") {
		t.Fatalf("sluice nat list shows no Maglev NodePort:\n%s", list)
	}

	for _, fam := range []struct{ name, a, b string }{
		{"IPv4", "10.210.0.1:30110", "10.210.0.2:30110"},
		{"IPv6", "[fd00:210::1]:30110", "[fd00:210::2]:30110"},
	} {
		t.Run(fam.name, func(t *testing.T) {
			seen := map[string]int{}
			for port := 40000; port < 40040; port++ {
				var at [2]string
				for i, node := range []string{fam.a, fam.b} {
					body, err := backendFromPort(ext, node, port, 2*time.Second)
					if err != nil {
						t.Fatalf("source port %d to %s: %v", port, node, err)
					}
					at[i] = strings.Fields(body + " ?")[0]
				}
				if at[0] != at[1] {
					t.Fatalf("source port %d: node-a picked %s, node-b %s", port, at[0], at[1])
				}
				seen[at[0]]++
			}
			t.Logf("40 flows, each to both nodes: %v", seen)
			if len(seen) < 3 {
				t.Fatalf("40 flows went to %d backends only: %v", len(seen), seen)
			}
		})
	}
}

// backendFromPort sends one HTTP request to addr from the given source port
// of the namespace's address and returns the answer's body. SO_REUSEADDR:
// the port's earlier connection to the other node may be in TIME_WAIT.
func backendFromPort(ns, addr string, port int, timeout time.Duration) (string, error) {
	var body string
	err := netlab.Enter(ns, func() error {
		d := &net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{Port: port},
			Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				err := rc.Control(func(fd uintptr) {
					serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
				})
				return cmpErr(err, serr)
			}}
		conn, err := d.Dial("tcp", addr) // the family of addr
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(timeout))
		fmt.Fprintf(conn, "GET / HTTP/1.0\r\n\r\n")
		r := bufio.NewReader(conn)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return err
			}
			if line == "\r\n" {
				break
			}
		}
		rest, _ := r.ReadString('\n')
		body = strings.TrimSpace(rest)
		return nil
	})
	return body, err
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
