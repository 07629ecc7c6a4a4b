package main

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// agentProc is `sluice agent` running as its own process inside a network
// namespace, as on a node: `ip netns exec` (which also remounts /sys) runs
// this test binary as the sluice command.
type agentProc struct {
	cmd *exec.Cmd
	log *os.File
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
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &agentProc{cmd: cmd, log: log}
	t.Cleanup(p.stop)
	return p
}

// logs is everything the agent wrote so far.
func (p *agentProc) logs() string {
	b, _ := os.ReadFile(p.log.Name())
	return string(b)
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
