package bpftest

import (
	"bufio"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/sluice-net/sluice/gen"
)

// noPolicy is the interface-state slot value for "no policy program"
// (IFSTATE_NO_POLICY).
const noPolicy = 0xffffffff

// Topology is a node namespace with pods behind veths and an external host on a
// data interface, the datapath attached by TCX on the node's side of each veth:
//
//	pod i:    10.20<i>.0.2/24, gateway 10.20<i>.0.1 (the node's side)
//	external: 10.210.0.2/24,   gateway 10.210.0.1 (the node IP)
type Topology struct {
	DP       *Datapath
	Node     *NetNS
	Pods     map[string]*NetNS
	PodIP    map[string]netip.Addr
	PodIface map[string]string // the node's side of each pod's veth
	External *NetNS
	NodeIP   netip.Addr
	// Set by EnableIPv6: each pod's IPv6 address, and the node's on the
	// external host's link.
	PodIP6  map[string]netip.Addr
	NodeIP6 netip.Addr
}

// NewTopology builds the namespaces (NewPod: netlab, as the demo and the
// multi-node test do) and attaches d's programs; everything is removed when
// the test ends.
func NewTopology(t testing.TB, d *Datapath, pods ...string) *Topology {
	t.Helper()
	Require(t)
	topo := &Topology{DP: d, Node: NewNetNS(t), Pods: map[string]*NetNS{},
		PodIP: map[string]netip.Addr{}, PodIface: map[string]string{}, NodeIP: netip.MustParseAddr("10.210.0.1")}
	n := topo.Node
	// No accept_local: replies of NodePort flows, which leave a workload with
	// the node IP as source, must get through a node that would drop them
	// as spoofs (the datapath routes them itself: fib_forward).
	for _, s := range []string{"net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"} {
		n.Run("sysctl", "-qw", s)
	}
	for i, name := range pods {
		iface := fmt.Sprintf("slw%d", i)
		ip := netip.MustParseAddr(fmt.Sprintf("10.20%d.0.2", i))
		ns := NewPod(t, n, iface, netip.PrefixFrom(ip, 24), netip.MustParseAddr(fmt.Sprintf("10.20%d.0.1", i)))
		topo.Attach(t, iface, d.Objs.SlFromWl, d.Objs.SlToWl)
		topo.Pods[name], topo.PodIP[name], topo.PodIface[name] = ns, ip, iface
	}
	// The external host is shaped as a pod is, behind the node's data
	// interface, with the node IP as its gateway.
	topo.External = NewPod(t, n, "sldata0", netip.MustParsePrefix("10.210.0.2/24"), topo.NodeIP)
	topo.Attach(t, "sldata0", d.Objs.SlFromHost, d.Objs.SlToHost)

	d.Put(d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(topo.NodeIP)})
	d.Put(d.Objs.SlHostipV1, gen.SluiceHostipKey{Addr: gen.NetAddr(topo.NodeIP)}, gen.SluiceHostipValue{})
	return topo
}

// EnableIPv6 makes the topology dual-stack, laid out as the IPv4 one:
//
//	pod i:    fd00:20<i>::2/64, gateway fd00:20<i>::1 (the node's side)
//	external: fd00:210::2/64,   gateway fd00:210::1 (the node's IPv6 address)
//
// Addresses skip duplicate address detection, so they are usable at once.
func (topo *Topology) EnableIPv6(t testing.TB) {
	t.Helper()
	topo.PodIP6, topo.NodeIP6 = map[string]netip.Addr{}, netip.MustParseAddr("fd00:210::1")
	topo.Node.Run("sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
	plumb := func(pod *NetNS, hostIface string, addr, gw netip.Addr) {
		topo.Node.Run("ip", "addr", "add", netip.PrefixFrom(gw, 64).String(), "dev", hostIface, "nodad")
		pod.Run("ip", "addr", "add", netip.PrefixFrom(addr, 64).String(), "dev", "eth0", "nodad")
		pod.Run("ip", "-6", "route", "add", "default", "via", gw.String())
	}
	for name, iface := range topo.PodIface {
		i := strings.TrimPrefix(iface, "slw")
		addr := netip.MustParseAddr("fd00:20" + i + "::2")
		plumb(topo.Pods[name], iface, addr, netip.MustParseAddr("fd00:20"+i+"::1"))
		topo.PodIP6[name] = addr
	}
	plumb(topo.External, "sldata0", netip.MustParseAddr("fd00:210::2"), topo.NodeIP6)
	topo.DP.SetNodeIP6(topo.NodeIP6)
	// Neighbour discovery waits for the links' own (link-local) addresses,
	// which duplicate address detection holds tentative for a second or
	// so after a link comes up: wait, so that a test's first IPv6 packet
	// is not lost to it.
	for _, ns := range append([]*NetNS{topo.Node, topo.External}, slices.Collect(maps.Values(topo.Pods))...) {
		for deadline := time.Now().Add(5 * time.Second); strings.TrimSpace(ns.Run("ip", "-6", "addr", "show", "tentative")) != ""; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("IPv6 addresses of %s still tentative after 5 s", ns.Name)
			}
		}
	}
}

