package main

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/agent"
	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

// A word that is not a flag ends the flags for Go's flag package: every flag
// after it used to be ignored, so `ct flush ... oops --service ns/svc`
// flushed every flow and `cleanup oops --bpf-pin-dir X` cleaned the default
// directory. Such commands are refused, as is a --proto that is not one.
func TestStrayArgumentsAreRefused(t *testing.T) {
	dir, ct := pinnedConntrack(t)
	k := bpftest.CtKey(netip.MustParseAddrPort("10.1.0.5:4000"), netip.MustParseAddrPort("10.96.0.10:80"), bpftest.ProtoTCP)
	if err := ct.Put(k, gen.SluiceCtValue{Type: gen.SluiceCtTypeCT_FORWARD, Peer: k}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"ct", "flush", "--bpf-pin-dir", dir, "oops", "--service", "ns/svc"},
		{"ct", "list", "--bpf-pin-dir", dir, "extra"},
		{"cleanup", "oops", "--bpf-pin-dir", dir},
		{"nat", "list", "--bpf-pin-dir", dir, "x"},
		{"maps", "--bpf-pin-dir", dir, "x"},
		{"agent", "--manifests", t.TempDir(), "stray"},
	} {
		err := run(context.Background(), args)
		if err == nil || !strings.Contains(err.Error(), "unexpected argument") {
			t.Errorf("%v: %v, want the stray word refused", args, err)
		}
	}
	if err := run(context.Background(), []string{"ct", "flush", "--bpf-pin-dir", dir, "--proto", "bogus"}); err == nil || !strings.Contains(err.Error(), "--proto") {
		t.Errorf("--proto bogus: %v", err)
	}
	if _, err := ct.Get(k); err != nil {
		t.Fatalf("a refused command flushed a flow: %v", err)
	}
}

// cleanup removes only Sluice's own objects, all of them, and says so.
func TestCleanupIsSafeAndComplete(t *testing.T) {
	// A regular file, or a directory that is not a bpffs, is refused and kept.
	file := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"cleanup", "--bpf-pin-dir", file}); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("cleanup of a regular file: %v", err)
	}
	empty := t.TempDir()
	if err := run(context.Background(), []string{"cleanup", "--bpf-pin-dir", empty}); err == nil || !strings.Contains(err.Error(), "not on a bpffs") {
		t.Fatalf("cleanup of a plain directory: %v", err)
	}
	for _, p := range []string{file, empty} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("cleanup removed %s: %v", p, err)
		}
	}

	// A bpffs directory holding a map of the current name but another size
	// (the set cannot open it), a pin of an older layout and another
	// owner's pin: Sluice's go, the other owner's stays.
	dir := bpftest.PinDir(t)
	for _, name := range []string{gen.SluiceMapSlFeV1, "sl_fe_v0", "theirs"} {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if err := m.Pin(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := run(context.Background(), []string{"cleanup", "--bpf-pin-dir", dir}); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	if left := agent.Leftovers(dir); len(left) != 0 {
		t.Fatalf("cleanup left %v", left)
	}
	if _, err := os.Stat(filepath.Join(dir, "theirs")); err != nil {
		t.Fatalf("cleanup removed another owner's pin: %v", err)
	}
}

// A bad address fails the start before the node is touched: no pin is left.
func TestBadBindAddressTouchesNothing(t *testing.T) {
	bpftest.Require(t)
	pins := filepath.Join(bpftest.PinDir(t), "sluice")
	_, err := agent.Start(context.Background(), agent.Config{Manifests: t.TempDir(), PinDir: pins,
		HealthzBindAddress: "256.0.0.1:10256"}, nil)
	if err == nil || !strings.Contains(err.Error(), "--healthz-bind-address") {
		t.Fatalf("bad --healthz-bind-address: %v", err)
	}
	if _, err := os.Stat(pins); !os.IsNotExist(err) {
		t.Fatalf("a refused start created the pin directory (%v)", err)
	}
}

// Under `ip netns exec`, which remounts /sys and hides /sys/fs/bpf, the agent
// mounts a bpffs itself and says so (in the private mount namespace of that
// command: the node's own stays untouched); a tool reading pins there says
// why it finds none.
func TestAgentUnderIPNetnsExecMountsBPFFS(t *testing.T) {
	bpftest.Require(t)
	ns := bpftest.NewNetNS(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	pinDir := "/sys/fs/bpf/" + bpftest.UniqueName("sltest")
	var logs syncBuffer
	cmd := ns.Command(self, "agent", "--manifests", t.TempDir(), "--bpf-pin-dir", pinDir, "--cgroup=",
		"--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address=", "--workload-iface-prefixes", "slw")
	cmd.Env = append(os.Environ(), "SLUICE_AS_BINARY=1")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() }()
	waitFor(t, 15*time.Second, "the agent comes up under ip netns exec", func() bool {
		_, err := get(ns.Path(), "127.0.0.1:10256/healthz", "", time.Second)
		return err == nil
	}, logs.String)
	if !strings.Contains(logs.String(), "no bpffs was mounted; mounted one") {
		t.Fatalf("the mount is not logged:\n%s", logs.String())
	}
	tool := ns.Command(self, "maps", "--bpf-pin-dir", pinDir)
	tool.Env = append(os.Environ(), "SLUICE_AS_BINARY=1") // run as sluice, not as the tests
	out, err := tool.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "ip netns exec") {
		t.Fatalf("sluice maps under ip netns exec: %v: %s", err, out)
	}
}

