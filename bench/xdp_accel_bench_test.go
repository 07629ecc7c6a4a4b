package bench

import (
	"net"
	"net/netip"
	"testing"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/netlab"
)

// enterNetNS moves the calling goroutine's thread into ns until the
// returned function is called (netlab.Switch): a benchmark's FIB lookups then
// see ns's routes.
func enterNetNS(b *testing.B, ns *bpftest.NetNS) func() {
	b.Helper()
	back, err := netlab.Switch(ns.Path())
	if err != nil {
		b.Fatal(err)
	}
	return func() {
		if err := back(); err != nil {
			b.Error(err)
		}
	}
}

// BenchmarkXDPAccel: an established NodePort flow to a backend on another
// node, SNATed, both ways: the TC path (sl_from_host: translation, then the
// FIB's redirect) against the XDP acceleration (sl_xdp_accel: the same
// translation and next hop, and a redirect through sl_xdpdev_v1), in one
// run, each paired with the floor. BPF_PROG_TEST_RUN without a context
// gives both the loopback as their ingress interface: the FIB sends the
// frames out of the node's data interface, so XDP redirects (XDP_TX, a
// frame leaving the interface it came in by, is not measured apart). The
// program's own time only: the skb that TC needs and XDP does not (its
// allocation, GRO, the stack's receive path) is outside what this
// measures, and is where a real driver's gain is.
func BenchmarkXDPAccel(b *testing.B) {
	d := bpftest.NewDatapath(b, nodeIP)
	node, peer := bpftest.NewNetNS(b), bpftest.NewNetNS(b)
	data := bpftest.NewVeth(b, node, peer)
	for _, cmd := range [][]string{
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"ip", "addr", "add", nodeIP.String() + "/24", "dev", data.Name},
		{"ip", "neigh", "replace", "10.0.0.254", "lladdr", "02:00:00:00:fe:01", "dev", data.Name, "nud", "permanent"},
		{"ip", "neigh", "replace", "10.0.0.253", "lladdr", "02:00:00:00:fe:02", "dev", data.Name, "nud", "permanent"},
		{"ip", "route", "add", "198.51.100.0/24", "via", "10.0.0.254", "dev", data.Name},
		{"ip", "route", "add", "10.3.0.0/16", "via", "10.0.0.253", "dev", data.Name},
	} {
		node.Run(cmd...)
	}
	if err := node.Do(func() error {
		ifc, err := net.InterfaceByName(data.Name)
		if err != nil {
			return err
		}
		return d.Objs.SlXdpdevV1.Put(uint32(ifc.Index), uint32(ifc.Index))
	}); err != nil {
		b.Fatal(err)
	}
	front := netip.AddrPortFrom(nodeIP, 30080)
	remote := netip.MustParseAddrPort("10.3.0.4:8080")
	d.AddService(bpftest.Service{ID: 1, Front: front, Proto: bpftest.ProtoTCP,
		Backends: []bpftest.Backend{{AP: remote}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})

	// The flow, established through TC: its handshake sets the states that
	// let XDP carry it.
	var snat netip.AddrPort
	leave := enterNetNS(b, node)
	for _, f := range []struct {
		frame func() []byte
	}{
		{func() []byte { return bpftest.TCPPacket(External, front, bpftest.SYN) }},
		{func() []byte {
			fwd, ok := d.CT(bpftest.CtKey(External, front, bpftest.ProtoTCP))
			if !ok {
				b.Fatal("no flow")
			}
			snat = netip.AddrPortFrom(gen.AddrFromNet(fwd.SnatAddr), gen.PortFromNet(fwd.SnatPort))
			return bpftest.TCPPacket(remote, snat, bpftest.SYN|bpftest.ACK)
		}},
		{func() []byte { return bpftest.TCPPacket(External, front, bpftest.ACK) }},
	} {
		if ret, _ := d.Run(d.Objs.SlFromHost, f.frame()); ret != bpftest.ActRedirect {
			leave()
			b.Fatalf("handshake at TC: verdict %d, want the FIB's redirect", ret)
		}
	}
	leave()

	const xdpRedirect = 4
	for _, path := range []struct {
		name  string
		frame []byte
	}{
		{"established", bpftest.TCPPacket(External, front, bpftest.ACK|bpftest.PSH)},
		{"reply", bpftest.TCPPacket(remote, snat, bpftest.ACK|bpftest.PSH)},
	} {
		b.Run("tc-"+path.name, func(b *testing.B) {
			defer enterNetNS(b, node)()
			measure(b, d.Objs.SlFromHost, bpftest.ActRedirect, fixed(path.frame))
		})
		b.Run("xdp-"+path.name, func(b *testing.B) {
			defer enterNetNS(b, node)()
			measure(b, d.Objs.SlXdpAccel, xdpRedirect, fixed(path.frame))
		})
	}
}
