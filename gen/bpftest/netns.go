package bpftest

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-net/sluice/netlab"
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
	if err := netlab.AddNamespace(ns.Name); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := netlab.DeleteNamespace(ns.Name); err != nil {
			tb.Error(err)
		}
	})
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

// Do runs fn on an OS thread that has entered the namespace (netlab.Enter).
func (ns *NetNS) Do(fn func() error) error { return netlab.Enter(ns.Path(), fn) }

// Path is the namespace's path, for code that enters it (netlab.Enter,
// ifacemgr.Options.Netns).
func (ns *NetNS) Path() string { return netlab.Path(ns.Name) }

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
	a, b := netlab.End{Name: v.Name}, netlab.End{Name: v.PeerName}
	if ns != nil {
		a.NS = ns.Name
	}
	if peerNS != nil {
		b.NS = peerNS.Name
	}
	if err := netlab.AddVeth(a, b); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		// Best effort: the pair is normally gone with its namespace already.
		del := []string{"link", "del", v.Name}
		if ns != nil {
			del = append([]string{"-n", ns.Name}, del...)
		}
		_, _ = netlab.IP(del...)
	})
	return v
}

// NewPod puts a pod behind a veth of node, as a CNI plugin would (netlab's
// Lab.Pod): hostIface in node with the gateway's address, eth0 in the pod
// with addr and a default route through the gateway. It is removed when the
// test ends.
func NewPod(tb testing.TB, node *NetNS, hostIface string, addr netip.Prefix, gateway netip.Addr) *NetNS {
	tb.Helper()
	lab := &netlab.Lab{Prefix: UniqueName("slpod")}
	tb.Cleanup(lab.Close)
	ns, err := lab.Pod(node.Name, hostIface, "pod", addr, gateway)
	if err != nil {
		lab.Close()
		tb.Fatal(err)
	}
	return &NetNS{Name: ns, tb: tb}
}