// `sluice ct flush` deletes the flows it picks, both entries of each, and
// nothing else: not other flows, and not a reverse entry that another flow
// took over after a client port was reused.
func TestCTFlushDeletesOnlyThePickedFlows(t *testing.T) {
	dir, ct := pinnedConntrack(t)
	ap := netip.MustParseAddrPort
	put := func(k gen.SluiceCtKey, v gen.SluiceCtValue) {
		if err := ct.Put(k, v, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	// pair writes a flow client -> frontend balanced to backend.
	pair := func(client, frontend, backend netip.AddrPort) (fwd, rev gen.SluiceCtKey) {
		fwd = bpftest.CtKey(client, frontend, bpftest.ProtoTCP)
		rev = bpftest.CtKey(backend, client, bpftest.ProtoTCP)
		now := uint64(conntrack.Monotonic())
		put(fwd, gen.SluiceCtValue{Type: gen.SluiceCtTypeCT_FORWARD, Peer: rev, Created: now, LastSeen: now, SvcId: 1,
			NatAddr: gen.NetAddr(backend.Addr()), NatPort: gen.NetPort(backend.Port())})
		put(rev, gen.SluiceCtValue{Type: gen.SluiceCtTypeCT_REVERSE, Peer: fwd, Created: now, LastSeen: now, SvcId: 1})
		return fwd, rev
	}
	aFwd, aRev := pair(ap("10.1.0.5:4000"), ap("10.96.0.10:80"), ap("10.2.0.7:8080"))
	bFwd, bRev := pair(ap("10.1.0.6:4001"), ap("10.96.0.10:80"), ap("10.2.0.7:8080"))
	// c and d: one client port toward two Services with the same backend;
	// the reverse entry is d's (it was reused), c's forward entry still
	// points to it.
	cFwd, _ := pair(ap("10.1.0.7:5000"), ap("10.96.0.11:80"), ap("10.2.0.8:8080"))
	dFwd, dRev := pair(ap("10.1.0.7:5000"), ap("10.96.0.12:80"), ap("10.2.0.8:8080"))

	out, err := run2(func() error {
		return run(context.Background(), []string{"ct", "flush", "--bpf-pin-dir", dir, "--address", "10.1.0.5"})
	})
	if err != nil || !strings.Contains(out, "flushed 1 flows") {
		t.Fatalf("flush by client address: %q %v", out, err)
	}
	if out, err = run2(func() error {
		return run(context.Background(), []string{"ct", "flush", "--bpf-pin-dir", dir, "--address", "10.96.0.11"})
	}); err != nil || !strings.Contains(out, "flushed 1 flows") {
		t.Fatalf("flush by frontend address: %q %v", out, err)
	}
	has := func(k gen.SluiceCtKey) bool { _, err := ct.Get(k); return err == nil }
	for name, k := range map[string]gen.SluiceCtKey{"a forward": aFwd, "a reverse": aRev, "c forward": cFwd} {
		if has(k) {
			t.Errorf("%s entry not flushed", name)
		}
	}
	for name, k := range map[string]gen.SluiceCtKey{"b forward": bFwd, "b reverse": bRev, "d forward": dFwd, "d reverse": dRev} {
		if !has(k) {
			t.Errorf("%s entry flushed with another flow", name)
		}
	}
}

// pinnedConntrack opens the maps pinned on a private bpffs, as an agent
// would have left them, and returns the directory and the conntrack map.
func pinnedConntrack(t *testing.T) (string, *maps.Map[gen.SluiceCtKey, gen.SluiceCtValue]) {
	t.Helper()
	dir := bpftest.PinDir(t)
	set, err := maps.Open(maps.OpenOptions{PinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	ct, err := maps.Conntrack.In(set)
	if err != nil {
		t.Fatal(err)
	}
	return dir, ct
}

// Every command answers -h and --help with its usage (and its flags, where
// it has any) on stdout and exit status 0, as the binary: also a command
// whose arguments come before its flags (trace) or that takes none (demo),
// and a command group without its subcommand (nat, ct).
func TestEveryCommandHasHelp(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args  []string
		usage string
		flags string // a flag the help lists; "" for none
	}{
		{[]string{"agent", "--help"}, "usage: sluice agent [flags]", "-service-metrics"},
		{[]string{"demo", "-h"}, "usage: sluice demo", ""},
		{[]string{"nat", "--help"}, "usage: sluice nat list", ""},
		{[]string{"nat", "list", "--help"}, "usage: sluice nat list", "-bpf-pin-dir"},
		{[]string{"ct", "--help"}, "usage: sluice ct list|flush", ""},
		{[]string{"ct", "flush", "-h"}, "usage: sluice ct flush", "-proto"},
		{[]string{"monitor", "--help"}, "usage: sluice monitor", "-type"},
		{[]string{"trace", "--help"}, "usage: sluice trace tcp|udp SRC:PORT -> DST:PORT", "-direction"},
		{[]string{"trace", "tcp", "10.0.0.1:1", "->", "10.96.0.10:80", "--help"}, "usage: sluice trace", "-iface"},
		{[]string{"iface", "list", "--help"}, "usage: sluice iface list", "-json"},
		{[]string{"policy", "--help"}, "usage: sluice policy list", ""},
		{[]string{"maps", "--help"}, "usage: sluice maps", "-json"},
		{[]string{"cleanup", "--help"}, "usage: sluice cleanup", "-hand-back"},
	} {
		cmd := exec.Command(self, c.args...)
		cmd.Env = append(os.Environ(), "SLUICE_AS_BINARY=1")
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil || stderr.Len() != 0 {
			t.Errorf("sluice %s: %v, stderr %q", strings.Join(c.args, " "), err, stderr.String())
			continue
		}
		out := stdout.String()
		if !strings.HasPrefix(out, c.usage) || (c.flags != "" && !strings.Contains(out, "\nflags:\n") || !strings.Contains(out, c.flags)) {
			t.Errorf("sluice %s printed\n%s\nwant %q first, and flag %q", strings.Join(c.args, " "), out, c.usage, c.flags)
		}
	}
	// A wrong flag is still an error, with the usage on stderr.
	cmd := exec.Command(self, "maps", "--bogus")
	cmd.Env = append(os.Environ(), "SLUICE_AS_BINARY=1")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "usage: sluice maps") {
		t.Errorf("sluice maps --bogus: %v: %s", err, out)
	}
}
