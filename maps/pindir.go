package maps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// bpffsMagic is the file system type of a bpffs mount (BPF_FS_MAGIC in
// linux/magic.h).
const bpffsMagic = 0xcafe4a11

// CheckPinDir tells whether dir can hold pins: an existing directory on a
// bpffs. The error names the directory and says what is wrong with it.
func CheckPinDir(dir string) error {
	info, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("pin directory %s: %w", dir, err)
	}
	if !info.IsDir() {
		return fmt.Errorf("pin directory %s is not a directory", dir)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("pin directory %s: %w", dir, err)
	}
	if uint32(st.Type) != bpffsMagic {
		return fmt.Errorf("pin directory %s is not on a bpffs (mount one with `mount -t bpf bpf /sys/fs/bpf`)", dir)
	}
	return nil
}

// bpffsRoot is where a node's bpffs is mounted.
const bpffsRoot = "/sys/fs/bpf"

// initRoot is the root directory of PID 1, the host's init when the agent
// shares the host's PID namespace: its bpffs is reachable through it from
// another mount namespace (`ip netns exec`, a container with hostPID).
const initRoot = "/proc/1/root"

// PreparedPinDir says how PreparePinDir made a pin directory usable.
type PreparedPinDir struct {
	// Dir is the directory to pin in: the one asked for, or the same path
	// under the host's bpffs reached through PID 1's root.
	Dir string
	// ThroughInit is set when Dir reaches the host's bpffs through PID 1's
	// root because this mount namespace has none.
	ThroughInit bool
	// Mounted is set when PreparePinDir mounted a bpffs.
	Mounted bool
	// Private is set when that bpffs is in a mount namespace other than
	// the host init's: its pins go when the process's namespace goes, so a
	// restart loses every connection the datapath tracked.
	Private bool
}

// PreparePinDir makes dir usable for pins, as Cilium and Calico do. When
// the bpffs a pin directory under /sys/fs/bpf needs is not mounted here, it
// uses the host's through PID 1's root if that is another mount namespace
// with a bpffs there (`ip netns exec` remounts /sys; a container with
// hostPID); otherwise it mounts one at /sys/fs/bpf, which lasts only as
// long as this mount namespace unless it is the host init's (Private says
// so). Then it creates the directory. A pin directory elsewhere must
// already be on a bpffs: the error says what to do.
func PreparePinDir(dir string) (PreparedPinDir, error) {
	dir = cmpOr(dir, DefaultPinDir)
	res := PreparedPinDir{Dir: dir}
	if CheckPinDir(dir) == nil {
		return res, nil // a bpffs directory already, or a mount of one
	}
	parent := filepath.Dir(dir)
	if err := CheckPinDir(parent); err != nil {
		if !strings.HasPrefix(filepath.Clean(dir)+"/", bpffsRoot+"/") {
			return res, fmt.Errorf("%w; mount one at %s or choose a directory on one (--bpf-pin-dir)", err, parent)
		}
		if host, ok := throughInit(dir); ok {
			res.Dir, res.ThroughInit = host, true
			if err := os.MkdirAll(host, 0o700); err != nil {
				return res, fmt.Errorf("pin directory %s: %w", host, err)
			}
			return res, nil
		}
		if err := os.MkdirAll(bpffsRoot, 0o755); err != nil {
			return res, fmt.Errorf("pin directory %s: no bpffs, and %s cannot be created to mount one: %w", dir, bpffsRoot, err)
		}
		if CheckPinDir(bpffsRoot) != nil {
			if err := unix.Mount("bpf", bpffsRoot, "bpf", 0, "mode=0700"); err != nil {
				return res, fmt.Errorf("pin directory %s: no bpffs at %s, and mounting one failed (%w): run `mount -t bpf bpf %s` on the host and give the agent the host's %s (a hostPath volume)", dir, bpffsRoot, err, bpffsRoot, bpffsRoot)
			}
			res.Mounted, res.Private = true, !sharesInitMounts()
		}
		if err := os.MkdirAll(parent, 0o700); err != nil {
			return res, fmt.Errorf("pin directory %s: %w", dir, err)
		}
		if err := CheckPinDir(parent); err != nil {
			return res, err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, fmt.Errorf("pin directory %s: %w", dir, err)
	}
	return res, nil
}

// throughInit returns dir under PID 1's root when PID 1 is another process
// in another mount namespace whose /sys/fs/bpf is a bpffs.
func throughInit(dir string) (string, bool) {
	if os.Getpid() == 1 || sharesInitMounts() {
		return "", false
	}
	if CheckPinDir(initRoot+bpffsRoot) != nil {
		return "", false
	}
	return initRoot + filepath.Clean(dir), true
}

// sharesInitMounts tells whether this process is in PID 1's mount
// namespace, and PID 1 is not itself (a container's first process has a
// mount namespace of its own that goes with it).
func sharesInitMounts() bool {
	if os.Getpid() == 1 {
		return false
	}
	self, err1 := os.Readlink("/proc/self/ns/mnt")
	init, err2 := os.Readlink("/proc/1/ns/mnt")
	return err1 == nil && err2 == nil && self == init
}

// ReadablePinDir returns where tools that read pins find dir: dir itself,
// or the host's through PID 1's root when this mount namespace has no bpffs
// there (`ip netns exec` remounts /sys and hides it), as the agent pins
// (PreparePinDir). Otherwise it says why there is nothing to read.
func ReadablePinDir(dir string) (string, error) {
	dir = cmpOr(dir, DefaultPinDir)
	err := CheckPinDir(dir)
	if err == nil {
		return dir, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	if perr := CheckPinDir(filepath.Dir(dir)); perr != nil && strings.HasPrefix(dir, bpffsRoot+"/") {
		if host, ok := throughInit(dir); ok && CheckPinDir(host) == nil {
			return host, nil
		}
		return "", fmt.Errorf("%w: %s is not a bpffs here (`ip netns exec` remounts /sys and hides it: run the command outside, or pass --bpf-pin-dir)", err, bpffsRoot)
	}
	return "", fmt.Errorf("%w: is the agent running on this node?", err)
}
