package bpftest

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// NetNS is a named network namespace (visible to `ip netns`) owned by one test.
type NetNS struct {
	Name string
	tb   testing.TB
}

var nameSeq atomic.Uint32

// UniqueName returns a name of at most 15 characters (an interface name limit)
// that no other test of this process uses: prefix, process id and a sequence.
func UniqueName(prefix string) string {
	name := fmt.Sprintf("%s%x%x", prefix, os.Getpid()&0xffff, nameSeq.Add(1))
	if len(name) > 15 {
		name = name[len(name)-15:]
	}
	return name
}

// NewNetNS creates a network namespace with its loopback up. It is deleted when
// the test ends; deleting it also deletes every interface inside it.
func NewNetNS(tb testing.TB) *NetNS {
	tb.Helper()
	Require(tb)
	ns := &NetNS{Name: UniqueName("slt"), tb: tb}
	Run(tb, "ip", "netns", "add", ns.Name)
	tb.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns.Name).CombinedOutput(); err != nil {
			tb.Errorf("delete netns %s: %v: %s", ns.Name, err, out)
		}
	})
	ns.Run("ip", "link", "set", "lo", "up")
	return ns
}

// Run runs a command inside the namespace and fails the test if it fails.
func (ns *NetNS) Run(args ...string) string {
	ns.tb.Helper()
	return Run(ns.tb, append([]string{"ip", "netns", "exec", ns.Name}, args...)...)
}

// Command returns an unstarted command that will run inside the namespace.
func (ns *NetNS) Command(args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", ns.Name}, args...)...)
}

// Do runs fn on an OS thread that has entered the namespace. The thread is
// discarded afterwards, so the namespace never leaks into other goroutines.
func (ns *NetNS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the Go runtime terminates a thread whose goroutine
		// exits while locked, taking the namespace switch with it.
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + ns.Name)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", ns.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Run runs a command and fails the test with its output if it fails.
func Run(tb testing.TB, args ...string) string {
	tb.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Veth is a veth pair created by a test.
type Veth struct {
	Name, PeerName string
}

// NewVeth creates a veth pair with the first end in ns (nil: the current
// namespace) and the peer in peerNS, both up. Deleting one end deletes both; the
// pair goes away with its namespace, and is also deleted explicitly at cleanup.
func NewVeth(tb testing.TB, ns, peerNS *NetNS) Veth {
	tb.Helper()
	v := Veth{Name: UniqueName("slv"), PeerName: UniqueName("slp")}
	args := []string{"ip", "link", "add", v.Name}
	if ns != nil {
		args = append(args, "netns", ns.Name)
	}
	args = append(args, "type", "veth", "peer", "name", v.PeerName)
	if peerNS != nil {
		args = append(args, "netns", peerNS.Name)
	}
	Run(tb, args...)
	tb.Cleanup(func() {
		// Best effort: the pair is normally gone with its namespace already.
		del := []string{"link", "del", v.Name}
		if ns != nil {
			del = append([]string{"-n", ns.Name}, del...)
		}
		_ = exec.Command("ip", del...).Run()
	})
	inNS(tb, ns, "ip", "link", "set", v.Name, "up")
	inNS(tb, peerNS, "ip", "link", "set", v.PeerName, "up")
	return v
}

func inNS(tb testing.TB, ns *NetNS, args ...string) {
	tb.Helper()
	if ns == nil {
		Run(tb, args...)
		return
	}
	ns.Run(args...)
}
