package datapathtest_test

import (
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// An external host behind an L3 device (no Ethernet header: TUN here, as
// ipip, WireGuard and VPNs) reaches a NodePort over IPv4 and over IPv6; the
// replies go back the same way, and a Service without endpoints is refused
// with a RST built for the device's link layer.
func TestRealTrafficOverAnL3Device(t *testing.T) {
	d := newDP(t)
	topo := bpftest.NewTopology(t, d, "b1")
	topo.EnableIPv6(t)
	bpftest.ServeTCP(t, topo.Pods["b1"], "b1", ":8080")
	bpftest.ServeTCP(t, topo.Pods["b1"], "b1", "[::]:8080")

	remote := bpftest.NewNetNS(t)
	link := bpftest.NewTunLink(t, topo.Node, remote)
	families := []struct {
		name, network     string
		nodeTun, remoteIP netip.Addr
		backend           netip.Addr
		wildcard          netip.Addr
		ip                []string // ip(8) with its family option
	}{
		{"IPv4", "tcp4", netip.MustParseAddr("10.220.0.1"), netip.MustParseAddr("10.220.0.2"),
			topo.PodIP["b1"], netip.MustParseAddr("255.255.255.255"), []string{"ip", "-4"}},
		{"IPv6", "tcp6", netip.MustParseAddr("fd00:220::1"), netip.MustParseAddr("fd00:220::2"),
			topo.PodIP6["b1"], wildcard, []string{"ip", "-6"}},
	}
	for _, f := range families {
		nodeTun, remoteIP := f.nodeTun.String(), f.remoteIP.String()
		topo.Node.Run(append(f.ip[:len(f.ip):len(f.ip)], "addr", "add", nodeTun, "peer", remoteIP, "dev", link.Name, "nodad")...)
		remote.Run(append(f.ip[:len(f.ip):len(f.ip)], "addr", "add", remoteIP, "peer", nodeTun, "dev", link.PeerName, "nodad")...)
		remote.Run(append(f.ip[:len(f.ip):len(f.ip)], "route", "add", "default", "dev", link.PeerName)...)
		remote.Run("ping", "-c1", "-W2", nodeTun) // the link works before Sluice is on it
	}
	topo.Attach(t, link.Name, d.Objs.SlFromHostL3, d.Objs.SlToHostL3)
	d.Put(d.Objs.SlHostipV1, gen.SluiceHostipKey{Addr: gen.NetAddr(families[0].nodeTun)}, gen.SluiceHostipValue{})
	d.Put(d.Objs.SlHostip6V1, gen.SluiceHostip6Key{Addr: gen.NetAddr6(families[1].nodeTun)}, gen.SluiceHostipValue{})

	for i, f := range families {
		t.Run(f.name, func(t *testing.T) {
			id := uint32(10 * (i + 1))
			d.AddService(bpftest.Service{ID: id, Front: netip.AddrPortFrom(f.wildcard, 30080), Proto: protoTCP,
				Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(f.backend, 8080), Local: true}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
			d.AddService(bpftest.Service{ID: id + 1, Front: netip.AddrPortFrom(f.wildcard, 30081), Proto: protoTCP,
				Flags: gen.SluiceFeFlagsFE_EXTERNAL})

			for i := range 5 {
				answer, err := bpftest.Exchange(remote, f.network, netip.AddrPortFrom(f.nodeTun, 30080).String(), "over-l3")
				if err != nil {
					logCounters(t, d)
					t.Fatalf("connection %d to the NodePort over the L3 device: %v", i, err)
				}
				if fs := strings.Fields(answer); len(fs) != 3 || fs[0] != "b1" || fs[1] != f.remoteIP.String() {
					t.Fatalf("answer %q: the backend should see the remote client's address", answer)
				}
			}

			start := time.Now()
			_, err := bpftest.Exchange(remote, f.network, netip.AddrPortFrom(f.nodeTun, 30081).String(), "x")
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("NodePort without endpoints over the L3 device: %v, want connection refused", err)
			}
			if elapsed := time.Since(start); elapsed > 2*time.Second {
				t.Fatalf("refusal took %v: it came from a timeout, not a RST", elapsed)
			}
			if d.Counter(gen.SluiceCounterCNT_DROP_MALFORMED) != 0 {
				t.Fatal("packets on the L3 device were taken for malformed ones")
			}
		})
	}
}
