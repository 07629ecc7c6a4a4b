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

// TestRealIPv6TrafficThroughTheDatapath is TestRealTrafficThroughTheDatapath
// over IPv6, on a dual-stack topology: real sockets, real veths, the
// programs attached by TCX, IPv4 Services beside the IPv6 ones.
func TestRealIPv6TrafficThroughTheDatapath(t *testing.T) {
	d := newDP(t)
	topo := bpftest.NewTopology(t, d, "client", "b1", "b2")
	topo.EnableIPv6(t)
	b1 := netip.AddrPortFrom(topo.PodIP6["b1"], 8080)
	b2 := netip.AddrPortFrom(topo.PodIP6["b2"], 8080)
	bpftest.ServeTCP(t, topo.Pods["b1"], "b1", "[::]:8080")
	bpftest.ServeTCP(t, topo.Pods["b2"], "b2", "[::]:8080")
	bpftest.ServeTCP(t, topo.Pods["b1"], "b1-v4", ":8080")
	bpftest.ServeUDPEcho(t, topo.Pods["b1"], "b1", "[::]:5353")

	vip := netip.MustParseAddrPort("[fd00:96::10]:80")
	d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: protoTCP, Backends: []bpftest.Backend{{AP: b1, Local: true}, {AP: b2, Local: true}}})
	dns := netip.MustParseAddrPort("[fd00:96::10]:53")
	d.AddService(bpftest.Service{ID: 2, Front: dns, Proto: protoUDP, Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(topo.PodIP6["b1"], 5353), Local: true}}})
	d.AddService(bpftest.Service{ID: 3, Front: netip.AddrPortFrom(wildcard, 30080), Proto: protoTCP,
		Backends: []bpftest.Backend{{AP: b1, Local: true}, {AP: b2, Local: true}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	empty := netip.MustParseAddrPort("[fd00:96::11]:80")
	d.AddService(bpftest.Service{ID: 4, Front: empty, Proto: protoTCP})
	self := netip.MustParseAddrPort("[fd00:96::12]:80")
	d.AddService(bpftest.Service{ID: 5, Front: self, Proto: protoTCP, Backends: []bpftest.Backend{{AP: b1, Local: true}}})
	vip4 := netip.MustParseAddrPort("10.96.0.10:80")
	d.AddService(bpftest.Service{ID: 6, Front: vip4, Proto: protoTCP,
		Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(topo.PodIP["b1"], 8080), Local: true}}})
	client := topo.Pods["client"]
	clientIP := topo.PodIP6["client"].String()

	t.Run("ClusterIP TCP reaches both backends, data both ways", func(t *testing.T) {
		seen := map[string]bool{}
		for i := range 20 {
			answer, err := bpftest.Exchange(client, "tcp6", vip.String(), fmt.Sprintf("hello-%d", i))
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

	t.Run("the IPv4 Service beside it", func(t *testing.T) {
		answer, err := bpftest.Exchange(client, "tcp4", vip4.String(), "v4")
		if err != nil || !strings.HasPrefix(answer, "b1-v4 "+topo.PodIP["client"].String()) {
			t.Fatalf("answer %q, %v", answer, err)
		}
	})

	t.Run("UDP echo through a ClusterIP, small and fragmented", func(t *testing.T) {
		answer, err := bpftest.Exchange(client, "udp6", dns.String(), "query")
		if err != nil || answer != "b1 query" {
			t.Fatalf("answer %q, %v", answer, err)
		}
		// 4000 bytes: the client's stack fragments it (MTU 1500), the
		// backend's answer comes back in fragments too.
		big := bytes.Repeat([]byte("0123456789abcdef"), 250)
		before := d.Counter(gen.SluiceCounterCNT_FRAGMENT_TRANSLATED)
		answer6, err := exchangeDatagram(client, "udp6", dns.String(), big)
		if err == nil && !bytes.Equal(answer6, append([]byte("b1 "), big...)) {
			err = fmt.Errorf("answer of %d bytes differs", len(answer6))
		}
		if err != nil {
			t.Fatal(err)
		}
		if d.Counter(gen.SluiceCounterCNT_FRAGMENT_TRANSLATED) < before+4 {
			t.Fatalf("later fragments translated: %d, want at least 4 (2 each way)", d.Counter(gen.SluiceCounterCNT_FRAGMENT_TRANSLATED)-before)
		}
	})

	t.Run("a pod reaches itself through its Service (hairpin)", func(t *testing.T) {
		for i := range 3 {
			answer, err := bpftest.Exchange(topo.Pods["b1"], "tcp6", self.String(), fmt.Sprintf("me-%d", i))
			if err != nil {
				t.Fatalf("connection %d to its own Service: %v", i, err)
			}
			if f := strings.Fields(answer); len(f) != 3 || f[0] != "b1" || f[1] != topo.NodeIP6.String() {
				t.Fatalf("answer %q: want b1 answering the node's IPv6 address", answer)
			}
		}
	})

	t.Run("external host reaches a NodePort on the node's IPv6 address, source kept", func(t *testing.T) {
		np := netip.AddrPortFrom(topo.NodeIP6, 30080).String()
		for i := range 5 {
			answer, err := bpftest.Exchange(topo.External, "tcp6", np, fmt.Sprintf("from-outside-%d", i))
			if err != nil {
				t.Fatal(err)
			}
			if f := strings.Fields(answer); len(f) != 3 || f[1] != "fd00:210::2" {
				t.Fatalf("answer %q: the backend should see the external client's address", answer)
			}
		}
	})

	t.Run("service without endpoints refuses at once", func(t *testing.T) {
		start := time.Now()
		_, err := bpftest.Exchange(client, "tcp6", empty.String(), "x")
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("connect to a service without endpoints: %v, want connection refused", err)
		}
		if elapsed := time.Since(start); elapsed > 2*time.Second {
			t.Fatalf("refusal took %v: it came from a timeout, not a RST", elapsed)
		}
	})

	// The 4000-byte datagram leaves the client in fragments: the error
	// answers the first and quotes its fragment header, and the client's
	// stack must still match it to the socket.
	t.Run("UDP to a service without endpoints is refused (ICMPv6 port unreachable)", func(t *testing.T) {
		d.AddService(bpftest.Service{ID: 7, Front: netip.AddrPortFrom(empty.Addr(), 53), Proto: protoUDP})
		for _, size := range []int{1, 4000} {
			err := client.Do(func() error {
				c, err := net.Dial("udp6", netip.AddrPortFrom(empty.Addr(), 53).String())
				if err != nil {
					return err
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(2 * time.Second))
				if _, err := c.Write(bytes.Repeat([]byte("q"), size)); err != nil {
					return err
				}
				_, err = c.Read(make([]byte, 16))
				return err
			})
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("read after a %d-byte datagram to a service without endpoints: %v, want connection refused", size, err)
			}
		}
	})
}
