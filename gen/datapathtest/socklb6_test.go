package datapathtest_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// The socket-LB tests over IPv6: backends on addresses of the namespace's
// loopback, an IPv6 ClusterIP, IPv6 sockets; and a dual-stack socket's
// IPv4-mapped destination balanced on the IPv4 maps.

func newSocklbEnv6(t *testing.T) *socklbEnv {
	e := newSocklbEnv(t)
	e.d.SetNodeIP6(node6)
	for _, a := range []string{"fd00:7::2/128", "fd00:7::3/128"} {
		e.ns.Run("ip", "addr", "add", a, "dev", "lo", "nodad")
	}
	return e
}

var (
	sb1v6 = netip.MustParseAddrPort("[fd00:7::2]:8080")
	sb2v6 = netip.MustParseAddrPort("[fd00:7::3]:8080")
)

func TestSocketLBIPv6ConnectGetpeernameAndRefusal(t *testing.T) {
	e := newSocklbEnv6(t)
	bpftest.ServeTCP(t, e.ns, "b1", sb1v6.String())
	bpftest.ServeTCP(t, e.ns, "b2", sb2v6.String())
	e.d.AddService(bpftest.Service{ID: 1, Front: vip6, Proto: protoTCP, Backends: []bpftest.Backend{{AP: sb1v6}, {AP: sb2v6}}})

	seen := map[string]bool{}
	for range 12 {
		out := e.cg.RunHelper(e.ns, "tcp", vip6.String())
		f := fields(out[0])
		if f["peer"] != vip6.String() || !strings.HasPrefix(f["answer"], "b") {
			t.Fatalf("helper said %q: want the ClusterIP %v as peer and a backend's answer", out, vip6)
		}
		seen[f["answer"]] = true
	}
	if !seen["b1"] || !seen["b2"] {
		t.Fatalf("12 connects reached %v, want both backends", seen)
	}

	empty := netip.MustParseAddrPort("[fd00:96::11]:80")
	e.d.AddService(bpftest.Service{ID: 2, Front: empty, Proto: protoTCP})
	if out := e.cg.RunHelper(e.ns, "tcp", empty.String()); !strings.Contains(out[0], "connection refused") {
		t.Fatalf("connect to a service without endpoints: %q, want connection refused", out)
	}
	if e.d.Counter(gen.SluiceCounterCNT_SOCK_REJECT_NO_ENDPOINTS) != 1 {
		t.Fatal("refusal not counted")
	}
}

func TestSocketLBIPv6UDPSendtoAndStaleBackend(t *testing.T) {
	e := newSocklbEnv6(t)
	dns := netip.MustParseAddrPort("[fd00:96::53]:53")
	b1 := netip.AddrPortFrom(sb1v6.Addr(), 5353)
	b2 := netip.AddrPortFrom(sb2v6.Addr(), 5353)
	bpftest.ServeUDPEcho(t, e.ns, "b1", b1.String())
	bpftest.ServeUDPEcho(t, e.ns, "b2", b2.String())
	e.d.AddService(bpftest.Service{ID: 2, Front: dns, Proto: protoUDP, Backends: []bpftest.Backend{{AP: b1}}})

	if f := fields(e.cg.RunHelper(e.ns, "udp-sendto", dns.String())[0]); f["from"] != dns.String() || f["answer"] != "b1" {
		t.Fatalf("reply %v: want it from the service address %v", f, dns)
	}

	h := e.cg.StartHelper(e.ns, "udp-connected", dns.String())
	if line, err := h.Line(); err != nil || line != "answer=b1 1" {
		t.Fatalf("first answer %q %v", line, err)
	}
	e.d.Put(e.d.Objs.SlBe6V1, gen.SluiceBeKey{SvcId: 2}, gen.SluiceBe6Value{Addr: gen.NetAddr6(b2.Addr()), Port: gen.NetPort(b2.Port())})
	fmt.Fprintln(h.Stdin)
	if line, err := h.Line(); err != nil || !strings.Contains(line, "operation not permitted") {
		t.Fatalf("send on the socket pinned to the removed backend: %q %v, want it to fail", line, err)
	}
	if line, err := h.Line(); err != nil || line != "answer=b2 3" {
		t.Fatalf("after reconnecting: %q %v, want b2", line, err)
	}
	if e.d.Counter(gen.SluiceCounterCNT_SOCK_STALE_BACKEND) != 1 {
		t.Fatal("stale backend not counted")
	}
}

// A dual-stack socket connecting to an IPv4 Service by its IPv4-mapped
// address: balanced on the IPv4 maps, and getpeername gives the mapped
// service address back.
func TestSocketLBIPv4MappedOnADualStackSocket(t *testing.T) {
	e := newSocklbEnv6(t)
	b1 := netip.MustParseAddrPort("127.0.0.2:8080")
	bpftest.ServeTCP(t, e.ns, "b1", b1.String())
	e.d.AddService(bpftest.Service{ID: 1, Front: vipAP, Proto: protoTCP, Backends: []bpftest.Backend{{AP: b1}}})
	out := e.cg.RunHelper(e.ns, "tcp-mapped", vipAP.String())
	f := fields(out[0])
	want := netip.AddrPortFrom(netip.AddrFrom16(vipAP.Addr().As16()), vipAP.Port()).String()
	if f["peer"] != want || f["answer"] != "b1" {
		t.Fatalf("helper said %q: want peer %s and b1's answer", out, want)
	}
}
