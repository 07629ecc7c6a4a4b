package main

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/netlab"
)

const monitorServices = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.3.1
  ports: [{name: http, port: 80, nodePort: 30301}]
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
metadata: {name: elsewhere, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.3.2
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, nodePort: 30302}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: elsewhere, namespace: default, labels: {kubernetes.io/service-name: elsewhere}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.2.1.2], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata: {name: locked, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.3.3
  ports: [{name: http, port: 80, nodePort: 30303}]
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

// sluice monitor on a node whose agent writes flow events: a connection
// through a NodePort shows its start (with its backend) and its end; a
// NodePort with externalTrafficPolicy Local and no local endpoint, its drop
// with the reason; a pod whose NetworkPolicy denies everything, the flow's
// start and the policy's drop with its rule.
func TestMonitorShowsFlowsAndDrops(t *testing.T) {
	c := newClusterOf(t, "node-a")
	c.agentArgs = []string{"--flow-events"}
	c.frontends = 6
	c.addPod("node-a", "a1", 1) // 10.1.1.2
	c.addPod("node-a", "a2", 2) // 10.1.2.2
	c.serveHTTP(c.nodes["node-a"].pods["a1"], "a1")
	c.serveHTTP(c.nodes["node-a"].pods["a2"], "a2")
	c.writeManifests(monitorServices)
	c.startAgent("node-a")
	ext := netlab.Path(c.external)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	outc := make(chan string, 1)
	go func() {
		out, err := run2(func() error {
			return run(ctx, []string{"monitor", "--bpf-pin-dir", c.nodes["node-a"].pinDir, "--json", "--count", "5"})
		})
		if err != nil {
			out += "\nerror: " + err.Error()
		}
		outc <- out
	}()
	time.Sleep(200 * time.Millisecond) // the reader open
	if body, err := get(ext, "10.210.0.1:30301", "", 2*time.Second); err != nil || !strings.HasPrefix(body, "a1 ") {
		t.Fatalf("web: %q %v", body, err)
	}
	if _, err := get(ext, "10.210.0.1:30302", "", 700*time.Millisecond); err == nil {
		t.Fatal("a NodePort with traffic policy Local and no local endpoint answered")
	}
	if _, err := get(ext, "10.210.0.1:30303", "", 700*time.Millisecond); err == nil {
		t.Fatal("a pod whose policy denies everything answered")
	}
	var out string
	select {
	case out = <-outc:
	case <-ctx.Done():
		t.Fatal("sluice monitor did not print 5 events")
	}

	t.Logf("sluice monitor --json:\n%s", out)
	type ev struct {
		Type, Reason, Service, Src, Dst, Backend, Hook string
		RuleID                                         uint32
	}
	var evs []ev
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var e ev
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("monitor printed %q: %v\n%s", sc.Text(), err, out)
		}
		evs = append(evs, e)
	}
	has := func(what string, match func(ev) bool) {
		t.Helper()
		for _, e := range evs {
			if match(e) {
				return
			}
		}
		t.Errorf("no %s among the events:\n%s", what, out)
	}
	has("start of the web flow", func(e ev) bool {
		return e.Type == "flow-start" && e.Service == "default/web:http" && e.Backend == "10.1.1.2:8080" &&
			strings.HasPrefix(e.Src, "10.210.0.100:") && e.Dst == "10.210.0.1:30301" && e.Hook == "from_host"
	})
	has("end of the web flow", func(e ev) bool { return e.Type == "flow-end" && e.Service == "default/web:http" })
	has("drop for no local endpoint", func(e ev) bool {
		return e.Type == "drop" && e.Reason == "drop_no_local_backend" && e.Dst == "10.210.0.1:30302"
	})
	has("policy drop with its rule", func(e ev) bool {
		return e.Type == "drop" && e.Reason == "drop_policy" && e.Dst == "10.1.2.2:8080" && e.Hook == "to_wl" && e.RuleID != 0
	})
}
