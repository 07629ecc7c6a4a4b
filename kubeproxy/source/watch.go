package source

import (
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// folderWatch tells, with inotify, when anything in a manifests folder may
// have changed: files written, created, removed or renamed in the folder (where
// a symbolic link to it points) and every folder below it, and the folder
// itself renamed, removed or replaced (seen from its parent). It only says
// "look again": the source re-reads what its stamps show changed.
type folderWatch struct {
	dir     string // as configured (may be a symbolic link)
	inotify *os.File
	fd      int           // inotify's descriptor: os.File.Fd would make reads blocking
	changed chan struct{} // one pending notice is enough

	mu     sync.Mutex
	parent int32            // watch on dir's parent: only events naming dir count
	dirs   map[string]int32 // watched folders under dir, by path
}

const (
	folderEvents = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_MOVED_FROM |
		unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF
	parentEvents = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_ATTRIB
)

// newFolderWatch starts watching dir. It fails when inotify is not available
// (or its limits are reached); the source then polls.
func newFolderWatch(dir string) (*folderWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, &os.SyscallError{Syscall: "inotify_init1", Err: err}
	}
	w := &folderWatch{dir: dir, inotify: os.NewFile(uintptr(fd), "inotify"), fd: fd, changed: make(chan struct{}, 1), dirs: map[string]int32{}}
	parent, err := unix.InotifyAddWatch(fd, filepath.Dir(dir), parentEvents|unix.IN_ONLYDIR)
	if err != nil {
		w.inotify.Close()
		return nil, &os.PathError{Op: "inotify_add_watch", Path: filepath.Dir(dir), Err: err}
	}
	w.parent = int32(parent)
	if _, err := w.refresh(); err != nil {
		w.inotify.Close()
		return nil, err
	}
	go w.read()
	return w, nil
}

// refresh watches every folder now under dir: after a sync, the folder may
// have come back or gained subfolders. It reports whether it added a watch,
// since what changed in a new folder before its watch existed was not seen.
func (w *folderWatch) refresh() (added bool, err error) {
	root, err := filepath.EvalSymlinks(w.dir)
	if err != nil {
		return false, nil // gone: the parent's watch tells when it is back
	}
	var limit error
	walkErr := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if path != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		wd, err := unix.InotifyAddWatch(w.fd, path, folderEvents|unix.IN_ONLYDIR)
		if err != nil {
			if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) {
				limit = &os.PathError{Op: "inotify_add_watch", Path: path, Err: err}
				return filepath.SkipAll
			}
			return nil // removed while walking
		}
		w.mu.Lock()
		if old, ok := w.dirs[path]; !ok || old != int32(wd) {
			w.dirs[path] = int32(wd)
			added = true
		}
		w.mu.Unlock()
		return nil
	})
	if limit != nil {
		return added, limit
	}
	return added, walkErr
}

// read turns inotify events into notices until the watch is closed.
func (w *folderWatch) read() {
	buf := make([]byte, 64<<10)
	base := filepath.Base(w.dir)
	for {
		n, err := w.inotify.Read(buf)
		if err != nil {
			return
		}
		notice := false
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:min(n, off+unix.SizeofInotifyEvent+nameLen)]), "\x00")
			off += unix.SizeofInotifyEvent + nameLen
			switch {
			case mask&unix.IN_Q_OVERFLOW != 0:
				notice = true
			case mask&unix.IN_IGNORED != 0:
				w.forget(wd)
			case wd == w.parent:
				notice = notice || name == base
			default:
				notice = true
			}
		}
		if notice {
			select {
			case w.changed <- struct{}{}:
			default:
			}
		}
	}
}

// forget drops a watch the kernel removed (its folder went away), so that
// refresh counts it as new when the folder returns.
func (w *folderWatch) forget(wd int32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for path, d := range w.dirs {
		if d == wd {
			delete(w.dirs, path)
		}
	}
}

func (w *folderWatch) Close() error { return w.inotify.Close() }
