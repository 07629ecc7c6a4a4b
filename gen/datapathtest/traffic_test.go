package datapathtest_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

func TestRealTrafficThroughTheDatapath(t *testing.T) {
	d := newDP(t)
	topo := bpftest.NewTopology(t, d, "client", "b1", "b2")
	b1 := netip.AddrPortFrom(topo.PodIP["b1"], 8080)
	b2 := netip.AddrPortFrom(topo.PodIP["b2"], 8080)
	bpftest.ServeTCP(t, topo.Pods["b1"], "b1", ":8080")
	bpftest.ServeTCP(t, topo.Pods["b2"], "b2", ":8080")
	bpftest.ServeUDPEcho(t, topo.Pods["b1"], "b1", ":5353")

	vip := netip.MustParseAddrPort("10.96.0.10:80")
	d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: protoTCP, Backends: []bpftest.Backend{{AP: b1, Local: true}, {AP: b2, Local: true}}})
	dns := netip.MustParseAddrPort("10.96.0.10:53")
	d.AddService(bpftest.Service{ID: 2, Front: dns, Proto: protoUDP, Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(topo.PodIP["b1"], 5353), Local: true}}})
	d.AddService(bpftest.Service{ID: 3, Front: netip.MustParseAddrPort("255.255.255.255:30080"), Proto: protoTCP,
		Backends: []bpftest.Backend{{AP: b1, Local: true}, {AP: b2, Local: true}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	empty := netip.MustParseAddrPort("10.96.0.11:80")
	d.AddService(bpftest.Service{ID: 4, Front: empty, Proto: protoTCP})
	self := netip.MustParseAddrPort("10.96.0.12:80")
	d.AddService(bpftest.Service{ID: 5, Front: self, Proto: protoTCP, Backends: []bpftest.Backend{{AP: b1, Local: true}}})
	selfDNS := netip.MustParseAddrPort("10.96.0.12:53")
	d.AddService(bpftest.Service{ID: 6, Front: selfDNS, Proto: protoUDP, Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(topo.PodIP["b1"], 5353), Local: true}}})
	client := topo.Pods["client"]
	clientIP := topo.PodIP["client"].String()

	t.Run("ClusterIP TCP reaches both backends, data both ways", func(t *testing.T) {
		seen := map[string]bool{}
		for i := range 20 {
			answer, err := bpftest.Exchange(client, "tcp4", vip.String(), fmt.Sprintf("hello-%d", i))
			if err != nil {
				t.Fatal(err)
			}
			f := strings.Fields(answer)
			if len(f) != 3 || f[1] != clientIP || f[2] != fmt.Sprintf("hello-%d", i) {
				t.Fatalf("answer %q", answer)
			}
			seen[f[0]] = true
		}
		if !seen["b1"] || !seen["b2"] {
			t.Fatalf("20 connections reached only %v", seen)
		}
	})

	t.Run("UDP echo through a ClusterIP", func(t *testing.T) {
		answer, err := bpftest.Exchange(client, "udp4", dns.String(), "query")
		if err != nil {
			t.Fatal(err)
		}
		if answer != "b1 query" {
			t.Fatalf("answer %q", answer)
		}
	})

	// A pod reaching itself through its own Service arrives from the node's
	// address; through the node's stack that packet would be dropped as a
	// spoof of the node's own address (and is, without hairpin_return).
	t.Run("a pod reaches itself through its Service (hairpin)", func(t *testing.T) {
		before := d.Counter(gen.SluiceCounterCNT_HAIRPIN_RETURNED)
		for i := range 3 {
			answer, err := bpftest.Exchange(topo.Pods["b1"], "tcp4", self.String(), fmt.Sprintf("me-%d", i))
			if err != nil {
				t.Fatalf("connection %d to its own Service: %v", i, err)
			}
			if f := strings.Fields(answer); len(f) != 3 || f[0] != "b1" || f[1] != topo.NodeIP.String() {
				t.Fatalf("answer %q: want b1 answering the node's address", answer)
			}
		}
		answer, err := bpftest.Exchange(topo.Pods["b1"], "udp4", selfDNS.String(), "query")
		if err != nil || answer != "b1 query" {
			t.Fatalf("UDP to its own Service: %q, %v", answer, err)
		}
		if d.Counter(gen.SluiceCounterCNT_HAIRPIN_RETURNED) == before {
			t.Fatal("hairpin packets not counted")
		}
	})

	t.Run("external host reaches a NodePort, source kept", func(t *testing.T) {
		np := netip.AddrPortFrom(topo.NodeIP, 30080).String()
		answer, err := bpftest.Exchange(topo.External, "tcp4", np, "from-outside")
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(answer); len(f) != 3 || f[1] != "10.210.0.2" {
			t.Fatalf("answer %q: backend should see the external client's address", answer)
		}
		// The replies left the backend with the node IP as source: routed by
		// the FIB, not dropped by the node as spoofs of its own address.
		if d.Counter(gen.SluiceCounterCNT_FIB_FORWARDED) == 0 {
			t.Fatal("NodePort replies not routed by fib_forward")
		}
	})

	t.Run("service without endpoints refuses at once", func(t *testing.T) {
		start := time.Now()
		_, err := bpftest.Exchange(client, "tcp4", empty.String(), "x")
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("connect to a service without endpoints: %v, want connection refused", err)
		}
		if elapsed := time.Since(start); elapsed > 2*time.Second {
			t.Fatalf("refusal took %v: it came from a timeout, not a RST", elapsed)
		}
		if d.Counter(gen.SluiceCounterCNT_REJECT_NO_ENDPOINTS) == 0 {
			t.Fatal("reject not counted")
		}
	})
}

