package bpftest

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// RequireEnv is the environment variable that turns skips into failures.
const RequireEnv = "SLUICE_REQUIRE_BPF"

var (
	privilegeOnce sync.Once
	privilegeErr  error
)

// checkPrivilege creates and closes a tiny map: the cheapest proof that this
// process may use BPF at all.
func checkPrivilege() error {
	privilegeOnce.Do(func() {
		if os.Geteuid() != 0 {
			privilegeErr = errors.New("not running as root")
			return
		}
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
		if err != nil {
			privilegeErr = fmt.Errorf("cannot create a BPF map: %w", err)
			return
		}
		m.Close()
	})
	return privilegeErr
}

// Required reports whether SLUICE_REQUIRE_BPF asks for privileged tests to fail
// rather than skip.
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Require skips tb when the process cannot use BPF and network namespaces, or
// fails it when SLUICE_REQUIRE_BPF=1.
func Require(tb testing.TB) {
	tb.Helper()
	if err := checkPrivilege(); err != nil {
		if Required() {
			tb.Fatalf("BPF test cannot run (%v) and %s=1 forbids skipping: run as root", err, RequireEnv)
		}
		tb.Skipf("skipping BPF test: %v (run as root; set %s=1 to make this a failure)", err, RequireEnv)
	}
}

// PinDir mounts a private bpffs on a fresh temporary directory and returns its
// path. It is unmounted (dropping every pin in it) when the test ends.
func PinDir(tb testing.TB) string {
	tb.Helper()
	Require(tb)
	dir := tb.TempDir()
	if err := unix.Mount("bpffs", dir, "bpf", 0, ""); err != nil {
		tb.Fatalf("mount bpffs on %s: %v", dir, err)
	}
	tb.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			tb.Errorf("unmount bpffs %s: %v", dir, err)
		}
	})
	return dir
}
