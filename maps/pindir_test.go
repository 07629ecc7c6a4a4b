package maps_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

// pinDirChild names the case a re-executed test binary runs inside the
// namespaces its parent made (see TestPreparePinDir).
const pinDirChild = "SLUICE_PINDIR_CHILD"

const childPinDir = "/sys/fs/bpf/sluice-pindir-test"

// TestPreparePinDir runs the agent's pin-directory preparation where
// /sys/fs/bpf is not a bpffs, in namespaces of its own (this machine's
// mounts are not touched):
//
//   - through-init: as under `ip netns exec` on a node whose host has a
//     bpffs: a PID namespace whose PID 1 has a bpffs at /sys/fs/bpf, and the
//     test in another mount namespace where /sys/fs/bpf is not a bpffs. The pins must land
//     in PID 1's bpffs and outlive the test's mount namespace.
//   - private: no bpffs anywhere PID 1 sees; the test mounts one in its own
//     mount namespace, which must be reported as Private.
func TestPreparePinDir(t *testing.T) {
	switch os.Getenv(pinDirChild) {
	case "through-init":
		childThroughInit(t)
		return
	case "private":
		childPrivate(t)
		return
	}
	bpftest.Require(t)
	for _, tool := range []string{"unshare", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed: %v", tool, err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// run runs unshare with args, then sh -c script with the test binary
	// and its flags as "$0" "$@".
	run := func(t *testing.T, env string, args []string, script string) {
		args = append(args, "sh", "-c", script, self, "-test.run=^TestPreparePinDir$", "-test.v")
		cmd := exec.Command("unshare", args...)
		cmd.Env = append(os.Environ(), pinDirChild+"="+env)
		out, err := cmd.CombinedOutput()
		t.Logf("%s", out)
		if err != nil {
			t.Fatalf("child: %v", err)
		}
		if !strings.Contains(string(out), "--- PASS: TestPreparePinDir") {
			t.Fatal("the child did not run the case")
		}
	}
	t.Run("through-init", func(t *testing.T) {
		// PID 1 (this sh) mounts a bpffs at /sys/fs/bpf in its mount
		// namespace and runs the test in a mount namespace of its own where
		// a tmpfs hides it (as `ip netns exec`'s fresh sysfs does); then it
		// checks the pin
		// is still there once that namespace is gone. sh must not exec the
		// test: PID 1 would then be the test itself.
		run(t, "through-init", []string{"--pid", "--fork", "--mount", "--mount-proc", "--propagation", "private"},
			`mount -t bpf bpf /sys/fs/bpf || exit 2
unshare --mount --propagation private sh -c 'mount -t tmpfs none /sys/fs/bpf && exec "$0" "$@"' "$0" "$@"
rc=$?
[ $rc = 0 ] || exit $rc
[ -e `+childPinDir+`/map ] || { echo "the pin went with the test's mount namespace"; exit 3; }`)
	})
	t.Run("private", func(t *testing.T) {
		run(t, "private", []string{"--mount", "--propagation", "private"}, `mount -t tmpfs none /sys/fs/bpf && exec "$0" "$@"`)
	})
}

func childThroughInit(t *testing.T) {
	res, err := maps.PreparePinDir(childPinDir)
	if err != nil {
		t.Fatal(err)
	}
	want := "/proc/1/root" + childPinDir
	if !res.ThroughInit || res.Mounted || res.Private || res.Dir != want {
		t.Fatalf("PreparePinDir = %+v, want the host's bpffs through PID 1's root, %s", res, want)
	}
	pinMap(t, res.Dir)
	if got, err := maps.ReadablePinDir(childPinDir); err != nil || got != want {
		t.Fatalf("ReadablePinDir = %q, %v; want %s", got, err, want)
	}
}

func childPrivate(t *testing.T) {
	res, err := maps.PreparePinDir(childPinDir)
	if err != nil {
		t.Fatal(err)
	}
	if res.ThroughInit || !res.Mounted || !res.Private || res.Dir != childPinDir {
		t.Fatalf("PreparePinDir = %+v, want a bpffs mounted here and reported private", res)
	}
	pinMap(t, res.Dir)
}

// pinMap pins a map in dir under the name "map", proving dir takes pins.
func pinMap(t *testing.T, dir string) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(filepath.Join(dir, "map")); err != nil {
		t.Fatalf("pin in %s: %v", dir, err)
	}
}
