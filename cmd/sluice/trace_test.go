package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/netlab"
	"github.com/sluice-net/sluice/trace"
)

const traceServices = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.4.1
  ports: [{name: http, port: 80, nodePort: 30401}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.1.1.2], nodeName: node-a}]
---
apiVersion: v1
kind: Service
metadata: {name: remote, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.4.2
  ports: [{name: http, port: 80, nodePort: 30402}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: remote, namespace: default, labels: {kubernetes.io/service-name: remote}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.2.1.2], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: default}
spec:
  clusterIP: 10.96.4.3
  sessionAffinity: ClientIP
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sticky, namespace: default, labels: {kubernetes.io/service-name: sticky}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.1.1.2], nodeName: node-a}, {addresses: [10.2.1.2], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: default}
spec:
  clusterIP: 10.96.4.4
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: locked, namespace: default}
spec:
  clusterIP: 10.96.4.5
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: locked, namespace: default, labels: {kubernetes.io/service-name: locked}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.1.2.2], nodeName: node-a}]
---
apiVersion: v1
kind: Pod
metadata: {name: a2, namespace: default, labels: {app: locked}}
spec: {nodeName: node-a, containers: [{name: c, image: x}]}
status: {podIP: 10.1.2.2}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: default}
spec:
  podSelector: {matchLabels: {app: locked}}
  policyTypes: [Ingress]
