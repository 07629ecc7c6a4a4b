package main

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
	"golang.org/x/sys/unix"
)

// The agent's socket LB serves the host's own sockets only: a pod's
// connect() takes the TC path and keeps the pod's address as its affinity
// identity (before, every pod on a node shared the node's affinity entry).
func TestSocketLBServesTheHostOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := newDemoAgent(ctx, t)
	cg := bpftest.NewCgroup(t)
	// `ip netns exec` remounts /sys, hiding /sys/fs/cgroup from the agent:
	// show it the cgroup through a mount of the cgroup2 hierarchy of its own.
	cgroups := t.TempDir()
	if err := unix.Mount("cgroup2", cgroups, "cgroup2", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(cgroups, unix.MNT_DETACH)
	d.start(t, "--cgroup", filepath.Join(cgroups, filepath.Base(cg.Path)))
	set, err := maps.Open(maps.OpenOptions{PinDir: d.pinDir, NoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	sockets, err := maps.Sockets.In(set)
	if err != nil {
		t.Fatal(err)
	}
	affinity, err := maps.Affinity.In(set)
	if err != nil {
		t.Fatal(err)
	}
	// connect runs a shell in the socket-LB cgroup and a namespace that asks
	// the sticky Service once.
	connect := func(ns string) {
		t.Helper()
		dir, err := os.Open(cg.Path)
		if err != nil {
			t.Fatal(err)
		}
		defer dir.Close()
		cmd := exec.Command("ip", "netns", "exec", ns, "bash", "-c",
			`exec 3<>/dev/tcp/10.96.0.12/80 && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && timeout 2 cat <&3`)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "backend-") {
			t.Fatalf("request from %s: %v\n%s", ns, err, out)
		}
	}
	count := func() int {
		n := 0
		err := sockets.Iterate(func(gen.SluiceSockKey, gen.SluiceSockValue) bool { n++; return true })
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	clients := func() []netip.Addr {
		var out []netip.Addr
		err := affinity.Iterate(func(k gen.SluiceAffKey, _ gen.SluiceAffValue) bool {
			out = append(out, gen.AddrFromNet(k.Client))
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	connect(d.topo.pods["client"])
	if n := count(); n != 0 {
		t.Fatalf("a pod's connect() was balanced at the socket (%d socket entries)", n)
	}
	if got := clients(); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("10.200.0.2")}) {
		t.Fatalf("affinity clients %v, want the pod's own address", got)
	}
	connect(d.topo.node)
	if n := count(); n != 1 {
		t.Fatalf("the host's connect() was not balanced at the socket (%d socket entries)", n)
	}
}
