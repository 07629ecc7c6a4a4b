package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-net/sluice/agent"
	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/examples"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
	"github.com/sluice-net/sluice/netlab"
	"golang.org/x/sys/unix"
)

// demoTopology: a node namespace; a client pod and three backend pods behind
// veths (workload interfaces "slw*"); an external host on the node's data
// interface "sldata0". Dual-stack: each link also has an IPv6 /64,
// fd00:2XX::/64 for the IPv4 10.2XX.0.0/24. Addresses match
// examples/demo.yaml.
type demoTopology struct {
	netlab.Lab
	node string
	pods map[string]string // role -> namespace
}

func (t *demoTopology) ns(name string) string { return netlab.Path(name) }

func (t *demoTopology) build() error {
	var err error
	if t.node, err = t.Router("node"); err != nil {
		return fmt.Errorf("%w (is iproute2 installed and are you root?)", err)
	}
	t.pods = map[string]string{}
	pods := []struct{ role, nodeIf, addr, gw, net6 string }{
		{"client", "slwclient", "10.200.0.2/24", "10.200.0.1", "fd00:200::"},
		{"backend-1", "slwb1", "10.201.0.2/24", "10.201.0.1", "fd00:201::"},
		{"backend-2", "slwb2", "10.202.0.2/24", "10.202.0.1", "fd00:202::"},
		{"backend-3", "slwb3", "10.203.0.2/24", "10.203.0.1", "fd00:203::"},
		{"external", "sldata0", "10.210.0.2/24", "10.210.0.1", "fd00:210::"},
	}
	if _, err := netlab.IP("netns", "exec", t.node, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"); err != nil {
		return err
	}
	for _, p := range pods {
		ns, err := t.Pod(t.node, p.nodeIf, p.role, netip.MustParsePrefix(p.addr), netip.MustParseAddr(p.gw))
		if err != nil {
			return err
		}
		t.pods[p.role] = ns
		for _, cmd := range [][]string{
			{"-n", t.node, "addr", "add", p.net6 + "1/64", "dev", p.nodeIf, "nodad"},
			{"-n", ns, "addr", "add", p.net6 + "2/64", "dev", "eth0", "nodad"},
			{"-n", ns, "-6", "route", "add", "default", "via", p.net6 + "1"},
		} {
			if _, err := netlab.IP(cmd...); err != nil {
				return err
			}
		}
	}
	// A second address outside the LoadBalancer's source ranges.
	_, err = netlab.IP("-n", t.pods["external"], "addr", "add", "10.210.0.3/24", "dev", "eth0")
	return err
}

// serveBackends starts an HTTP server on :8080 in each backend pod, and a UDP
// echo on :5353 in backend-3.
func (t *demoTopology) serveBackends(ctx context.Context) error {
	for _, role := range []string{"backend-1", "backend-2", "backend-3"} {
		var ln net.Listener
		// "tcp": one dual-stack socket answers both families.
		if err := netlab.Enter(t.ns(t.pods[role]), func() (err error) { ln, err = net.Listen("tcp", ":8080"); return err }); err != nil {
			return err
		}
		srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s (saw client %s)\n", role, r.RemoteAddr)
		})}
		go srv.Serve(ln)
		context.AfterFunc(ctx, func() { srv.Close() })
		t.Defer(func() { srv.Close() })
	}
	var pc net.PacketConn
	if err := netlab.Enter(t.ns(t.pods["backend-3"]), func() (err error) { pc, err = net.ListenPacket("udp4", ":5353"); return err }); err != nil {
		return err
	}
	t.Defer(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(append([]byte("backend-3 echoes "), buf[:n]...), from)
		}
	}()
	return nil
}

// get fetches http://addr/ (or addr "host:port/path") from a namespace over a
// new connection, optionally from a given source address, and fails unless
// the answer is 200.
func get(ns, addr, source string, timeout time.Duration) (string, error) {
	code, body, err := fetchIn(ns, addr, source, timeout)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("%s: %d %s", addr, code, http.StatusText(code))
	}
	return body, err
}