`

// snapshotMaps reads every map of the set that a walk can read, as bytes.
// The IPv6 scratch is left out: it holds nothing between packets (trace
// documents it as the one live map a run may write).
func snapshotMaps(t *testing.T, set *maps.Set) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, m := range set.All() {
		if m.Type() == ebpf.RingBuf || name == gen.SluiceMapSlScratch6V1 {
			continue
		}
		var b bytes.Buffer
		key := make([]byte, m.KeySize())
		it := m.Iterate()
		if m.Type() == ebpf.PerCPUArray || m.Type() == ebpf.PerCPUHash || m.Type() == ebpf.LRUCPUHash {
			var vs [][]byte
			for it.Next(&key, &vs) {
				fmt.Fprintf(&b, "%x=%x;", key, vs)
			}
		} else {
			var v []byte
			for it.Next(&key, &v) {
				fmt.Fprintf(&b, "%x=%x;", key, v)
			}
		}
		if err := it.Err(); err != nil {
			t.Fatalf("map %s: %v", name, err)
		}
		out[name] = b.String()
	}
	return out
}

// sluice trace against real traffic, on node-a: each datapath path the
// trace reports is the one the real packet takes, and a trace leaves every
// map of the node as it was, byte for byte.
func TestTraceAgreesWithRealTraffic(t *testing.T) {
	c := newCluster(t)
	c.frontends = 8
	c.addPod("node-a", "a1", 1) // 10.1.1.2
	c.addPod("node-a", "a2", 2) // 10.1.2.2
	c.addPod("node-a", "client", 9)
	c.addPod("node-b", "b1", 1) // 10.2.1.2
	for node, name := range map[string]string{"node-a": "a1", "node-b": "b1"} {
		c.serveHTTP(c.nodes[node].pods[name], name)
	}
	c.serveHTTP(c.nodes["node-a"].pods["a2"], "a2")
	c.writeManifests(traceServices)
	c.startAgent("node-a")
	c.startAgent("node-b")
	nodeA := c.nodes["node-a"]
	set, err := maps.Open(maps.OpenOptions{PinDir: nodeA.pinDir, NoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	ext, client := netlab.Path(c.external), netlab.Path(nodeA.pods["client"])

	run := func(t *testing.T, pkt trace.Packet) *trace.Result {
		t.Helper()
		// The previous subtest's real connection may still be closing (its
		// last packets count in conntrack and the per-service counters):
		// wait until the maps are still for 300 ms, so that what changes
		// during the trace is the trace's doing.
		before := snapshotMaps(t, set)
		for deadline := time.Now().Add(10 * time.Second); ; before = snapshotMaps(t, set) {
			time.Sleep(300 * time.Millisecond)
			if fmt.Sprint(snapshotMaps(t, set)) == fmt.Sprint(before) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the node's maps never stood still for 300 ms")
			}
		}
		var r *trace.Result
		err := netlab.Enter(netlab.Path(nodeA.ns), func() (err error) { r, err = trace.Run(set, pkt); return err })
		if err != nil {
			t.Fatal(err)
		}
		after := snapshotMaps(t, set)
		for name := range before {
			if before[name] != after[name] {
				t.Errorf("the trace changed map %s:\nbefore %s\nafter  %s", name, before[name], after[name])
			}
		}
		t.Logf("trace %v -> %v on %s:\n  %s\n  verdict %s", pkt.Src, pkt.Dst, pkt.Iface, strings.Join(r.Steps, "\n  "), r.Verdict)
		return r
	}
	ap := netip.MustParseAddrPort

	t.Run("ClusterIP from a pod", func(t *testing.T) {
		r := run(t, trace.Packet{Proto: "tcp", Src: ap("10.1.9.2:40001"), Dst: ap("10.96.4.1:80"), Iface: "slw9"})
		body, err := get(client, "10.96.4.1:80", "", 2*time.Second)
		if err != nil || r.Verdict != "pass" || r.Conntrack != "miss" || r.Backend != "10.1.1.2:8080" ||
			!strings.HasPrefix(body, "a1 ") || !strings.Contains(r.Frontend, "default/web:http") {
			t.Fatalf("trace %+v; real answer %q %v", r, body, err)
		}
	})
	t.Run("NodePort to a local backend keeps the client", func(t *testing.T) {
		r := run(t, trace.Packet{Proto: "tcp", Src: ap("10.210.0.100:40002"), Dst: ap("10.210.0.1:30401"), Iface: "sldata0"})
		body, err := get(ext, "10.210.0.1:30401", "", 2*time.Second)
		if err != nil || r.Backend != "10.1.1.2:8080" || r.SNAT != "" || body != "a1 10.210.0.100" {
			t.Fatalf("trace %+v; real answer %q %v", r, body, err)
		}
	})
	t.Run("NodePort to a remote backend is SNATed", func(t *testing.T) {
		r := run(t, trace.Packet{Proto: "tcp", Src: ap("10.210.0.100:40003"), Dst: ap("10.210.0.1:30402"), Iface: "sldata0"})
		body, err := get(ext, "10.210.0.1:30402", "", 2*time.Second)
		if err != nil || r.Backend != "10.2.1.2:8080" || !strings.HasPrefix(r.SNAT, "10.210.0.1:") || body != "b1 10.210.0.1" ||
			!strings.HasPrefix(r.Output, "tcp "+r.SNAT+" -> 10.2.1.2:8080") {
			t.Fatalf("trace %+v; real answer %q %v", r, body, err)
		}
	})
	t.Run("session affinity keeps the client's backend", func(t *testing.T) {
		body, err := get(client, "10.96.4.3:80", "", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"a1": "10.1.1.2:8080", "b1": "10.2.1.2:8080"}[backendOf(body)]
		r := run(t, trace.Packet{Proto: "tcp", Src: ap("10.1.9.2:40004"), Dst: ap("10.96.4.3:80"), Iface: "slw9"})
		if r.Backend != want || !strings.Contains(r.Why, "kept") {
			t.Fatalf("trace %+v; the real connection went to %s", r, body)
		}
	})
	t.Run("no endpoints: a reset", func(t *testing.T) {
		r := run(t, trace.Packet{Proto: "tcp", Src: ap("10.1.9.2:40005"), Dst: ap("10.96.4.4:80"), Iface: "slw9"})
		_, err := get(client, "10.96.4.4:80", "", 2*time.Second)
		if err == nil || !strings.Contains(err.Error(), "refused") || r.Verdict != "redirect" ||
			!strings.Contains(r.Output, "RST") || r.Counters["reject_no_endpoints"] != 1 {
			t.Fatalf("trace %+v; real connection: %v", r, err)
		}
	})
	t.Run("a policy's deny, with its rule", func(t *testing.T) {
		r := run(t, trace.Packet{Proto: "tcp", Src: ap("10.1.9.2:40006"), Dst: ap("10.1.2.2:8080"), Iface: "slw2", Egress: true})
		_, err := get(client, "10.96.4.5:80", "", 700*time.Millisecond)
		if err == nil || r.Verdict != "drop" || !strings.HasPrefix(r.Policy, "denied by rule ") {
			t.Fatalf("trace %+v; real connection: %v", r, err)
		}
	})
	t.Run("an established connection hits its entry", func(t *testing.T) {
		var conn net.Conn
		// No keep-alive probes: one sent while the trace runs (a trace
		// takes seconds, copying the conntrack table) would move the
		// entry's last_seen, as if the trace had.
		dialer := net.Dialer{Timeout: 2 * time.Second, KeepAlive: -1}
		if err := netlab.Enter(client, func() (err error) { conn, err = dialer.Dial("tcp4", "10.96.4.1:80"); return err }); err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		local := conn.LocalAddr().String()
		r := run(t, trace.Packet{Proto: "tcp", Src: ap(local), Dst: ap("10.96.4.1:80"), TCPFlags: "ack", Iface: "slw9"})
		// Its backend is a pod of this node: the packet is handed to the
		// backend's interface (local delivery).
		if !strings.HasPrefix(r.Conntrack, "hit: the flow") || r.Verdict != "redirect" || r.Counters["local_delivered"] != 1 ||
			!strings.Contains(r.Output, "-> 10.1.1.2:8080") || len(r.Flows) != 0 {
			t.Fatalf("trace %+v", r)
		}
	})
}

// sluice trace refuses a packet it cannot describe, naming what is wrong.
func TestTraceArguments(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"tcp", "10.0.0.1:1"}, "usage: sluice trace"},
		{[]string{"tcp", "10.0.0.1:1", "to", "10.0.0.2:80"}, "usage: sluice trace"},
		{[]string{"tcp", "10.0.0.1", "->", "10.0.0.2:80", "--iface", "eth0"}, `source "10.0.0.1"`},
		{[]string{"tcp", "10.0.0.1:1", "->", "10.0.0.2:80"}, "--iface is required"},
		{[]string{"tcp", "10.0.0.1:1", "->", "10.0.0.2:80", "--iface", "eth0", "--direction", "up"}, `--direction "up"`},
	} {
		err := run(context.Background(), append([]string{"trace"}, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error with %q", c.args, err, c.want)
		}
	}
}
