package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-net/sluice/agent"
	"github.com/sluice-net/sluice/netlab"
)

// A HostEndpoint for every data interface that admits only the external
// host's web traffic to the NodePort, written as a user would.
const hostEndpoint = `apiVersion: sluice.dev/v1alpha1
kind: HostEndpoint
metadata: {name: edge}
spec:
  interfaceName: "*"
  ingress:
  - from: [{ipBlock: {cidr: 10.210.0.2/32}}]
    ports: [{protocol: TCP, port: 30080}]
`

// Host endpoints through the agent, on real traffic from the external host
// to the node: --default-host-endpoint=deny-ingress closes the node's own
// ports but not the failsafe one; a HostEndpoint for "*" admits the NodePort
// it names (judged before DNAT) and still not the node's other ports; a
// wrong one that denies everything cannot close the failsafe port either.
func TestHostEndpointsAndFailsafe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	topo, cfg, manifests := demoAgentSetup(ctx, t)
	node, external := topo.ns(topo.node), topo.ns(topo.pods["external"])
	const failsafe = 2222
	cfg.FailsafePorts = []uint16{failsafe}
	cfg.DefaultHostEndpoint = "deny-ingress"
	for _, addr := range []string{"10.210.0.1:8081", "10.210.0.1:2222"} {
		var ln net.Listener
		if err := netlab.Enter(node, func() (err error) { ln, err = net.Listen("tcp4", addr); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nnode\n"))
				c.Close()
			}
		}()
	}
	a, err := agent.Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const own, safe, nodePort = "10.210.0.1:8081", "10.210.0.1:2222", "10.210.0.1:30080"

	eventually(t, "the default host endpoint closes the node's own port", func() bool { return !reaches(external, own) })
	if !reaches(external, safe) {
		t.Fatal("the default host endpoint closed the failsafe port")
	}
	if reaches(external, nodePort) {
		t.Fatal("the default host endpoint let the NodePort in")
	}

	if err := os.WriteFile(filepath.Join(manifests, "host.yaml"), []byte(hostEndpoint), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the HostEndpoint admits the NodePort it names", func() bool { return reaches(external, nodePort) })
	if reaches(external, own) || !reaches(external, safe) {
		t.Fatalf("under the HostEndpoint: own port reached %v (want false), failsafe %v (want true)", reaches(external, own), reaches(external, safe))
	}

	wrong := "apiVersion: sluice.dev/v1alpha1\nkind: HostEndpoint\nmetadata: {name: edge}\nspec: {interfaceName: \"*\", policyTypes: [Ingress, Egress]}\n"
	if err := os.WriteFile(filepath.Join(manifests, "host.yaml"), []byte(wrong), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a deny-everything HostEndpoint closes the NodePort", func() bool { return !reaches(external, nodePort) })
	if !reaches(external, safe) {
		t.Fatal("a deny-everything HostEndpoint locked out the failsafe port")
	}
}