// fetchIn fetches http://addr/ (or addr "host:port/path") from a namespace
// and returns the status and body. The socket is created on the thread that
// entered the namespace (net/http's transport would dial from another
// goroutine, and so from another namespace), then HTTP/1.0 is spoken over it.
func fetchIn(ns, addr, source string, timeout time.Duration) (int, string, error) {
	var body string
	var code int
	path := "/"
	if i := strings.Index(addr, "/"); i >= 0 {
		addr, path = addr[:i], addr[i:]
	}
	err := netlab.Enter(ns, func() error {
		d := &net.Dialer{Timeout: timeout}
		if source != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
		}
		c, err := d.Dial("tcp", addr) // the family of addr
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		if _, err := fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		code, body = resp.StatusCode, strings.TrimSpace(string(b))
		return err
	})
	return code, body, err
}

func backendOf(body string) string { return strings.Fields(body + " ?")[0] }

func runDemo(ctx context.Context, args []string) (err error) {
	if len(args) > 0 {
		return usageOr("sluice demo\n\nBuilds a node, pods and an external host in network namespaces, runs the agent on the\n"+
			"example manifests, sends traffic to each kind of Service, and removes what it made. Root only.", args)
	}
	start := time.Now()
	if err := agent.CheckPrivileges(); err != nil {
		return err
	}
	topo := &demoTopology{Lab: netlab.Lab{Prefix: fmt.Sprintf("sluice-demo-%d", os.Getpid())}}
	defer func() {
		topo.Close()
		fmt.Printf("\nremoved the demo's namespaces, programs and pins (%.1fs in all)\n", time.Since(start).Seconds())
	}()
	step := func(format string, a ...any) { fmt.Printf("\n== "+format+"\n", a...) }

	step("building the topology: a node, a client pod, three backend pods, an external host")
	if err := topo.build(); err != nil {
		return err
	}
	if err := topo.serveBackends(ctx); err != nil {
		return err
	}

	// A private bpffs, so the demo never touches a real agent's pins.
	pinDir, err := os.MkdirTemp("", "sluice-demo-bpffs-")
	if err != nil {
		return err
	}
	if err := unix.Mount("bpffs", pinDir, "bpf", 0, ""); err != nil {
		return fmt.Errorf("mount bpffs: %w", err)
	}
	topo.Defer(func() { _ = unix.Unmount(pinDir, unix.MNT_DETACH); _ = os.Remove(pinDir) })
	manifests, err := os.MkdirTemp("", "sluice-demo-manifests-")
	if err != nil {
		return err
	}
	topo.Defer(func() { os.RemoveAll(manifests) })
	if err := os.CopyFS(manifests, examples.Manifests); err != nil {
		return err
	}
	names, _ := fs.Glob(examples.Manifests, "*.yaml")

	step("starting the agent in-process on the example manifests (%s)", strings.Join(names, ", "))
	agentCtx, stopAgent := context.WithCancel(ctx)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := agent.Start(agentCtx, agent.Config{
		Manifests: manifests, NodeName: "sluice-demo", PinDir: filepath.Join(pinDir, "sluice"),
		Netns: topo.ns(topo.node), WorkloadPrefixes: []string{"slw"}, DataIfaces: "^sldata",
		MinSyncPeriod: 100 * time.Millisecond, SyncPeriod: 30 * time.Second, ConntrackScanPeriod: 10 * time.Second,
	}, log)
	if err != nil {
		stopAgent()
		return err
	}
	topo.Defer(func() {
		stopAgent()
		a.Close()
		_ = agent.Cleanup(filepath.Join(pinDir, "sluice"), topo.ns(topo.node))
	})
	for deadline := time.Now().Add(15 * time.Second); !a.Ready(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New("the agent did not become ready within 15 s")
		}
	}
	for _, s := range a.Interfaces() {
		fmt.Printf("   %-10s %-8s programs %v\n", s.Name, s.Class, s.Hooks)
	}

	client, external := topo.ns(topo.pods["client"]), topo.ns(topo.pods["external"])
	check := func(cond bool, format string, a ...any) error {
		if !cond {
			return fmt.Errorf("demo step failed: "+format, a...)
		}
		return nil
	}
	distribution := func(ns, addr, source string, n int) (map[string]int, error) {
		hits := map[string]int{}
		for range n {
			body, err := get(ns, addr, source, 2*time.Second)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", addr, err)
			}
			hits[backendOf(body)]++
		}
		return hits, nil
	}
	show := func(hits map[string]int) {
		keys := make([]string, 0, len(hits))
		for k := range hits {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Printf("   %-10s %3d %s\n", k, hits[k], strings.Repeat("#", hits[k]))
		}
	}

	step("ClusterIP: 30 requests from the client pod to 10.96.0.10:80 (service demo/web)")
	hits, err := distribution(client, "10.96.0.10:80", "", 30)
	if err != nil {
		return err
	}
	show(hits)
	if err := check(len(hits) == 3, "30 requests reached %d backends, want all 3", len(hits)); err != nil {
		return err
	}

	step("NodePort: 12 requests from the external host to the node, 10.210.0.1:30080")
	hits, err = distribution(external, "10.210.0.1:30080", "", 12)
	if err != nil {
		return err
	}
	show(hits)
	body, _ := get(external, "10.210.0.1:30080", "", 2*time.Second)
	fmt.Printf("   a backend answers: %q (the external client's address is kept: backends are local)\n", body)

	step("IPv6: the same Service's IPv6 half, [fd00:96::10]:80 from the client pod and [fd00:210::1]:30080 from outside")
	hits, err = distribution(client, "[fd00:96::10]:80", "", 30)
	if err != nil {
		return err
	}
	show(hits)
	if err := check(len(hits) == 3, "30 IPv6 requests reached %d backends, want all 3", len(hits)); err != nil {
		return err
	}
	body, err = get(external, "[fd00:210::1]:30080", "", 2*time.Second)
	if err := check(err == nil && strings.Contains(body, "fd00:210::2"), "IPv6 NodePort: %q %v", body, err); err != nil {
		return err
	}
	fmt.Printf("   a backend answers: %q (over IPv6, the client's address kept)\n", body)

	step("LoadBalancer IP 203.0.113.10 with loadBalancerSourceRanges [10.210.0.2/32]")
	body, err = get(external, "203.0.113.10:80", "10.210.0.2", 2*time.Second)
	if err := check(err == nil, "allowed source 10.210.0.2 got %v", err); err != nil {
		return err
	}
	fmt.Printf("   from 10.210.0.2 (allowed): %s\n", backendOf(body))
	_, err = get(external, "203.0.113.10:80", "10.210.0.3", time.Second)
	if err := check(err != nil, "source 10.210.0.3 outside the ranges was let through"); err != nil {
		return err
	}
	fmt.Println("   from 10.210.0.3 (not in the ranges): dropped, as kube-proxy does")

	step("session affinity: 10 requests from the client pod to 10.96.0.12:80 (ClientIP)")
	hits, err = distribution(client, "10.96.0.12:80", "", 10)
	if err != nil {
		return err
	}
	show(hits)
	if err := check(len(hits) == 1, "affinity broken: %v", hits); err != nil {
		return err
	}

	step("UDP: 3 datagrams from the client pod to 10.96.0.53:53")
	err = netlab.Enter(client, func() error {
		c, err := net.Dial("udp4", "10.96.0.53:53")
		if err != nil {
			return err
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for i := range 3 {
			fmt.Fprintf(c, "query-%d", i)
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 512)
			n, err := r.Read(buf)
			if err != nil {
				return fmt.Errorf("UDP reply %d: %w", i, err)
			}
			fmt.Printf("   reply from %s: %q\n", c.RemoteAddr(), buf[:n])
		}
		return nil
	})
	if err != nil {
		return err
	}

	step("a service without endpoints (10.96.0.99:80) refuses at once")
	t0 := time.Now()
	_, err = get(client, "10.96.0.99:80", "", 3*time.Second)
	refused := errors.Is(err, syscall.ECONNREFUSED)
	if err := check(refused, "want connection refused, got %v", err); err != nil {
		return err
	}
	fmt.Printf("   connection refused after %v (a TCP RST from the datapath)\n", time.Since(t0).Round(time.Microsecond))

	step("what the maps hold (sluice nat list)")
	fes, err := nat.ReadFrontends(a.Maps())
	if err != nil {
		return err
	}
	printFrontends(fes)
	ct, err := maps.Conntrack.In(a.Maps())
	if err != nil {
		return err
	}
	ct6, err := maps.Conntrack6.In(a.Maps())
	if err != nil {
		return err
	}
	flows, err := conntrack.ListFlows(ct, ct6, conntrack.Monotonic())
	if err != nil {
		return err
	}
	fmt.Printf("\n   %d flows in conntrack, for example:\n", len(flows))
	for _, f := range flows[:min(3, len(flows))] {
		fmt.Println("   " + f.String())
	}
	fmt.Printf("\nall demo steps passed in %.1fs\n", time.Since(start).Seconds())
	return nil
}
