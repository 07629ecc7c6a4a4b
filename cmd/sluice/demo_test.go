package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/gen/bpftest"
)

// The README's first command works, and leaves nothing behind.
func TestDemo(t *testing.T) {
	bpftest.Require(t)
	if err := runDemo(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "sluice-demo") {
		t.Fatalf("demo namespaces left behind: %s", out)
	}
}
