package gen_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// topology is a node namespace with pods behind veths and an external host on a
// data interface, the datapath attached by TCX on the node's side of each veth.
type topology struct {
	d        *bpftest.Datapath
	node     *bpftest.NetNS
	pods     map[string]*bpftest.NetNS
	podIP    map[string]netip.Addr
	external *bpftest.NetNS
	nodeIP   netip.Addr
}

func newTopology(t *testing.T, pods ...string) *topology {
	d := newDP(t)
	topo := &topology{d: d, node: bpftest.NewNetNS(t), pods: map[string]*bpftest.NetNS{}, podIP: map[string]netip.Addr{}}
	n := topo.node
	for _, s := range []string{"net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
		// Replies of NodePort flows leave with the node IP as source, which the
		// node must accept on a workload interface.
		"net.ipv4.conf.all.accept_local=1"} {
		n.Run("sysctl", "-qw", s)
	}
	for i, name := range pods {
		ns := bpftest.NewNetNS(t)
		v := bpftest.NewVeth(t, n, ns)
		gw := fmt.Sprintf("10.20%d.0.1", i)
		ip := fmt.Sprintf("10.20%d.0.2", i)
		n.Run("ip", "addr", "add", gw+"/24", "dev", v.Name)
		ns.Run("ip", "addr", "add", ip+"/24", "dev", v.PeerName)
		ns.Run("ip", "route", "add", "default", "via", gw)
		topo.attach(t, v.Name, d.Objs.SlFromWl, d.Objs.SlToWl)
		topo.pods[name], topo.podIP[name] = ns, netip.MustParseAddr(ip)
	}
	topo.external = bpftest.NewNetNS(t)
	data := bpftest.NewVeth(t, n, topo.external)
	topo.nodeIP = netip.MustParseAddr("10.210.0.1")
	n.Run("ip", "addr", "add", "10.210.0.1/24", "dev", data.Name)
	topo.external.Run("ip", "addr", "add", "10.210.0.2/24", "dev", data.PeerName)
	topo.external.Run("ip", "route", "add", "default", "via", "10.210.0.1")
	topo.attach(t, data.Name, d.Objs.SlFromHost, d.Objs.SlToHost)

	d.Put(d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(topo.nodeIP)})
	d.Put(d.Objs.SlHostipV1, gen.SluiceHostipKey{Addr: gen.NetAddr(topo.nodeIP)}, gen.SluiceHostipValue{})
	return topo
}

// attach puts ingress and egress programs on the node's end of a veth.
func (topo *topology) attach(t *testing.T, iface string, ingress, egress *ebpf.Program) {
	t.Helper()
	err := topo.node.Do(func() error {
		ifc, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		for _, a := range []struct {
			prog *ebpf.Program
			at   ebpf.AttachType
		}{{ingress, ebpf.AttachTCXIngress}, {egress, ebpf.AttachTCXEgress}} {
			l, err := link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: a.prog, Attach: a.at})
			if err != nil {
				return fmt.Errorf("attach %v to %s: %w", a.prog, iface, err)
			}
			t.Cleanup(func() { l.Close() })
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// serveTCP answers each line with "<name> <client address> <line>".
func serveTCP(t *testing.T, ns *bpftest.NetNS, name, addr string) {
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp4", addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					fmt.Fprintf(c, "%s %s %s", name, c.RemoteAddr().(*net.TCPAddr).IP, line)
				}
			}()
		}
	}()
}

func serveUDPEcho(t *testing.T, ns *bpftest.NetNS, name, addr string) {
	var pc net.PacketConn
	if err := ns.Do(func() (err error) { pc, err = net.ListenPacket("udp4", addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(append([]byte(name+" "), buf[:n]...), from)
		}
	}()
}

// exchange connects from ns to addr, sends a line and returns the answer.
func exchange(ns *bpftest.NetNS, network, addr, line string) (string, error) {
	var answer string
	err := ns.Do(func() error {
		c, err := net.DialTimeout(network, addr, 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := fmt.Fprintf(c, "%s\n", line); err != nil {
			return err
		}
		if network == "udp4" {
			buf := make([]byte, 1500)
			n, err := c.Read(buf)
			answer = string(buf[:n])
			return err
		}
		if got := c.RemoteAddr().String(); got != addr {
			return fmt.Errorf("peer address %s, want %s", got, addr)
		}
		answer, err = bufio.NewReader(c).ReadString('\n')
		return err
	})
	return strings.TrimSpace(answer), err
}

func TestRealTrafficThroughTheDatapath(t *testing.T) {
	topo := newTopology(t, "client", "b1", "b2")
	d := topo.d
	b1 := netip.AddrPortFrom(topo.podIP["b1"], 8080)
	b2 := netip.AddrPortFrom(topo.podIP["b2"], 8080)
	serveTCP(t, topo.pods["b1"], "b1", ":8080")
	serveTCP(t, topo.pods["b2"], "b2", ":8080")
	serveUDPEcho(t, topo.pods["b1"], "b1", ":5353")

	vip := netip.MustParseAddrPort("10.96.0.10:80")
	d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: protoTCP, Backends: []bpftest.Backend{{AP: b1, Local: true}, {AP: b2, Local: true}}})
	dns := netip.MustParseAddrPort("10.96.0.10:53")
	d.AddService(bpftest.Service{ID: 2, Front: dns, Proto: protoUDP, Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(topo.podIP["b1"], 5353), Local: true}}})
	d.AddService(bpftest.Service{ID: 3, Front: netip.MustParseAddrPort("255.255.255.255:30080"), Proto: protoTCP,
		Backends: []bpftest.Backend{{AP: b1, Local: true}, {AP: b2, Local: true}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
	empty := netip.MustParseAddrPort("10.96.0.11:80")
	d.AddService(bpftest.Service{ID: 4, Front: empty, Proto: protoTCP})
	client := topo.pods["client"]
	clientIP := topo.podIP["client"].String()

	t.Run("ClusterIP TCP reaches both backends, data both ways", func(t *testing.T) {
		seen := map[string]bool{}
		for i := range 20 {
			answer, err := exchange(client, "tcp4", vip.String(), fmt.Sprintf("hello-%d", i))
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
		answer, err := exchange(client, "udp4", dns.String(), "query")
		if err != nil {
			t.Fatal(err)
		}
		if answer != "b1 query" {
			t.Fatalf("answer %q", answer)
		}
	})

	t.Run("external host reaches a NodePort, source kept", func(t *testing.T) {
		np := netip.AddrPortFrom(topo.nodeIP, 30080).String()
		answer, err := exchange(topo.external, "tcp4", np, "from-outside")
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(answer); len(f) != 3 || f[1] != "10.210.0.2" {
			t.Fatalf("answer %q: backend should see the external client's address", answer)
		}
	})

	t.Run("service without endpoints refuses at once", func(t *testing.T) {
		start := time.Now()
		_, err := exchange(client, "tcp4", empty.String(), "x")
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
