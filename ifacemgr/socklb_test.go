package ifacemgr_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/ifacemgr"
)

func TestSocketLBAttachAndDetach(t *testing.T) {
	d := bpftest.NewDatapath(t, netip.MustParseAddr("10.0.0.1"))
	ns, cg := bpftest.NewNetNS(t), bpftest.NewCgroup(t)
	vip, be := netip.MustParseAddrPort("10.96.0.10:80"), netip.MustParseAddrPort("127.0.0.2:8080")
	bpftest.ServeTCP(t, ns, "b1", be.String())
	d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: be}}})

	// And an IPv6 service, to a backend on ::1.
	vip6, be6 := netip.MustParseAddrPort("[fd00:96::10]:80"), netip.MustParseAddrPort("[::1]:8080")
	bpftest.ServeTCP(t, ns, "b6", be6.String())
	d.AddService(bpftest.Service{ID: 2, Front: vip6, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: be6}}})

	o := d.Objs
	s, err := ifacemgr.AttachSocketLB(cg.Path, "", ifacemgr.SocketLBPrograms{Connect4: o.SlConnect4, Sendmsg4: o.SlSendmsg4,
		Recvmsg4: o.SlRecvmsg4, Getpeername4: o.SlGetpeername4, SockEgress: o.SlSockEgress,
		Connect6: o.SlConnect6, Sendmsg6: o.SlSendmsg6, Recvmsg6: o.SlRecvmsg6, Getpeername6: o.SlGetpeername6})
	if err != nil {
		t.Fatal(err)
	}
	if out := cg.RunHelper(ns, "tcp", vip.String()); !strings.Contains(out[0], "answer=b1") {
		t.Fatalf("attached: %q", out)
	}
	if out := cg.RunHelper(ns, "tcp", vip6.String()); !strings.Contains(out[0], "answer=b6") {
		t.Fatalf("attached, IPv6: %q", out)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if out := cg.RunHelper(ns, "tcp", vip.String()); !strings.Contains(out[0], "network is unreachable") {
		t.Fatalf("detached, yet the service was reached: %q", out)
	}
	if out := cg.RunHelper(ns, "tcp", vip6.String()); !strings.Contains(out[0], "network is unreachable") {
		t.Fatalf("detached, yet the IPv6 service was reached: %q", out)
	}
}

// Pinned, the socket-LB programs outlive the agent's handles, are adopted
// when it comes back, and go with RemoveSocketLB.
func TestSocketLBPinnedSurvivesTheAgent(t *testing.T) {
	d := bpftest.NewDatapath(t, netip.MustParseAddr("10.0.0.1"))
	ns, cg, pins := bpftest.NewNetNS(t), bpftest.NewCgroup(t), bpftest.PinDir(t)
	vip, be := netip.MustParseAddrPort("10.96.0.10:80"), netip.MustParseAddrPort("127.0.0.2:8080")
	bpftest.ServeTCP(t, ns, "b1", be.String())
	d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: be}}})
	o := d.Objs
	progs := ifacemgr.SocketLBPrograms{Connect4: o.SlConnect4, Sendmsg4: o.SlSendmsg4, Recvmsg4: o.SlRecvmsg4,
		Getpeername4: o.SlGetpeername4, SockEgress: o.SlSockEgress}
	s, err := ifacemgr.AttachSocketLB(cg.Path, pins, progs)
	if err != nil {
		t.Fatal(err)
	}
	s.Close() // the agent stops
	if out := cg.RunHelper(ns, "tcp", vip.String()); !strings.Contains(out[0], "answer=b1") {
		t.Fatalf("after the agent's handles closed: %q", out)
	}
	s, err = ifacemgr.AttachSocketLB(cg.Path, pins, progs) // and comes back
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := ifacemgr.RemoveSocketLB(pins); err != nil {
		t.Fatal(err)
	}
	if out := cg.RunHelper(ns, "tcp", vip.String()); !strings.Contains(out[0], "network is unreachable") {
		t.Fatalf("after removal: %q", out)
	}
}
