package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
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

// The README's first command builds with the tag sluice_nokube: without
// client-go's clientset, informers and the API groups Sluice reads nothing
// of (most of a first build), and that binary runs the demo.
func TestDemoBuildWithoutKubernetesClient(t *testing.T) {
	bpftest.Require(t)
	deps, err := exec.Command("go", "list", "-tags", "sluice_nokube", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(deps)) {
		for _, heavy := range []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/informers",
			"k8s.io/client-go/applyconfigurations", "k8s.io/client-go/dynamic", "k8s.io/api/apps"} {
			if pkg == heavy || strings.HasPrefix(pkg, heavy+"/") {
				t.Errorf("the demo build imports %s", pkg)
			}
		}
	}
	bin := filepath.Join(t.TempDir(), "sluice")
	if out, err := exec.Command("go", "build", "-tags", "sluice_nokube", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags sluice_nokube: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "demo").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "all demo steps passed") {
		t.Fatalf("demo of the sluice_nokube build: %v\n%s", err, out)
	}
	// Asked to watch an API server, that binary says why it cannot, before
	// it pins anything.
	pins := filepath.Join("/sys/fs/bpf", "sluice-nokube-test-"+filepath.Base(t.TempDir()))
	out, err = exec.Command(bin, "agent", "--kubeconfig", "/nonexistent", "--bpf-pin-dir", pins,
		"--healthz-bind-address", "", "--metrics-bind-address", "").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "sluice_nokube") {
		t.Fatalf("agent of the sluice_nokube build with --kubeconfig: %v\n%s", err, out)
	}
	if _, err := os.Stat(pins); !os.IsNotExist(err) {
		os.RemoveAll(pins)
		t.Fatalf("the refused agent made its pin folder %s (%v)", pins, err)
	}
}
