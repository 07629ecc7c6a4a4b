package main

import (
	"testing"
	"time"
)

// eventually fails the test unless cond holds within 10 s, polling.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
	}
}

// reaches tells whether an HTTP GET from the namespace at ns to addr is
// answered within 300 ms.
func reaches(ns, addr string) bool {
	_, err := get(ns, addr, "", 300*time.Millisecond)
	return err == nil
}
