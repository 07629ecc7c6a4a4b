package bpftest

import (
	"os"
	"strings"
	"testing"
)

// Stdout runs fn and returns what it printed to standard output: tests use it
// to check the package examples, which need BPF privileges and so cannot be
// Go examples with an "Output:" comment (those would fail, not skip, without
// them).
func Stdout(tb testing.TB, fn func()) string {
	tb.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := r.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		done <- b.String()
	}()
	defer func() { os.Stdout = saved }()
	fn()
	w.Close()
	return <-done
}