// csumErrors reads the TCP and UDP checksum errors a namespace's stack has
// counted (/proc/net/snmp: InCsumErrors).
func csumErrors(t *testing.T, ns *bpftest.NetNS) map[string]string {
	t.Helper()
	out := ns.Run("cat", "/proc/net/snmp")
	errs := map[string]string{}
	var header []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || (f[0] != "Tcp:" && f[0] != "Udp:") {
			continue
		}
		if header == nil || header[0] != f[0] {
			header = f
			continue
		}
		for i, name := range header {
			if name == "InCsumErrors" && i < len(f) {
				errs[f[0]] = f[i]
			}
		}
		header = nil
	}
	for _, line := range strings.Split(ns.Run("cat", "/proc/net/snmp6"), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "Udp6InCsumErrors" {
			errs["Udp6:"] = f[1]
		}
	}
	if len(errs) != 3 {
		t.Fatalf("InCsumErrors of TCP, UDP and UDPv6 missing from /proc/net/snmp{,6} of %s: %v", ns.Name, errs)
	}
	return errs
}

// The datapath computes the L4 checksum of a translated packet itself
// (rewrite_tuple), from what the checksum field holds: the pseudo header's
// sum alone when the sender left it to the device (CHECKSUM_PARTIAL), the
// checksum itself when the sender computed it. Between veths nothing checks
// either: the node's devices here complete partial checksums in software
// before sending, and the pods' devices no longer take received packets as
// verified, so a wrong checksum in either form is a dropped packet and a
// counted error. Both directions of TCP and UDP flows are translated
// (ClusterIP forward, reverse NAT on the replies), over IPv4 and IPv6.
func TestTranslatedChecksumsAsTheReceiverVerifiesThem(t *testing.T) {
	d := newDP(t)
	topo := bpftest.NewTopology(t, d, "client", "b1")
	topo.EnableIPv6(t)
	for _, any := range []string{"", "[::]"} {
		bpftest.ServeTCP(t, topo.Pods["b1"], "b1", any+":8080")
		bpftest.ServeUDPEcho(t, topo.Pods["b1"], "b1", any+":5353")
	}
	families := []struct {
		tcp, udp, vip, dns string
	}{
		{"tcp4", "udp4", "10.96.0.10:80", "10.96.0.10:53"},
		{"tcp6", "udp6", "[fd00:96::10]:80", "[fd00:96::10]:53"},
	}
	for i, backend := range []netip.Addr{topo.PodIP["b1"], topo.PodIP6["b1"]} {
		d.AddService(bpftest.Service{ID: uint32(2*i + 1), Front: netip.MustParseAddrPort(families[i].vip), Proto: protoTCP,
			Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(backend, 8080), Local: true}}})
		d.AddService(bpftest.Service{ID: uint32(2*i + 2), Front: netip.MustParseAddrPort(families[i].dns), Proto: protoUDP,
			Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(backend, 5353), Local: true}}})
	}
	for _, name := range []string{"client", "b1"} {
		topo.Node.SetChecksumOffload(t, topo.PodIface[name], false, false)
	}

	// By the node's stack, an established translated packet's store is the
	// span writer's (sl_write_span: direct writes, on packets TCP has
	// cloned); by local delivery, the helper's.
	for _, route := range []struct {
		name  string
		flags gen.SluiceConfigFlags
	}{{"local delivery", 0}, {"stack routing", gen.SluiceConfigFlagsCFG_STACK_ROUTING}} {
		setConfigFlags(t, d, route.flags)
		t.Run(route.name, func(t *testing.T) { checksumsThroughClusterIP(t, topo, families) })
	}
}

