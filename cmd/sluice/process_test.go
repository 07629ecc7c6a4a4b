package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// agentProc is `sluice agent` running as its own process inside a network
// namespace, as on a node: `ip netns exec` (which also remounts /sys) runs
// this test binary as the sluice command.
type agentProc struct {
	cmd  *exec.Cmd
	log  *os.File
	from int64 // where this process's output starts in log
}

// startAgentProc starts the agent in namespace ns with args after "agent",
// appending its output to log. It is stopped when the test ends.
func startAgentProc(t *testing.T, ns string, log *os.File, args ...string) *agentProc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, self, "agent"}, args...)...)
	// Without it, the test binary would run the whole suite again.
	cmd.Env = append(os.Environ(), "SLUICE_AS_BINARY=1")
	cmd.Stdout, cmd.Stderr = log, log
	info, err := log.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &agentProc{cmd: cmd, log: log, from: info.Size()}
	t.Cleanup(p.stop)
	return p
}

// logs is everything this agent process wrote so far.
func (p *agentProc) logs() string {
	b, _ := os.ReadFile(p.log.Name())
	return string(b[min(p.from, int64(len(b))):])
}

// stop ends the agent as a service manager would: SIGTERM, then SIGKILL
// after 10 s. It may be called more than once.
func (p *agentProc) stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
	p.cmd = nil
}

// waitProgrammed waits until the agent runs and its pins show the frontend
// programmed and the given number of interfaces ready (/healthz answers 200
// from the start, before the first sync; pins outlive an earlier agent).
func (p *agentProc) waitProgrammed(t *testing.T, pinDir, frontend string, ifaces int) {
	t.Helper()
	ctx := context.Background()
	var nat, list string
	waitFor(t, 15*time.Second, "the agent programs "+frontend+" and "+strconv.Itoa(ifaces)+" interfaces", func() bool {
		nat, _ = run2(func() error { return run(ctx, []string{"nat", "list", "--bpf-pin-dir", pinDir}) })
		list, _ = run2(func() error { return run(ctx, []string{"iface", "list", "--bpf-pin-dir", pinDir}) })
		return strings.Contains(p.logs(), "sluice agent running") && strings.Contains(nat, frontend) && strings.Count(list, "true") == ifaces
	}, func() string { return nat + "\n" + list + "\n" + p.logs() })
}

// demoAgent is the demo topology (agent_test.go) with its node's agent run as
// a process: the tests that need `sluice agent` as on a node start it here.
type demoAgent struct {
	topo      *demoTopology
	pinDir    string
	manifests string
	log       *os.File // every start of the agent appends to it
}

func newDemoAgent(ctx context.Context, t *testing.T) *demoAgent {
	topo, cfg, manifests := demoAgentSetup(ctx, t)
	log, err := os.Create(filepath.Join(t.TempDir(), "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	return &demoAgent{topo: topo, pinDir: cfg.PinDir, manifests: manifests, log: log}
}

// start runs the agent on the demo's node with the demo's flags (no socket
// LB, no HTTP listeners, syncs 50 ms apart) and extra ones, which win over
// them, and waits until it has programmed the node.
func (d *demoAgent) start(t *testing.T, extra ...string) *agentProc {
	t.Helper()
	args := []string{"--manifests", d.manifests, "--hostname-override", "sluice-demo", "--bpf-pin-dir", d.pinDir,
		"--workload-iface-prefixes", "slw", "--data-ifaces", "^sldata", "--cgroup=",
		"--healthz-bind-address=", "--metrics-bind-address=", "--min-sync-period", "50ms"}
	p := startAgentProc(t, d.topo.node, d.log, append(args, extra...)...)
	p.waitProgrammed(t, d.pinDir, "10.96.0.10:80", 5)
	return p
}

// pod is the path of a demo pod's network namespace.
func (d *demoAgent) pod(role string) string { return d.topo.ns(d.topo.pods[role]) }
