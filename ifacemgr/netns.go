package ifacemgr

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// nsExec runs functions inside a network namespace. Interface indexes, TCX
// attachment and /proc/sys/net all resolve in the calling thread's namespace,
// so every such operation goes through do.
type nsExec struct {
	path string // "" is the current namespace
}

// InNetns runs fn on an OS thread inside the network namespace at path ("" is
// the current one); the thread is discarded afterwards.
func InNetns(path string, fn func() error) error { return nsExec{path: path}.do(fn) }

func (n nsExec) do(fn func() error) error {
	if n.path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the runtime ends a thread whose goroutine exits
		// while locked, so the namespace never leaks to other goroutines.
		runtime.LockOSThread()
		f, err := os.Open(n.path)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", n.path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// NetnsCookie returns the cookie of the network namespace at path ("" for the
// current one): what bpf_get_netns_cookie gives a socket there, so the
// socket-LB programs can tell the host's sockets from pods'.
func NetnsCookie(path string) (uint64, error) {
	var cookie uint64
	err := InNetns(path, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE); err != nil {
			return fmt.Errorf("SO_NETNS_COOKIE (Linux 5.14+): %w", err)
		}
		return nil
	})
	return cookie, err
}
