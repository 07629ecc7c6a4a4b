package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// An agent whose pins cannot outlive it says so: run under `ip netns exec`
// (which mounts a fresh sysfs, hiding any bpffs at /sys/fs/bpf) with a pin
// directory under /sys/fs/bpf, on a machine whose PID 1 has no bpffs there
// either, it mounts one in its own mount namespace, and the log (WARN), the
// metric sluice_pins_private and /healthz's warnings all name the
// consequence. Where the host has a bpffs, the agent must pin there instead,
// through PID 1's root, and warn of nothing.
func TestPinsThatDieWithTheAgentAreAWarning(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := newDemoAgent(ctx, t)
	const healthz, metricsAddr = "127.0.0.1:10256", "127.0.0.1:10249"
	pinDir := "/sys/fs/bpf/sluice-pins-test"
	var st unix.Statfs_t
	hostBpffs := unix.Statfs("/sys/fs/bpf", &st) == nil && uint32(st.Type) == 0xcafe4a11
	if hostBpffs {
		// The agent pins in the host's bpffs: remove what it leaves there.
		t.Cleanup(func() { _ = os.RemoveAll(pinDir) })
	}
	node := d.topo.ns(d.topo.node)
	p := startAgentProc(t, d.topo.node, d.log, "--manifests", d.manifests, "--hostname-override", "sluice-demo", "--bpf-pin-dir", pinDir,
		"--workload-iface-prefixes", "slw", "--data-ifaces", "^sldata", "--cgroup=", "--min-sync-period", "50ms",
		"--healthz-bind-address", healthz, "--metrics-bind-address", metricsAddr)
	var body map[string]any
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, raw, err := fetchIn(node, healthz+"/healthz", "", time.Second)
		body = nil
		if err == nil && code == 200 && json.Unmarshal([]byte(raw), &body) == nil && strings.Contains(p.logs(), "sluice agent running") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not come up: /healthz %d %q %v\n%s", code, raw, err, p.logs())
		}
	}
	_, metrics, err := fetchIn(node, metricsAddr+"/metrics", "", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	warnings, _ := body["warnings"].(map[string]any)
	if hostBpffs {
		if !strings.Contains(p.logs(), "pinning in the host's, through PID 1's root") || warnings != nil ||
			!strings.Contains(metrics, "sluice_pins_private 0") {
			t.Fatalf("with a bpffs on the host: want pins there and no warning; /healthz %v\n%s", body, p.logs())
		}
		return
	}
	if !strings.Contains(p.logs(), "level=WARN") || !strings.Contains(p.logs(), "own mount namespace: every pin goes with it") {
		t.Errorf("the log has no WARN naming the consequence:\n%s", p.logs())
	}
	if w, _ := warnings["pins"].(string); !strings.Contains(w, "a restart drops every connection") {
		t.Errorf("/healthz has no pins warning: %v", body)
	}
	if !strings.Contains(metrics, "sluice_pins_private 1") {
		t.Errorf("sluice_pins_private is not 1:\n%s", grepLines(metrics, "sluice_pins_private"))
	}
}
