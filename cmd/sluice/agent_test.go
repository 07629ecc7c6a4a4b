package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/sluice-net/sluice/agent"
	"github.com/sluice-net/sluice/examples"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
	"github.com/sluice-net/sluice/netlab"
)

func TestConfigFileAndFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte("min-sync-period: 5s\nnodeport-addresses: [10.0.0.0/8, 192.168.0.0/16]\nbpf-pin-dir: /x\n"), 0o600)
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	var cfg agent.Config
	agentFlags(fs, &cfg)
	if err := fs.Parse([]string{"--bpf-pin-dir=/from-flag"}); err != nil {
		t.Fatal(err)
	}
	if _, err := applyConfigFile(fs, path); err != nil {
		t.Fatal(err)
	}
	if cfg.MinSyncPeriod != 5*time.Second || len(cfg.NodePortAddresses) != 2 || cfg.PinDir != "/from-flag" {
		t.Fatalf("config %+v: file values apply, flags win", cfg)
	}
	os.WriteFile(path, []byte("no-such-flag: 1\n"), 0o600)
	if _, err := applyConfigFile(fs, path); err == nil || !strings.Contains(err.Error(), `unknown key "no-such-flag"`) {
		t.Fatalf("unknown key: %v", err)
	}
}

func TestStartupErrorsSayWhatToDo(t *testing.T) {
	bpftest.Require(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	_, err := agent.Start(context.Background(), agent.Config{PinDir: t.TempDir()}, log)
	if err == nil || !strings.Contains(err.Error(), "--manifests DIR") {
		t.Fatalf("no source: %v", err)
	}
	pins := t.TempDir()
	_, err = agent.Start(context.Background(), agent.Config{Manifests: filepath.Join(t.TempDir(), "gone"), PinDir: pins}, log)
	if err == nil || !strings.Contains(err.Error(), "--manifests") {
		t.Fatalf("missing manifests folder: %v", err)
	}
	if entries, _ := os.ReadDir(pins); len(entries) != 0 {
		t.Fatalf("a refused start left %d pins behind", len(entries))
	}
	_, err = agent.Start(context.Background(), agent.Config{Manifests: t.TempDir(), Cgroup: t.TempDir(), PinDir: t.TempDir()}, log)
	if err == nil || !strings.Contains(err.Error(), "not a cgroup v2 directory") {
		t.Fatalf("bad cgroup: %v", err)
	}
	_, err = agent.Start(context.Background(), agent.Config{Manifests: t.TempDir(), PinDir: t.TempDir(), XDPAcceleration: "fast"}, log)
	if err == nil || !strings.Contains(err.Error(), `--xdp-acceleration "fast": want disabled, native or best-effort`) {
		t.Fatalf("bad --xdp-acceleration: %v", err)
	}
	dir := bpftest.PinDir(t)
	old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.Pin(filepath.Join(dir, "sl_fe_v0")); err != nil {
		t.Fatal(err)
	}
	_, err = agent.Start(context.Background(), agent.Config{Manifests: t.TempDir(), PinDir: dir}, log)
	if err == nil || !strings.Contains(err.Error(), "older layout") || !strings.Contains(err.Error(), "sluice cleanup") {
		t.Fatalf("old pins: %v", err)
	}
}

// demoAgentSetup builds the demo topology with its backends serving, copies the
// example manifests to a folder, and returns an agent configuration for it.
func demoAgentSetup(ctx context.Context, t *testing.T) (*demoTopology, agent.Config, string) {
	bpftest.Require(t)
	topo := &demoTopology{Lab: netlab.Lab{Prefix: bpftest.UniqueName("slag")}}
	t.Cleanup(topo.Close)
	if err := topo.build(); err != nil {
		t.Fatal(err)
	}
	if err := topo.serveBackends(ctx); err != nil {
		t.Fatal(err)
	}
	manifests := t.TempDir()
	if err := os.CopyFS(manifests, examples.Manifests); err != nil {
		t.Fatal(err)
	}
	cfg := agent.Config{Manifests: manifests, NodeName: "sluice-demo", PinDir: filepath.Join(bpftest.PinDir(t), "sluice"),
		Netns: topo.ns(topo.node), WorkloadPrefixes: []string{"slw"}, DataIfaces: "^sldata",
		MinSyncPeriod: 50 * time.Millisecond, SyncPeriod: 30 * time.Second}
	return topo, cfg, manifests
}

// keepAlive is an HTTP/1.1 connection made inside a namespace.
type keepAlive struct {
	c net.Conn
	r *bufio.Reader
}

func dialKeepAlive(t *testing.T, ns, addr string) *keepAlive {
	var c net.Conn
	if err := netlab.Enter(ns, func() (err error) { c, err = net.DialTimeout("tcp", addr, 2*time.Second); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &keepAlive{c: c, r: bufio.NewReader(c)}
}

func (k *keepAlive) get() (string, error) {
	k.c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(k.c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(k.r, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return backendOf(string(b)), err
}

func progIDs(t *testing.T, ns, iface string) []ebpf.ProgramID {
	var ids []ebpf.ProgramID
	err := netlab.Enter(ns, func() error {
		ifc, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: ifc.Index, Attach: ebpf.AttachTCXIngress})
		for _, p := range res.Programs {
			ids = append(ids, p.ID)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// The agent stops, and traffic keeps flowing from the pins: an open connection
// and new ones. It starts again and adopts what is there: the same programs
// stay attached and the open connection never notices. Cleanup removes it all.
func TestAgentRestartKeepsTrafficFlowing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	topo, cfg, _ := demoAgentSetup(ctx, t)
	pinDir, node := cfg.PinDir, cfg.Netns
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func() (*agent.Agent, context.CancelFunc) {
		actx, stop := context.WithCancel(ctx)
		a, err := agent.Start(actx, cfg, log)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, "agent ready", a.Ready)
		return a, stop
	}

	a, stop := start()
	conn := dialKeepAlive(t, topo.ns(topo.pods["client"]), "10.96.0.10:80")
	first, err := conn.get()
	if err != nil {
		t.Fatal(err)
	}
	before := progIDs(t, node, "slwclient")

	stop()
	a.Close() // the agent is gone; its pins are not
	if got, err := conn.get(); err != nil || got != first {
		t.Fatalf("open connection with the agent stopped: %q %v (was %q)", got, err, first)
	}
	if _, err := get(topo.ns(topo.pods["client"]), "10.96.0.10:80", "", 2*time.Second); err != nil {
		t.Fatalf("new connection with the agent stopped: %v", err)
	}
	set, err := maps.Open(maps.OpenOptions{PinDir: pinDir, NoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	fes, err := nat.ReadFrontends(set)
	set.Close()
	if err != nil || !slices.ContainsFunc(fes, func(f nat.Frontend) bool { return f.Service == "demo/web:http" }) {
		t.Fatalf("inspection with the agent stopped: %v %v", fes, err)
	}

	a, stop = start()
	if got, err := conn.get(); err != nil || got != first {
		t.Fatalf("open connection after the restart: %q %v", got, err)
	}
	if after := progIDs(t, node, "slwclient"); !slices.Equal(after, before) {
		t.Fatalf("restart replaced the attached programs: %v -> %v", before, after)
	}
	stop()
	a.Close()

	if err := agent.Cleanup(pinDir, node); err != nil {
		t.Fatal(err)
	}
	if ids := progIDs(t, node, "slwclient"); len(ids) != 0 {
		t.Fatalf("programs left after cleanup: %v", ids)
	}
	if _, err := os.Stat(pinDir); !os.IsNotExist(err) {
		entries, _ := os.ReadDir(pinDir)
		t.Fatalf("pin directory left after cleanup (%v): %v", err, entries)
	}
}

const policyManifests = `apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: demo, labels: {role: client}}
spec: {nodeName: sluice-demo, containers: [{name: c, image: x}]}
status: {podIP: 10.200.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: backend-3, namespace: demo, labels: {app: b3}}
spec: {nodeName: sluice-demo, containers: [{name: c, image: x}]}
status: {podIP: 10.203.0.2}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b3-friends-only, namespace: demo}
spec:
  podSelector: {matchLabels: {app: b3}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: friend}}}]
`

// NetworkPolicies from the manifest folder reach the datapath through the
// agent: backend-3 admits only "friend" pods, so the client is refused there
// and still reaches the others; relabelling the client lets it in.
func TestAgentEnforcesNetworkPolicy(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	topo, cfg, manifests := demoAgentSetup(ctx, t)
	os.WriteFile(filepath.Join(manifests, "policy.yaml"), []byte(policyManifests), 0o644)
	a, err := agent.Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	client := topo.ns(topo.pods["client"])
	waitFor(t, 10*time.Second, "the NetworkPolicy takes effect", func() bool { return !reaches(client, "10.203.0.2:8080") }, nil)
	if _, err := get(client, "10.201.0.2:8080", "", time.Second); err != nil {
		t.Fatalf("a backend without policy refused the client: %v", err)
	}
	// The CLI sees the policy and its counters from the pins, and so do the
	// other inspection commands, as tables and as JSON.
	for _, cmd := range [][]string{{"policy", "list"}, {"nat", "list"}, {"iface", "list"}, {"maps"}} {
		for _, format := range [][]string{nil, {"--json"}} {
			args := append(append(slices.Clip(cmd), format...), "--bpf-pin-dir", cfg.PinDir)
			if err := run(ctx, args); err != nil {
				t.Fatalf("sluice %s: %v", strings.Join(args, " "), err)
			}
		}
	}
	os.WriteFile(filepath.Join(manifests, "policy.yaml"), []byte(strings.Replace(policyManifests, "role: client", "role: friend", 1)), 0o644)
	waitFor(t, 10*time.Second, "the relabelled client is admitted", func() bool { return reaches(client, "10.203.0.2:8080") }, nil)
}

// kube-proxy's --cluster-cidr and --masquerade-all through the agent, seen from
// the backends: with the cluster CIDR set, a pod keeps its address and a
// client outside the CIDR reaching a ClusterIP arrives as the node IP; with
// masquerade-all, everyone does.
func TestAgentClusterCIDRAndMasqueradeAll(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	topo, cfg, _ := demoAgentSetup(ctx, t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	run := func(cfg agent.Config) {
		actx, stop := context.WithCancel(ctx)
		a, err := agent.Start(actx, cfg, log)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { stop(); a.Close() }()
		eventually(t, "agent ready", a.Ready)
		for _, c := range []struct{ from, want string }{
			{"client", "saw client 10.200.0.2:"},
			{"external", "saw client 10.210.0.2:"},
		} {
			if cfg.MasqueradeAll || (c.from == "external" && cfg.ClusterCIDR.IsValid()) {
				c.want = "saw client 10.210.0.1:" // the node IP
			}
			body, err := get(topo.ns(topo.pods[c.from]), "10.96.0.10:80", "", 2*time.Second)
			if err != nil || !strings.Contains(body, c.want) {
				t.Fatalf("masquerade-all=%v cluster-cidr=%v: %s -> ClusterIP: %q %v, want %q",
					cfg.MasqueradeAll, cfg.ClusterCIDR, c.from, body, err, c.want)
			}
		}
	}
	run(cfg)
	cfg.ClusterCIDR = netip.MustParsePrefix("10.200.0.0/14")
	run(cfg)
	cfg.MasqueradeAll = true
	run(cfg)
	if err := agent.Cleanup(cfg.PinDir, cfg.Netns); err != nil {
		t.Fatal(err)
	}
}

// The agent's metrics endpoint exports the datapath's counters by name and
// the conntrack fill: a connection to a Service without endpoints shows as a
// reject.
func TestAgentExportsDatapathMetrics(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	topo, cfg, _ := demoAgentSetup(ctx, t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.MetricsBindAddress = ln.Addr().String()
	ln.Close()
	cfg.ConntrackScanPeriod = 100 * time.Millisecond
	cfg.Profiling = true
	a, err := agent.Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	eventually(t, "agent ready", a.Ready)
	err = netlab.Enter(topo.ns(topo.pods["client"]), func() error {
		c, err := net.DialTimeout("tcp4", "10.96.0.99:80", 2*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("connect to a Service without endpoints: %v", err)
	}
	scrape := func() string {
		resp, err := http.Get("http://" + cfg.MetricsBindAddress + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	// Go's heap profile, with --profiling (kube-proxy's enableProfiling).
	if resp, err := http.Get("http://" + cfg.MetricsBindAddress + "/debug/pprof/heap"); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(b) == 0 {
			t.Fatalf("/debug/pprof/heap: %d, %d bytes", resp.StatusCode, len(b))
		}
	}
	// kube-proxy's /proxyMode, beside the metrics.
	if resp, err := http.Get("http://" + cfg.MetricsBindAddress + "/proxyMode"); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(b) != agent.ProxyMode {
			t.Fatalf("/proxyMode: %d %q, want 200 %q", resp.StatusCode, b, agent.ProxyMode)
		}
	}
	var body string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if body = scrape(); strings.Contains(body, `sluice_conntrack_capacity{map="sl_ct_v2"} 524288`) {
			break
		}
	}
	for _, want := range []string{`sluice_datapath_events_total{event="reject_no_endpoints"} 1`,
		`sluice_datapath_events_total{event="drop_ct_full"} 0`, `sluice_conntrack_capacity{map="sl_ct_v2"} 524288`,
		`sluice_conntrack_capacity{map="sl_ct6_v1"} 524288`, `sluice_conntrack_entries{map="sl_ct_v2"} `, `sluice_conntrack_entries{map="sl_ct6_v1"} `} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// The kernel memory of each map: the demo node has IPv6, so its IPv6
	// conntrack table is full size, over 100 MiB.
	kernel := regexp.MustCompile(`(?m)^sluice_map_kernel_bytes\{map="sl_ct6_v1"\} ([0-9.e+]+)$`).FindStringSubmatch(body)
	if kernel == nil {
		t.Fatalf("no kernel memory of sl_ct6_v1:\n%s", grepLines(body, "sluice_map_kernel_bytes"))
	}
	if n, err := strconv.ParseFloat(kernel[1], 64); err != nil || n < 100<<20 {
		t.Errorf("sl_ct6_v1 holds %s bytes of kernel memory, want a full-size table", kernel[1])
	}
}
