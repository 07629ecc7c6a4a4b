package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// b2AdmitsClients gives backend-2 a policy of its own (clients only), so two
// interfaces hold different policies in different slots.
const b2AdmitsClients = `---
apiVersion: v1
kind: Pod
metadata: {name: backend-2, namespace: demo, labels: {app: b2}}
spec: {nodeName: sluice-demo, containers: [{name: c, image: x}]}
status: {podIP: 10.202.0.2}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b2-clients, namespace: demo}
spec:
  podSelector: {matchLabels: {app: b2}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
`

// An agent restarted under live policy traffic takes over the policy slots
// the interfaces use: no packet is judged by another interface's policy
// meanwhile, and policies that did not change are kept, not loaded again.
func TestPolicyRestartKeepsSlots(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := newDemoAgent(ctx, t)
	if err := os.WriteFile(filepath.Join(d.manifests, "policy.yaml"), []byte(policyManifests+b2AdmitsClients), 0o644); err != nil {
		t.Fatal(err)
	}
	client := d.pod("client")
	admitted := func() bool { _, err := get(client, "10.202.0.2:8080", "", 500*time.Millisecond); return err == nil }
	refused := func() bool { _, err := get(client, "10.203.0.2:8080", "", 200*time.Millisecond); return err != nil }

	first := d.start(t)
	waitFor(t, 10*time.Second, "the policies in effect", func() bool { return admitted() && refused() }, first.logs)
	if n := strings.Count(first.logs(), "policy compiled"); n != 2 {
		t.Fatalf("the first agent compiled %d policies, want 2:\n%s", n, first.logs())
	}

	var mu sync.Mutex
	var violations []string
	var rounds atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ; ; rounds.Add(1) {
			select {
			case <-stop:
				return
			default:
			}
			if !admitted() {
				mu.Lock()
				violations = append(violations, time.Now().Format("15:04:05.000")+" backend-2 refused the client")
				mu.Unlock()
			}
			if !refused() {
				mu.Lock()
				violations = append(violations, time.Now().Format("15:04:05.000")+" backend-3 admitted the client")
				mu.Unlock()
			}
		}
	}()
	first.stop()
	second := d.start(t)
	// Ten rounds of both probes against the second agent, ready now.
	for start, deadline := rounds.Load(), time.Now().Add(10*time.Second); rounds.Load() < start+10; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the probes stalled after the restart")
		}
	}
	close(stop)
	<-done
	if len(violations) > 0 {
		t.Fatalf("across the restart: %v\n%s", violations, second.logs())
	}
	if l := second.logs(); strings.Contains(l, "policy compiled") || strings.Count(l, "policy kept from the running programs") != 2 {
		t.Fatalf("the restarted agent should keep both unchanged policies and compile none:\n%s", l)
	}
}
