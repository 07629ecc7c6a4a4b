package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/agent"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/netlab"
)

// The custom agent serves a service from its JSON file to a pod on a real
// node: a network namespace with a client pod and a backend pod behind
// veths, the agent's programs attached, a real HTTP request to the service's
// IP answered by the backend.
func TestCustomAgentServesTheFile(t *testing.T) {
	bpftest.Require(t)
	lab := &netlab.Lab{Prefix: "slcust"}
	defer lab.Close()
	node, err := lab.Router("node")
	if err != nil {
		t.Fatal(err)
	}
	client, err := lab.Pod(node, "slwclient", "client", netip.MustParsePrefix("10.230.0.2/24"), netip.MustParseAddr("10.230.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	backend, err := lab.Pod(node, "slwbackend", "backend", netip.MustParsePrefix("10.231.0.2/24"), netip.MustParseAddr("10.231.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := netlab.Enter(netlab.Path(backend), func() (err error) { ln, err = net.Listen("tcp4", ":8080"); return err }); err != nil {
		t.Fatal(err)
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "from the backend") }))
	defer ln.Close()

	file := filepath.Join(t.TempDir(), "services.json")
	services := `[{"name": "web", "ip": "10.96.7.7", "port": 80, "protocol": "TCP", "targetPort": 8080, "backends": ["10.231.0.2"]}]`
	if err := os.WriteFile(file, []byte(services), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.NodeName, cfg.Netns, cfg.PinDir = "custom", netlab.Path(node), filepath.Join(bpftest.PinDir(t), "sluice")
	cfg.WorkloadPrefixes, cfg.NodeIPs = []string{"slw"}, []netip.Addr{netip.MustParseAddr("10.230.0.1")}
	cfg.Cgroup, cfg.HealthzBindAddress, cfg.MetricsBindAddress = "", "", "" // nothing on this machine's own namespace
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, file) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the agent: %v", err)
		}
		if err := agent.Cleanup(cfg.PinDir, cfg.Netns); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}()

	var body string
	for deadline := time.Now().Add(20 * time.Second); body != "from the backend"; time.Sleep(100 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("the agent stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("http://10.96.7.7/ from the client pod: last answer %q", body)
		}
		body = get(netlab.Path(client), "10.96.7.7:80")
	}
}

// get asks addr for / over HTTP from inside a network namespace and returns
// the body; "" when that fails.
func get(ns, addr string) string {
	var conn net.Conn
	err := netlab.Enter(ns, func() (err error) { conn, err = net.DialTimeout("tcp4", addr, time.Second); return err })
	if err != nil {
		return ""
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	io.WriteString(conn, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
	reply, _ := io.ReadAll(conn)
	if _, b, ok := strings.Cut(string(reply), "\r\n\r\n"); ok {
		return b
	}
	return ""
}

// A service the file gets wrong is refused, naming the file, the service
// and the field, before anything is attached.
func TestCustomAgentRefusesABadFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "services.json")
	bad := `[{"name": "web", "ip": "10.96.7", "port": 80, "protocol": "TCP", "targetPort": 8080}]`
	if err := os.WriteFile(file, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(context.Background(), agent.DefaultConfig(), file)
	if err == nil || !strings.Contains(err.Error(), `service "web": ip`) || !strings.Contains(err.Error(), file) {
		t.Fatalf("a bad ip: %v", err)
	}
}
