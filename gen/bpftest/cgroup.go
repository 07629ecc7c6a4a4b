package bpftest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Cgroup is a child cgroup (v2) a test created; programs are attached to it,
// never to a cgroup the test did not create.
type Cgroup struct {
	Path string
	tb   testing.TB
}

// cgroupRoot finds the cgroup v2 mount.
func cgroupRoot() (string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 3 && fields[2] == "cgroup2" {
			return fields[1], nil
		}
	}
	return "", errors.New("no cgroup v2 mount")
}

// NewCgroup creates a child of the cgroup v2 root, removed when the test ends
// (after the processes started in it have exited).
func NewCgroup(tb testing.TB) *Cgroup {
	tb.Helper()
	Require(tb)
	root, err := cgroupRoot()
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(root, UniqueName("sluice-test-"))
	if err := os.Mkdir(path, 0o755); err != nil {
		tb.Fatalf("create cgroup: %v", err)
	}
	tb.Cleanup(func() {
		// A process that just exited may linger a moment in cgroup.procs.
		var err error
		for range 50 {
			if err = os.Remove(path); err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		tb.Errorf("remove cgroup %s: %v", path, err)
	})
	return &Cgroup{Path: path, tb: tb}
}

// HelperEnv is the environment variable a re-executed test binary sees when it
// is to act as a helper process; TestMain hands control to the helper.
const HelperEnv = "SLUICE_TEST_HELPER"

// Helper is a process running the test binary as a helper (see HelperEnv)
// inside a cgroup and, if ns is not nil, a network namespace.
type Helper struct {
	Cmd    *exec.Cmd
	Stdin  io.WriteCloser
	Stdout *bufio.Reader
}

// StartHelper starts os.Args[0] with HelperEnv=action and args in the cgroup
// (from its first instruction: clone3 with CLONE_INTO_CGROUP) and namespace.
func (cg *Cgroup) StartHelper(ns *NetNS, action string, args ...string) *Helper {
	cg.tb.Helper()
	dir, err := os.Open(cg.Path)
	if err != nil {
		cg.tb.Fatal(err)
	}
	defer dir.Close()
	self, err := os.Executable()
	if err != nil {
		cg.tb.Fatal(err)
	}
	argv := append([]string{self}, args...)
	if ns != nil {
		argv = append([]string{"ip", "netns", "exec", ns.Name}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), HelperEnv+"="+action)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	h := &Helper{Cmd: cmd}
	if h.Stdin, err = cmd.StdinPipe(); err != nil {
		cg.tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		cg.tb.Fatal(err)
	}
	h.Stdout = bufio.NewReader(out)
	if err := cmd.Start(); err != nil {
		cg.tb.Fatalf("start helper %s: %v", action, err)
	}
	cg.tb.Cleanup(func() { h.Stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return h
}

// Line reads the helper's next output line.
func (h *Helper) Line() (string, error) {
	line, err := h.Stdout.ReadString('\n')
	return strings.TrimSpace(line), err
}

// RunHelper runs a helper to completion and returns its output lines.
func (cg *Cgroup) RunHelper(ns *NetNS, action string, args ...string) []string {
	cg.tb.Helper()
	h := cg.StartHelper(ns, action, args...)
	h.Stdin.Close()
	var lines []string
	for {
		line, err := h.Line()
		if err != nil {
			break
		}
		lines = append(lines, line)
	}
	if err := h.Cmd.Wait(); err != nil {
		cg.tb.Fatalf("helper %s %v: %v (output %q)", action, args, err, lines)
	}
	return lines
}

// NetnsCookie returns the cookie of ns (what bpf_get_netns_cookie returns for
// its sockets).
func NetnsCookie(ns *NetNS) (uint64, error) {
	var cookie uint64
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		if err != nil {
			return fmt.Errorf("SO_NETNS_COOKIE: %w", err)
		}
		return nil
	})
	return cookie, err
}
