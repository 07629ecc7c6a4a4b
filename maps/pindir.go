package maps

import (
	"fmt"
	"os"

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
