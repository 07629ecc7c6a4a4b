package netlab_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/netlab"
)

// requireRoot skips a test that needs root (namespaces, veths), or fails
// it under SLUICE_REQUIRE_BPF=1, as gen/bpftest.Require does: netlab is
// below bpftest, which builds on it.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("SLUICE_REQUIRE_BPF") == "1" {
		t.Fatal("network namespaces need root, and SLUICE_REQUIRE_BPF=1 forbids skipping")
	}
	t.Skip("network namespaces need root")
}

// A node with a pod, a bridge with the node and a host on it: the pod
// reaches the host through the node, a listener entered with Enter answers,
// and Close leaves no namespace behind.
func TestLabBuildsAReachableTopologyAndRemovesIt(t *testing.T) {
	requireRoot(t)
	lab := netlab.Lab{Prefix: fmt.Sprintf("slnl%d", os.Getpid()%100000)}
	defer lab.Close()
	must := func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	lan := must(lab.Bridge("lan"))
	node := must(lab.Router("node"))
	host := must(lab.Namespace("host"))
	must("", lab.Plug(node, "data0", netip.MustParsePrefix("192.0.2.1/24"), lan, "p0"))
	must("", lab.Plug(host, "eth0", netip.MustParsePrefix("192.0.2.2/24"), lan, "p1"))
	must(netlab.IP("-n", host, "route", "add", "10.9.0.0/16", "via", "192.0.2.1"))
	pod := must(lab.Pod(node, "slw0", "pod", netip.MustParsePrefix("10.9.0.2/24"), netip.MustParseAddr("10.9.0.1")))

	var ln net.Listener
	must("", netlab.Enter(netlab.Path(host), func() (err error) { ln, err = net.Listen("tcp4", "192.0.2.2:0"); return err }))
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	var got []byte
	err := netlab.Enter(netlab.Path(pod), func() error {
		c, err := net.DialTimeout("tcp4", ln.Addr().String(), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		got = make([]byte, 2)
		_, err = c.Read(got)
		return err
	})
	if err != nil || string(got) != "hi" {
		t.Fatalf("pod to host: %q %v", got, err)
	}

	lab.Close()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), lab.Prefix) {
		t.Fatalf("namespaces left after Close:\n%s", out)
	}
}
