package main

import (
	"testing"
	"time"
)

// eventually fails the test unless cond holds within 10 s, polling.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitFor(t, 10*time.Second, what, cond, nil)
}

// waitFor fails the test unless cond holds within timeout, polling every
// 20 ms: the failure says what was awaited, then detail() when there is one
// (an agent's log, the last answer).
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool, detail func() string) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			if detail != nil {
				t.Fatalf("not within %v: %s\n%s", timeout, what, detail())
			}
			t.Fatalf("not within %v: %s", timeout, what)
		}
	}
}

// reaches tells whether an HTTP GET from the namespace at ns to addr is
// answered within 300 ms.
func reaches(ns, addr string) bool {
	_, err := get(ns, addr, "", 300*time.Millisecond)
	return err == nil
}
