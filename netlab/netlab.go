// Package netlab builds small networks of Linux network namespaces for
// Sluice's demo, its tests and its benchmarks: namespaces, veth pairs, the
// pods behind them, bridges; and it runs code inside a namespace.
//
// It drives iproute2 (`ip`), as an operator would, so a topology can be
// inspected with the same tool while it runs. A Lab remembers what it made
// and Close removes it in reverse order, also after a failed step. It needs
// root (CAP_NET_ADMIN and CAP_SYS_ADMIN).
package netlab

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Path is where `ip netns` keeps a named namespace.
func Path(name string) string { return "/run/netns/" + name }

// Enter runs fn on an OS thread inside the network namespace at path ("" is
// the current one). The thread is discarded afterwards, so the namespace never
// leaks into other goroutines. Interface indexes, TCX and netlink attachment,
// sockets and /proc/sys/net all resolve in the calling thread's namespace.
func Enter(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the Go runtime ends a thread whose goroutine exits
		// while locked, taking the namespace switch with it.
		runtime.LockOSThread()
		f, err := os.Open(path)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Switch moves the calling goroutine's OS thread into the network namespace
// at path until back is called, for code that must run on the caller's own
// goroutine there (a benchmark's b.Loop: BPF_PROG_TEST_RUN resolves FIB
// lookups and interfaces in the caller's namespace). The goroutine stays on
// the thread until then. If back cannot return the thread, it stays locked
// and is discarded with its goroutine, as Enter's.
func Switch(path string) (back func() error, err error) {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	target, err := os.Open(path)
	if err != nil {
		self.Close()
		runtime.UnlockOSThread()
		return nil, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		self.Close()
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter netns %s: %w", path, err)
	}
	return func() error {
		defer self.Close()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("leave netns %s: %w", path, err)
		}
		runtime.UnlockOSThread()
		return nil
	}, nil
}

// IP runs `ip args...` and returns its output, or an error with the command
// and what it printed.
func IP(args ...string) (string, error) {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// AddNamespace creates a named namespace with its loopback up.
func AddNamespace(name string) error {
	if _, err := IP("netns", "add", name); err != nil {
		return err
	}
	if _, err := IP("-n", name, "link", "set", "lo", "up"); err != nil {
		_ = DeleteNamespace(name)
		return err
	}
	return nil
}

// DeleteNamespace deletes a named namespace, and with it every interface in it.
func DeleteNamespace(name string) error {
	_, err := IP("netns", "del", name)
	return err
}

// End is one end of a veth pair: its namespace ("" is the current one), its
// name, and optionally an address and a bridge to enslave it to. Every end
// is set up.
type End struct {
	NS     string
	Name   string
	Addr   netip.Prefix // the zero Prefix: none
	Master string       // a bridge in NS, or ""
}

func (e End) ip(args ...string) error {
	if e.NS != "" {
		args = append([]string{"-n", e.NS}, args...)
	}
	_, err := IP(args...)
	return err
}

// AddVeth creates a veth pair between two ends, addressed and up. Deleting
// one end deletes both; the pair also goes with either namespace.
func AddVeth(a, b End) error {
	args := []string{"link", "add", a.Name}
	if a.NS != "" {
		args = append(args, "netns", a.NS)
	}
	args = append(args, "type", "veth", "peer", "name", b.Name)
	if b.NS != "" {
		args = append(args, "netns", b.NS)
	}
	if _, err := IP(args...); err != nil {
		return err
	}
	for _, e := range []End{a, b} {
		if e.Addr.IsValid() {
			if err := e.ip("addr", "add", e.Addr.String(), "dev", e.Name); err != nil {
				return err
			}
		}
		if e.Master != "" {
			if err := e.ip("link", "set", e.Name, "master", e.Master); err != nil {
				return err
			}
		}
		if err := e.ip("link", "set", e.Name, "up"); err != nil {
			return err
		}
	}
	return nil
}

// Lab is a topology under construction: what it made is removed by Close.
type Lab struct {
	// Prefix starts the name of every namespace the lab creates, so that
	// parallel labs (and `ip netns` listings) keep theirs apart.
	Prefix string
	undo   []func()
}

// Defer adds a step to Close, run before the steps added earlier.
func (l *Lab) Defer(fn func()) { l.undo = append(l.undo, fn) }

// Close removes what the lab made, the newest first.
func (l *Lab) Close() {
	for i := len(l.undo) - 1; i >= 0; i-- {
		l.undo[i]()
	}
	l.undo = nil
}

// Namespace creates the namespace Prefix + "-" + name, with its loopback up,
// and returns its full name.
func (l *Lab) Namespace(name string) (string, error) {
	full := l.Prefix + "-" + name
	if err := AddNamespace(full); err != nil {
		return "", err
	}
	l.Defer(func() { _ = DeleteNamespace(full) })
	return full, nil
}

// Router creates a namespace that forwards IPv4 (a node), and returns its
// full name.
func (l *Lab) Router(name string) (string, error) {
	full, err := l.Namespace(name)
	if err != nil {
		return "", err
	}
	_, err = IP("netns", "exec", full, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	return full, err
}

// Bridge creates a namespace holding one bridge, br0, up: a shared L2
// segment that Plug connects namespaces to.
func (l *Lab) Bridge(name string) (string, error) {
	full, err := l.Namespace(name)
	if err != nil {
		return "", err
	}
	for _, args := range [][]string{{"link", "add", "br0", "type", "bridge"}, {"link", "set", "br0", "up"}} {
		if _, err := IP(append([]string{"-n", full}, args...)...); err != nil {
			return "", err
		}
	}
	return full, nil
}

// Plug connects a namespace to a bridge made by Bridge: iface, addressed
// addr, in ns; its peer (port) on br0.
func (l *Lab) Plug(ns, iface string, addr netip.Prefix, bridgeNS, port string) error {
	return AddVeth(End{NS: ns, Name: iface, Addr: addr}, End{NS: bridgeNS, Name: port, Master: "br0"})
}

// Pod creates a namespace for a pod behind a veth of a node, as a CNI plugin
// would: hostIface in node with the gateway's address, eth0 in the pod with
// addr and a default route through the gateway. It returns the pod's full
// namespace name.
func (l *Lab) Pod(node, hostIface, name string, addr netip.Prefix, gateway netip.Addr) (string, error) {
	ns, err := l.Namespace(name)
	if err != nil {
		return "", err
	}
	err = AddVeth(End{NS: node, Name: hostIface, Addr: netip.PrefixFrom(gateway, addr.Bits())},
		End{NS: ns, Name: "eth0", Addr: addr})
	if err != nil {
		return "", err
	}
	if _, err := IP("-n", ns, "route", "add", "default", "via", gateway.String()); err != nil {
		return "", err
	}
	return ns, nil
}
