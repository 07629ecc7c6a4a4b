package gen_test

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
// ipip, WireGuard and VPNs) reaches a NodePort; the replies go back the same
// way, and a Service without endpoints is refused with a RST built for the
// device's link layer.
func TestRealTrafficOverAnL3Device(t *testing.T) {
	d := newDP(t)
	topo := bpftest.NewTopology(t, d, "b1")
	b1 := netip.AddrPortFrom(topo.PodIP["b1"], 8080)
	bpftest.ServeTCP(t, topo.Pods["b1"], "b1", ":8080")

	remote := bpftest.NewNetNS(t)
	link := bpftest.NewTunLink(t, topo.Node, remote)
	nodeTun, remoteIP := "10.220.0.1", "10.220.0.2"
	topo.Node.Run("ip", "addr", "add", nodeTun, "peer", remoteIP, "dev", link.Name)
	remote.Run("ip", "addr", "add", remoteIP, "peer", nodeTun, "dev", link.PeerName)
	remote.Run("ip", "route", "add", "default", "dev", link.PeerName)
	remote.Run("ping", "-c1", "-W2", nodeTun) // the link works before Sluice is on it
	topo.Attach(t, link.Name, d.Objs.SlFromHostL3, d.Objs.SlToHostL3)
	d.Put(d.Objs.SlHostipV1, gen.SluiceHostipKey{Addr: gen.NetAddr(netip.MustParseAddr(nodeTun))}, gen.SluiceHostipValue{})

	d.AddService(bpftest.Service{ID: 1, Front: netip.MustParseAddrPort("255.255.255.255:30080"), Proto: protoTCP,
		Backends: []bpftest.Backend{{AP: b1, Local: true}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	d.AddService(bpftest.Service{ID: 2, Front: netip.MustParseAddrPort("255.255.255.255:30081"), Proto: protoTCP,
		Flags: gen.SluiceFeFlagsFE_EXTERNAL})

	for i := range 5 {
		answer, err := bpftest.Exchange(remote, "tcp4", nodeTun+":30080", "over-l3")
		if err != nil {
			logCounters(t, d)
			t.Fatalf("connection %d to the NodePort over the L3 device: %v", i, err)
		}
		if f := strings.Fields(answer); len(f) != 3 || f[0] != "b1" || f[1] != remoteIP {
			t.Fatalf("answer %q: the backend should see the remote client's address", answer)
		}
	}

	start := time.Now()
	_, err := bpftest.Exchange(remote, "tcp4", nodeTun+":30081", "x")
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("NodePort without endpoints over the L3 device: %v, want connection refused", err)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Fatalf("refusal took %v: it came from a timeout, not a RST", elapsed)
	}
	if d.Counter(gen.SluiceCounterCNT_DROP_MALFORMED) != 0 {
		t.Fatal("packets on the L3 device were taken for malformed ones")
	}
}
