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

// PreparePinDir makes dir usable for pins, as Cilium and Calico do: when the
// bpffs a pin directory under /sys/fs/bpf needs is not mounted (a fresh
// node, a container, `ip netns exec`, which remounts /sys), it mounts one
// there; then it creates dir. It returns whether it mounted, for the log.
// Elsewhere it only says what to do.
func PreparePinDir(dir string) (mounted bool, err error) {
	dir = cmpOr(dir, DefaultPinDir)
	if CheckPinDir(dir) == nil {
		return false, nil // a bpffs directory already, or a mount of one
	}
	parent := filepath.Dir(dir)
	if err := CheckPinDir(parent); err != nil {
		if !strings.HasPrefix(filepath.Clean(dir)+"/", bpffsRoot+"/") {
			return false, fmt.Errorf("%w; mount one at %s or choose a directory on one (--bpf-pin-dir)", err, parent)
		}
		if err := os.MkdirAll(bpffsRoot, 0o755); err != nil {
			return false, fmt.Errorf("pin directory %s: no bpffs, and %s cannot be created to mount one: %w", dir, bpffsRoot, err)
		}
		if CheckPinDir(bpffsRoot) != nil {
			if err := unix.Mount("bpf", bpffsRoot, "bpf", 0, "mode=0700"); err != nil {
				return false, fmt.Errorf("pin directory %s: no bpffs at %s, and mounting one failed (%w): run `mount -t bpf bpf %s`, or give the agent the host's /sys/fs/bpf", dir, bpffsRoot, err, bpffsRoot)
			}
			mounted = true
		}
		if err := os.MkdirAll(parent, 0o700); err != nil {
			return mounted, fmt.Errorf("pin directory %s: %w", dir, err)
		}
		if err := CheckPinDir(parent); err != nil {
			return mounted, err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return mounted, fmt.Errorf("pin directory %s: %w", dir, err)
	}
	return mounted, nil
}

// CheckPinsReadable says, for tools that read pins, why dir holds none: not
// a bpffs (often `ip netns exec`, which hides /sys/fs/bpf), or no pins.
func CheckPinsReadable(dir string) error {
	dir = cmpOr(dir, DefaultPinDir)
	if err := CheckPinDir(dir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if perr := CheckPinDir(filepath.Dir(dir)); perr != nil && strings.HasPrefix(dir, bpffsRoot+"/") {
				return fmt.Errorf("%w: %s is not a bpffs here (`ip netns exec` remounts /sys and hides it: run the command outside, or pass --bpf-pin-dir)", err, bpffsRoot)
			}
			return fmt.Errorf("%w: is the agent running on this node?", err)
		}
		return err
	}
	return nil
}
