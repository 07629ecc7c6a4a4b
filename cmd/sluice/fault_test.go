package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/netlab"
)

// syncBuffer is a log sink the agent's goroutines write to while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// One fault after another while a keep-alive TCP connection and a UDP client
// with a fixed port use Services: the manifests folder disappears and comes
// back, a map pin and a link pin are removed, a Service too big for its map
// arrives, and a Service claiming another one's frontend comes and goes. The
// agent runs as its own process in the node's namespace. The traffic never
// breaks, and each fault shows in the log, the metrics and /healthz (as a
// failure while it lasts, or as a repair once mended).
func TestFaultsNeverBreakTraffic(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := newDemoAgent(ctx, t)
	topo, manifests, pinDir := d.topo, d.manifests, d.pinDir
	const healthz, metricsAddr = "127.0.0.1:10256", "127.0.0.1:10249"
	node := topo.ns(topo.node)
	agentProc := d.start(t, "--healthz-bind-address", healthz, "--metrics-bind-address", metricsAddr, "--check-interval", "200ms")
	defer func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", agentProc.logs())
		}
	}()
	within := func(what string, cond func() bool) {
		t.Helper()
		waitFor(t, 5*time.Second, what, cond, nil)
	}
	health := func() (int, map[string]any) {
		code, body, err := fetchIn(node, healthz+"/healthz", "", time.Second)
		var m map[string]any
		if err == nil {
			err = json.Unmarshal([]byte(body), &m)
		}
		if err != nil {
			return 0, nil
		}
		return code, m
	}
	metrics := func() string { _, body, _ := fetchIn(node, metricsAddr+"/metrics", "", time.Second); return body }
	natList := func() string {
		out, _ := run2(func() error { return run(ctx, []string{"nat", "list", "--bpf-pin-dir", pinDir}) })
		return out
	}
	within("agent healthy", func() bool { code, _ := health(); return code == 200 })

	client := topo.ns(topo.pods["client"])
	conn := dialKeepAlive(t, client, "10.96.0.10:80")
	var udp net.Conn
	if err := netlab.Enter(client, func() (err error) { udp, err = net.Dial("udp4", "10.96.0.53:53"); return err }); err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	traffic := func(when string) {
		t.Helper()
		if _, err := conn.get(); err != nil {
			t.Fatalf("%s: the keep-alive connection broke: %v", when, err)
		}
		udp.SetDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 512)
		if _, err := udp.Write([]byte("ping")); err != nil {
			t.Fatalf("%s: UDP: %v", when, err)
		}
		if n, err := udp.Read(buf); err != nil || !strings.Contains(string(buf[:n]), "ping") {
			t.Fatalf("%s: UDP answer %q: %v", when, buf[:n], err)
		}
	}
	traffic("before any fault")

	// 1. The manifests folder disappears, and comes back.
	if err := os.Rename(manifests, manifests+".gone"); err != nil {
		t.Fatal(err)
	}
	within("/healthz 503 naming the manifests", func() bool {
		code, body := health()
		return code == 503 && strings.Contains(fmt.Sprint(body["sourceErrors"]), "manifests")
	})
	if m := metrics(); !strings.Contains(m, `sluice_source_unreadable{source="manifests"} 1`) {
		t.Fatal("the unreadable folder is not in the metrics")
	}
	traffic("with the folder gone")
	if err := os.Rename(manifests+".gone", manifests); err != nil {
		t.Fatal(err)
	}
	within("/healthz 200 again", func() bool { code, _ := health(); return code == 200 })
	if !strings.Contains(agentProc.logs(), "manifests folder cannot be read") {
		t.Fatal("the missing folder was not logged")
	}
	traffic("with the folder back")

	// 2. A map pin is removed.
	fePin := filepath.Join(pinDir, gen.SluiceMapSlFeV1)
	if err := os.Remove(fePin); err != nil {
		t.Fatal(err)
	}
	within("the map pin restored", func() bool { _, err := os.Stat(fePin); return err == nil })
	within("the repair counted", func() bool { return strings.Contains(metrics(), "sluice_pins_repaired_total 1") })
	if !strings.Contains(agentProc.logs(), "map pins were removed") {
		t.Fatal("the removed map pin was not logged")
	}
	if _, body := health(); !strings.Contains(fmt.Sprint(body["repairs"]), gen.SluiceMapSlFeV1) {
		t.Fatalf("/healthz does not show the pin repair: %v", body)
	}
	traffic("after the map pin was repaired")

	// 3. A link pin is removed: the hook detaches, and is repaired.
	links, _ := filepath.Glob(filepath.Join(pinDir, "links", "*_ingress_slwclient*"))
	if len(links) != 1 {
		t.Fatalf("link pins of the client's interface: %v", links)
	}
	if err := os.Remove(links[0]); err != nil {
		t.Fatal(err)
	}
	within("the link pin restored", func() bool { _, err := os.Stat(links[0]); return err == nil })
	if !strings.Contains(agentProc.logs(), "attachment missing or replaced; repairing") {
		t.Fatal("the removed link was not logged")
	}
	within("the reattachment counted", func() bool { return strings.Contains(metrics(), "sluice_attachments_repaired_total 1") })
	if _, body := health(); !strings.Contains(fmt.Sprint(body["repairs"]), "slwclient") {
		t.Fatalf("/healthz does not show the reattachment: %v", body)
	}
	traffic("after the link was repaired")

	// 4. A Service too big for its map arrives: refused alone, logged and
	// counted; a Service created with it is programmed.
	var ranges strings.Builder
	for i := range 17000 {
		fmt.Fprintf(&ranges, "  - 10.%d.%d.0/24\n", i/256, i%256)
	}
	huge := `apiVersion: v1
kind: Service
metadata: {name: huge, namespace: demo}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.80
  ports: [{name: http, port: 80}]
  loadBalancerSourceRanges:
` + ranges.String() + `status: {loadBalancer: {ingress: [{ip: 203.0.113.80}]}}
---
apiVersion: v1
kind: Service
metadata: {name: small, namespace: demo}
spec: {clusterIP: 10.96.0.81, ports: [{name: http, port: 80}]}
`
	if err := os.WriteFile(filepath.Join(manifests, "huge.yaml"), []byte(huge), 0o644); err != nil {
		t.Fatal(err)
	}
	within("the oversized Service logged by name and map", func() bool {
		l := agentProc.logs()
		return strings.Contains(l, "demo/huge") && strings.Contains(l, gen.SluiceMapSlSrcrangeV1)
	})
	if !strings.Contains(metrics(), "sluice_skipped_objects_total 1") {
		t.Fatal("the oversized Service was not counted")
	}
	within("the other Service programmed", func() bool { return strings.Contains(natList(), "10.96.0.81:80") })
	traffic("with the oversized Service refused")

	// 5. A Service claiming web's ClusterIP and port comes and goes.
	twin := `apiVersion: v1
kind: Service
metadata: {name: web-twin, namespace: demo}
spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}
`
	if err := os.WriteFile(filepath.Join(manifests, "twin.yaml"), []byte(twin), 0o644); err != nil {
		t.Fatal(err)
	}
	within("the conflict logged naming both", func() bool {
		return strings.Contains(agentProc.logs(), "claimed by services demo/web:http and demo/web-twin:http")
	})
	traffic("with a conflicting Service")
	if err := os.Remove(filepath.Join(manifests, "twin.yaml")); err != nil {
		t.Fatal(err)
	}
	// A Service written after the removal: once it is programmed, so is the
	// removal.
	marker := "apiVersion: v1\nkind: Service\nmetadata: {name: marker, namespace: demo}\nspec: {clusterIP: 10.96.0.82, ports: [{name: http, port: 80}]}\n"
	if err := os.WriteFile(filepath.Join(manifests, "zz-marker.yaml"), []byte(marker), 0o644); err != nil {
		t.Fatal(err)
	}
	within("a Service written after the removal programmed", func() bool { return strings.Contains(natList(), "10.96.0.82:80") })
	traffic("after the conflicting Service went")
}

// run2 captures what fn prints.
func run2(fn func() error) (string, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return "", err
	}
	stdout := os.Stdout
	os.Stdout = w
	errc := make(chan error, 1)
	go func() { errc <- fn(); w.Close() }()
	out, _ := io.ReadAll(r)
	os.Stdout = stdout
	return string(out), <-errc
}
