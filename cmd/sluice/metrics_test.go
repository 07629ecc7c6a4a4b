package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/netlab"
)

// The agent's /metrics carry the datapath's per-service traffic, conntrack
// flows by protocol and state, and verdicts by reason, counted from traffic
// this test sends: 5 HTTP connections to web, 7 datagrams to echo from one
// socket.
func TestMetricsFromTheDatapath(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := newDemoAgent(ctx, t)
	// backend-3 isolated by a policy that admits everyone: its rule counts.
	open := strings.Replace(policyManifests, "  - from: [{podSelector: {matchLabels: {role: friend}}}]", "  - {}", 1)
	if open == policyManifests {
		t.Fatal("test bug: the policy edit matched nothing")
	}
	if err := os.WriteFile(filepath.Join(d.manifests, "policy.yaml"), []byte(open), 0o644); err != nil {
		t.Fatal(err)
	}
	const metricsAddr = "127.0.0.1:10249"
	p := d.start(t, "--metrics-bind-address", metricsAddr, "--conntrack-scan-period", "200ms")
	defer func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", p.logs())
		}
	}()
	node, client := d.topo.ns(d.topo.node), d.pod("client")
	for range 5 {
		if _, err := get(client, "10.96.0.10:80", "", 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}

	err := netlab.Enter(client, func() error {
		c, err := net.Dial("udp4", "10.96.0.53:53")
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64)
		for i := range 7 {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := fmt.Fprintf(c, "ping %d", i); err != nil {
				return err
			}
			if _, err := c.Read(buf); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`sluice_service_new_flows_total{ip_family="IPv4",namespace="demo",port="http",service="web"} 5`,
		`sluice_all_services_new_flows_total{ip_family="IPv4"} 6`,
		`sluice_service_series 2`,
		`sluice_service_new_flows_total{ip_family="IPv4",namespace="demo",port="udp",service="echo"} 1`,
		`sluice_service_packets_total{direction="to_service",ip_family="IPv4",namespace="demo",port="udp",service="echo"} 7`,
		`sluice_service_packets_total{direction="reply",ip_family="IPv4",namespace="demo",port="udp",service="echo"} 7`,
		`sluice_conntrack_flows{protocol="udp",state="active"} 1`,
		`sluice_datapath_events_total{event="drop_malformed"} 0`,
		`sluice_policy_rule_hits_total{policy="networkpolicy demo/b3-friends-only",rule="ingress rule 0 peer 0 port 0"`,
	}
	var body string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		// Straight to backend-3: once its policy is in place, its rule counts.
		if _, err := get(client, "10.203.0.2:8080", "", 2*time.Second); err != nil {
			t.Fatal(err)
		}
		_, body, _ = fetchIn(node, metricsAddr+"/metrics", "", time.Second)
		missing := ""
		for _, w := range want {
			if !strings.Contains(body, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %s:\n%s", missing, grepLines(body, "sluice_service_", "sluice_conntrack_flows", "sluice_datapath_events"))
		}
	}
	// The default --service-metrics=active leaves out the ports that saw
	// no traffic: web's IPv6 half, and every other Service of the demo.
	if strings.Contains(body, `ip_family="IPv6",namespace="demo",port="http",service="web"`) || strings.Contains(body, `service="web-sticky"`) || strings.Contains(body, `service="empty"`) {
		t.Fatalf("series of idle service ports:\n%s", grepLines(body, "sluice_service_"))
	}
	checkDashboard(t, body)
	// Map fill, from the kernel's counts: conntrack holds the flows above,
	// an array its capacity.
	ct := regexp.MustCompile(`(?m)^sluice_map_entries\{map="sl_ct_v2"\} ([0-9]+)$`).FindStringSubmatch(body)
	if ct == nil || ct[1] == "0" || !strings.Contains(body, `sluice_map_capacity{map="sl_ct_v2"} 524288`) ||
		!strings.Contains(body, `sluice_map_entries{map="sl_config_v1"} 1`) {
		t.Fatalf("map fill:\n%s", grepLines(body, "sluice_map_"))
	}
	// Bytes are IP lengths: 7 datagrams of 6 bytes, each in 28 bytes of headers.
	if !strings.Contains(body, `sluice_service_bytes_total{direction="to_service",ip_family="IPv4",namespace="demo",port="udp",service="echo"} 238`) {
		t.Fatalf("echo's bytes:\n%s", grepLines(body, "sluice_service_bytes_total"))
	}
}

// Every metric the Grafana dashboard in deploy/grafana queries is one the
// agent exports: a dashboard that names a metric that does not exist fails
// here, not on an operator's screen.
func checkDashboard(t *testing.T, exposition string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "sluice.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	names := regexp.MustCompile(`\b(sluice|kubeproxy)_[a-z_]+`)
	queried := 0
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			for _, name := range names.FindAllString(target.Expr, -1) {
				family := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
				if !strings.Contains(exposition, "# TYPE "+family+" ") {
					t.Errorf("dashboard panel %q queries %s, which the agent does not export", p.Title, name)
				}
				queried++
			}
		}
	}
	if queried == 0 {
		t.Fatal("the dashboard queries no metric")
	}
}

// grepLines keeps the lines that start with one of prefixes.
func grepLines(text string, prefixes ...string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
