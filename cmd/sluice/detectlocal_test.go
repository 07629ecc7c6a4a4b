package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// kube-proxy's --detect-local-mode through the agent: a pod's request to a
// ClusterIP keeps the pod's address when the mode counts it as the
// cluster's own, and is masqueraded to the node IP (10.210.0.1) otherwise.
func TestDetectLocalModes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := newDemoAgent(ctx, t)
	setPodCIDR := func(cidr string) {
		node := "apiVersion: v1\nkind: Node\nmetadata: {name: sluice-demo}\nspec: {podCIDR: " + cidr + "}\n" +
			"status: {addresses: [{type: InternalIP, address: 10.210.0.1}]}\n"
		if err := os.WriteFile(filepath.Join(d.manifests, "000-node.yaml"), []byte(node), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The client pod is 10.200.0.2 behind slwclient.
	for _, c := range []struct {
		name    string
		podCIDR string
		flags   []string
		seen    string
	}{
		{"ClusterCIDR inside", "", []string{"--cluster-cidr", "10.200.0.0/16"}, "10.200.0.2"},
		{"ClusterCIDR outside", "", []string{"--cluster-cidr", "10.100.0.0/16"}, "10.210.0.1"},
		{"NodeCIDR inside", "10.200.0.0/24", []string{"--detect-local-mode", "NodeCIDR"}, "10.200.0.2"},
		{"NodeCIDR outside", "10.201.0.0/24", []string{"--detect-local-mode", "NodeCIDR"}, "10.210.0.1"},
		{"InterfaceNamePrefix matching", "", []string{"--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "slw"}, "10.200.0.2"},
		{"InterfaceNamePrefix other", "", []string{"--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "cali"}, "10.210.0.1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.podCIDR != "" {
				setPodCIDR(c.podCIDR)
				defer os.Remove(filepath.Join(d.manifests, "000-node.yaml"))
			}
			p := d.start(t, c.flags...)
			defer p.stop()
			if c.podCIDR != "" {
				waitFor(t, 10*time.Second, "the pod CIDR applied", func() bool { return strings.Contains(p.logs(), "local traffic is the Node's pod CIDR") }, p.logs)
			}
			// The pins show the previous agent's interface state until this
			// one has applied its own: ask until the answer settles.
			var body string
			waitFor(t, 10*time.Second, "the backend sees "+c.seen, func() bool {
				body, _ = get(d.pod("client"), "10.96.0.10:80", "", 2*time.Second)
				return strings.Contains(body, "saw client "+c.seen+":")
			}, func() string { return fmt.Sprintf("last answer %q\n%s", body, p.logs()) })
		})
	}
}