// Attach puts ingress and egress programs on an interface of the node namespace
// with TCX links, detached when the test ends, and records the interface in
// the interface-state map as ready without policy, and as a workload's when
// its ingress program is sl_from_wl, as ifacemgr does (the egress hooks tell
// packets that entered through a managed interface by it; local delivery
// hands packets only to a ready workload's interface).
func (topo *Topology) Attach(t testing.TB, iface string, ingress, egress *ebpf.Program) {
	t.Helper()
	err := topo.Node.Do(func() error {
		ifc, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		flags := gen.SluiceIfstateFlagsIFS_READY
		if ingress == topo.DP.Objs.SlFromWl {
			flags |= gen.SluiceIfstateFlagsIFS_WORKLOAD
		}
		if err := topo.DP.Objs.SlIfstateV1.Put(gen.SluiceIfstateKey{Ifindex: uint32(ifc.Index)}, gen.SluiceIfstateValue{
			Flags: flags, IngressPolicy: noPolicy, EgressPolicy: noPolicy}); err != nil {
			return fmt.Errorf("interface state of %s: %w", iface, err)
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

// listenTCP listens on addr inside ns until the test ends.
func listenTCP(t testing.TB, ns *NetNS, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen(family(addr, "tcp"), addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// family is proto's network for a listening address: "tcp4" for ":8080" or
// an IPv4 address, "tcp6" for "[::]:8080" or an IPv6 address.
func family(addr, proto string) string {
	if strings.HasPrefix(addr, "[") {
		return proto + "6"
	}
	return proto + "4"
}

// ServeTCP answers each line with "<name> <client address> <line>".
func ServeTCP(t testing.TB, ns *NetNS, name, addr string) {
	t.Helper()
	ln := listenTCP(t, ns, addr)
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

// ServeUDPEcho answers each datagram with "<name> <datagram>" until the test
// ends or the returned stop is called.
func ServeUDPEcho(t testing.TB, ns *NetNS, name, addr string) (stop func()) {
	t.Helper()
	var pc net.PacketConn
	if err := ns.Do(func() (err error) { pc, err = net.ListenPacket(family(addr, "udp"), addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 65536) // datagrams above the MTU arrive reassembled
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(append([]byte(name+" "), buf[:n]...), from)
		}
	}()
	return func() { pc.Close() }
}

// Exchange connects from ns to addr, sends a line and returns the answer. A TCP
// peer must report addr as its address (the service, not the backend).
func Exchange(ns *NetNS, network, addr, line string) (string, error) {
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
		if strings.HasPrefix(network, "udp") {
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

// ServeCloseFirst answers each connection with "<name> <client address>\n"
// and closes it at once, so the server sends the first FIN and holds the
// tuple in TIME_WAIT (HTTP/1.0 servers, "Connection: close", most load
// generators' targets).
func ServeCloseFirst(t testing.TB, ns *NetNS, name, addr string) {
	t.Helper()
	ln := listenTCP(t, ns, addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr().(*net.TCPAddr).IP)
			c.Close()
		}
	}()
}

// Netstat reads counters of /proc/net/netstat (e.g. "TcpExt" "TCPSynRetrans")
// as the namespace sees them.
func Netstat(ns *NetNS, group string, fields ...string) (map[string]uint64, error) {
	return procNetCounters(ns, "netstat", group, fields)
}

// SNMP reads counters of /proc/net/snmp (e.g. "Udp" "RcvbufErrors") as the
// namespace sees them.
func SNMP(ns *NetNS, group string, fields ...string) (map[string]uint64, error) {
	return procNetCounters(ns, "snmp", group, fields)
}

// procNetCounters reads fields of group from /proc/net/file, whose lines
// come in pairs: the names, then the values.
func procNetCounters(ns *NetNS, file, group string, fields []string) (map[string]uint64, error) {
	var text []byte
	err := ns.Do(func() (err error) {
		// thread-self: /proc/self/net follows the process's first thread,
		// not the one that entered the namespace.
		text, err = os.ReadFile("/proc/thread-self/net/" + file)
		return err
	})
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(text), "\n")
	out := map[string]uint64{}
	for i := 0; i+1 < len(lines); i += 2 {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || names[0] != group+":" || len(values) != len(names) {
			continue
		}
		for j := 1; j < len(names); j++ {
			for _, f := range fields {
				if names[j] == f {
					v, err := strconv.ParseUint(values[j], 10, 64)
					if err != nil {
						return nil, fmt.Errorf("%s %s %s: %w", file, group, f, err)
					}
					out[f] = v
				}
			}
		}
	}
	for _, f := range fields {
		if _, ok := out[f]; !ok {
			return nil, fmt.Errorf("%s: no %s %s", file, group, f)
		}
	}
	return out, nil
}