// checksumsThroughClusterIP is TestTranslatedChecksumsAsTheReceiverVerifiesThem
// for one routing.
func checksumsThroughClusterIP(t *testing.T, topo *bpftest.Topology, families []struct{ tcp, udp, vip, dns string }) {
	for _, sender := range []struct {
		name string
		tx   bool // the pods' transmit offload: on, they leave the checksum partial
	}{{"partial checksums (offloaded by the sender)", true}, {"full checksums (computed by the sender)", false}} {
		t.Run(sender.name, func(t *testing.T) {
			for _, name := range []string{"client", "b1"} {
				topo.Pods[name].SetChecksumOffload(t, "eth0", sender.tx, false)
			}
			before := map[string]map[string]string{"client": csumErrors(t, topo.Pods["client"]), "b1": csumErrors(t, topo.Pods["b1"])}
			for _, f := range families {
				for i := range 3 {
					msg := fmt.Sprintf("hello-%d", i)
					answer, err := bpftest.Exchange(topo.Pods["client"], f.tcp, f.vip, msg)
					if err != nil {
						t.Fatalf("%s through the ClusterIP: %v (checksum errors: client %v, backend %v)", f.tcp, err,
							csumErrors(t, topo.Pods["client"]), csumErrors(t, topo.Pods["b1"]))
					}
					if fs := strings.Fields(answer); len(fs) != 3 || fs[0] != "b1" || fs[2] != msg {
						t.Fatalf("%s answer %q", f.tcp, answer)
					}
					answer, err = bpftest.Exchange(topo.Pods["client"], f.udp, f.dns, msg)
					if err != nil || answer != "b1 "+msg {
						t.Fatalf("%s through the ClusterIP: %q, %v (checksum errors: client %v, backend %v)", f.udp, answer, err,
							csumErrors(t, topo.Pods["client"]), csumErrors(t, topo.Pods["b1"]))
					}
				}
				// A datagram above the MTU: its first fragment carries
				// the whole datagram's checksum, both ways.
				query := bytes.Repeat([]byte("fragmented "), 300)
				answer, err := exchangeDatagram(topo.Pods["client"], f.udp, f.dns, query)
				if err != nil || !bytes.Equal(answer, append([]byte("b1 "), query...)) {
					t.Fatalf("%d-byte %s datagram through the ClusterIP: %d bytes back, %v (checksum errors: client %v, backend %v)",
						len(query), f.udp, len(answer), err, csumErrors(t, topo.Pods["client"]), csumErrors(t, topo.Pods["b1"]))
				}
			}
			for name, was := range before {
				if now := csumErrors(t, topo.Pods[name]); fmt.Sprint(now) != fmt.Sprint(was) {
					t.Errorf("%s counted checksum errors: %v, before %v", name, now, was)
				}
			}
		})
	}
}

// exchangeDatagram sends one datagram from ns to addr and returns the answer.
func exchangeDatagram(ns *bpftest.NetNS, network, addr string, payload []byte) ([]byte, error) {
	var answer []byte
	err := ns.Do(func() error {
		c, err := net.Dial(network, addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write(payload); err != nil {
			return err
		}
		buf := make([]byte, 65536)
		n, err := c.Read(buf)
		answer = buf[:n]
		return err
	})
	return answer, err
}
