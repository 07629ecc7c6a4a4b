package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/netlab"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The packet-rate benchmark's node: an external client's network on one
// data interface, a remote node hosting the backend on the other, both
// veths whose far ends live in namespaces of their own.
//
//	generator (slxc, 192.168.50.2) ── slxg [node 192.168.50.1] slxr ── (slxs, 192.168.51.2) backend
//
// The node forwards on one core: slxg's NAPI runs in a thread of its own
// (threaded NAPI), pinned to the second CPU; the generator, the sink's
// NAPI thread and everything else share the first. What the node costs per
// packet is that thread's CPU time over the packets delivered.
const (
	rateIfGen      = "slxg" // the node's interface toward the generator
	rateIfRemote   = "slxr" // the node's interface toward the backend
	rateIfClient   = "slxc" // the generator's end
	rateIfSink     = "slxs" // the backend's end, where the sink runs
	rateIfWireGen  = "slxa" // the wire's port toward the generator (frames=xdp)
	rateIfWireNode = "slxb" // the wire's port toward the node (frames=xdp)
	rateUDPPort    = 30090  // the NodePort of the datagram flow
	rateTCPPort    = 30091  // the NodePort the SYN flood aims at
	rateClientPort = 40000  // the datagram flow's source port
	rateNodeCPU    = 1      // the CPU of the node's receive thread
	rateNewFlows   = 60000  // the new flows' datagrams, each a flow of its own
	rateNewFlowPPS = 50000  // new flows a second in their phase
	rateOtherCPU   = 0      // the CPU of the generator, the sink and the rest
)

// rateNewFlowTime is how long new flows are sent: fewer than rateNewFlows.
const rateNewFlowTime = time.Second

var (
	rateNodeIP    = netip.MustParseAddr("192.168.50.1")
	rateClientIP  = netip.MustParseAddr("192.168.50.2")
	rateBackendIP = netip.MustParseAddr("192.168.51.2")
	// rateFloodSrc is the SYN flood's first source: its addresses are the
	// /16 from it, its ports count up from it a round.
	rateFloodSrc = netip.MustParseAddrPort("10.99.0.0:1024")
)

// BenchmarkNodePortPacketRate: packets per second per core through a
// NodePort to a backend on another node, SNATed, on real veths, for
// Sluice with the XDP acceleration (native), Sluice's TC path, and
// kube-proxy nftables, in one run. Issue 49's measure.
//
// A generator in the client's namespace sends 60-byte UDP datagrams of one
// flow, established by a probe and its answer first, from a raw packet
// socket (AF_PACKET, PACKET_QDISC_BYPASS, sendmmsg in batches of 64): the
// frames enter the node's veth through its NAPI poll, where the XDP
// program runs before the stack's paths. Two ways, each a sub-benchmark:
//
//   - frames=skb: the generator's veth is the node's peer, and its skbs
//     reach the node's veth, which copies each (a raw socket's has no XDP
//     headroom) into a page of its own before XDP runs, on every path
//     alike; a NIC does not;
//   - frames=xdp: a wire namespace between them redirects each frame on
//     from XDP (sink.c, wire), so frames reach the node's veth as XDP
//     frames: its XDP program runs on them with no skb, as in a NIC's
//     driver, and the stack's paths build an skb from the frame without a
//     copy, as a NIC's driver does. The wire's thread shares the
//     generator's CPU.
//
// (BPF_PROG_TEST_RUN's live-frames mode, which would hand the node's veth
// frames directly, is refused here: EPERM.) A sink program at the
// backend's veth counts and drops them. Four phases, each of
// SLUICE_BENCH_RATE_SECONDS (default 3) but the new flows':
//
//   - paced: the flow at SLUICE_BENCH_RATE_PPS (default 100,000 a second),
//     below what any of the three forwards on one core here: the node
//     thread's CPU time per delivered packet is the path's cost, and
//     packets per core-second its inverse;
//   - flat out: the generator as fast as it can on its CPU: the most the
//     node delivers (the generator and the sink, and the wire, share the
//     other CPU, so this is a floor of what the node could do);
//   - new flows: rateNewFlowPPS datagrams a second for rateNewFlowTime,
//     each the first of a flow of its own (its own source address and
//     port, kept through SNAT), to the same NodePort: the node thread's
//     CPU time per flow started;
//   - flood: the paced flow again, with a SYN flood to the TCP NodePort
//     beside it at SLUICE_BENCH_FLOOD_PPS (default 200,000 a second; 0:
//     flat out), from 65,536 sources whose port changes every round: the
//     share of the paced flow lost, against its loss alone. Paced, so that
//     each path is offered the same flood (flat out, how fast the generator
//     goes depends on the path: a TC path's skb costs the sender's CPU
//     too).
func BenchmarkNodePortPacketRate(b *testing.B) {
	sluice, kubeProxy := proxyBinaries(b)
	var objs SinkObjects
	if err := LoadSinkObjects(&objs, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { objs.Close() })
	d := 3 * time.Second
	if s := os.Getenv("SLUICE_BENCH_RATE_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatalf("SLUICE_BENCH_RATE_SECONDS: %v", err)
		}
		d = time.Duration(n) * time.Second
	}
	pps, floodPPS := envRate(b, "SLUICE_BENCH_RATE_PPS", 100_000), envRate(b, "SLUICE_BENCH_FLOOD_PPS", 200_000)
	for _, p := range []struct{ name, proxy, xdp string }{
		{"sluice-xdp", "sluice", "native"},
		{"sluice-tc", "sluice", "disabled"},
		{"kube-proxy-nftables", "nftables", ""},
	} {
		for _, frames := range []string{"skb", "xdp"} {
			b.Run(p.name+"/frames="+frames, func(b *testing.B) {
				n := newRateNode(b, &objs, frames == "xdp")
				if p.proxy == "sluice" {
					n.e.startProxy(b, "sluice", sluice, kubeProxy, "--data-ifaces", "^slx[gr]$", "--xdp-acceleration", p.xdp)
				} else {
					n.e.node.PassXDP(b, rateIfGen)
					n.e.startProxy(b, p.proxy, sluice, kubeProxy)
				}
				n.createService(b)
				n.probe(b)
				n.oneCorePerSide(b)

				paced := n.phase(b, d, [][]byte{n.datagram}, pps, -1)
				flat := n.phase(b, d, [][]byte{n.datagram}, 0, -1)
				newFlows := n.phase(b, rateNewFlowTime, n.newFlows, rateNewFlowPPS, -1)
				flood := n.phase(b, d, [][]byte{n.datagram}, pps, floodPPS)
				if paced.delivered == 0 || flat.delivered == 0 {
					b.Fatalf("no datagram reached the backend: paced %+v, flat out %+v", paced, flat)
				}
				nsPerPacket := float64(paced.nodeCPU.Nanoseconds()) / float64(paced.delivered)
				if p.proxy == "sluice" {
					refused := counter(b, n.e.pinDir, gen.SluiceCounterCNT_DROP_SNAT_PORTS)
					b.ReportMetric(float64(refused), "snat-port-drops")
					// What a SYN of the flood cost the node: the flood phase's
					// CPU beyond its datagrams' at the paced phase's cost, over
					// the SYNs the node handled (refused or forwarded; the rest
					// overflowed the veth's ring before XDP).
					synCPU := float64(flood.nodeCPU.Nanoseconds()) - nsPerPacket*float64(flood.delivered)
					b.ReportMetric(synCPU/float64(refused+flood.floodDelivered), "flood-node-ns/syn")
				}
				if p.xdp == "native" {
					// The flow must have run at XDP, or this measures TC twice.
					dec := n.xdpDecisions(b)
					if carried := dec["tx"] + dec["redirected"]; carried < paced.delivered {
						b.Fatalf("XDP carried %d packets, fewer than the %d the paced phase delivered: %v", carried, paced.delivered, dec)
					}
				}
				b.ReportMetric(nsPerPacket, "node-ns/packet")
				b.ReportMetric(1e9/nsPerPacket, "packets/core-s")
				b.ReportMetric(paced.rate(), "paced-delivered/s")
				b.ReportMetric(paced.loss(), "paced-loss")
				b.ReportMetric(flat.rate(), "flat-out-delivered/s")
				b.ReportMetric(flat.nodeBusy(), "flat-out-node-busy")
				newFlowNs := float64(newFlows.nodeCPU.Nanoseconds()) / float64(newFlows.delivered)
				b.ReportMetric(newFlowNs, "new-flow-node-ns")
				b.ReportMetric(1e9/newFlowNs, "new-flows/core-s")
				b.ReportMetric(newFlows.loss(), "new-flow-loss")
				b.ReportMetric(flood.loss(), "flood-flow-loss")
				b.ReportMetric(float64(flood.floodSent)/flood.elapsed.Seconds(), "flood-sent/s")
				b.ReportMetric(float64(flood.floodDelivered)/flood.elapsed.Seconds(), "flood-delivered/s")
				b.ReportMetric(flood.nodeBusy(), "flood-node-busy")
				b.Logf("%s, frames=%s: paced %+v; flat out %+v; new flows %+v; flood %+v", p.name, frames, paced, flat, newFlows, flood)
			})
		}
	}
}

type rateNode struct {
	e           *baselineEnv
	gen, remote *bpftest.NetNS
	// wire is the namespace between the generator and the node when
	// frames reach the node as XDP frames (nil: the generator's veth is
	// the node's peer).
	wire *bpftest.NetNS
	objs *SinkObjects
	// datagram is the paced flow's frame; syns the flood's, one a source;
	// newFlows one datagram each of as many flows.
	datagram []byte
	syns     [][]byte
	newFlows [][]byte
}

// newRateNode builds the benchmark's namespaces. With xdpFrames, a wire
// namespace sits between the generator and the node, whose XDP program
// redirects each frame on (sink.c, wire), so that frames reach the node's
// veth as XDP frames: the node's XDP program runs on them with no skb, as
// it would in a NIC's driver, and the stack's paths build one from the
// frame (no copy), as a NIC's driver does. Without it, the generator's
// skbs reach the node's veth, which copies each into a page before XDP.
func newRateNode(b *testing.B, objs *SinkObjects, xdpFrames bool) *rateNode {
	n := &rateNode{e: &baselineEnv{node: bpftest.NewNetNS(b), nodeIP: rateNodeIP.String()},
		gen: bpftest.NewNetNS(b), remote: bpftest.NewNetNS(b), objs: objs}
	node := n.e.node
	node.Run("sysctl", "-qw", "net.ipv4.ip_forward=1")
	pairs := [][2]netlab.End{
		{{NS: node.Name, Name: rateIfGen, Addr: netip.PrefixFrom(rateNodeIP, 24)}, {NS: n.gen.Name, Name: rateIfClient, Addr: netip.PrefixFrom(rateClientIP, 24)}},
		{{NS: node.Name, Name: rateIfRemote, Addr: netip.MustParsePrefix("192.168.51.1/24")}, {NS: n.remote.Name, Name: rateIfSink, Addr: netip.PrefixFrom(rateBackendIP, 24)}},
	}
	if xdpFrames {
		n.wire = bpftest.NewNetNS(b)
		pairs[0][1] = netlab.End{NS: n.wire.Name, Name: rateIfWireNode}
		pairs = append(pairs, [2]netlab.End{{NS: n.wire.Name, Name: rateIfWireGen}, {NS: n.gen.Name, Name: rateIfClient, Addr: netip.PrefixFrom(rateClientIP, 24)}})
	}
	for _, pair := range pairs {
		if err := netlab.AddVeth(pair[0], pair[1]); err != nil {
			b.Fatal(err)
		}
	}
	if xdpFrames {
		n.connectWire(b)
	}
	n.gen.Run("ip", "route", "add", "default", "via", rateNodeIP.String())
	n.remote.Run("ip", "route", "add", "default", "via", "192.168.51.1")
	node.Run("ip", "route", "add", netip.PrefixFrom(rateFloodSrc.Addr(), 16).String(), "via", rateClientIP.String())
	// The probes' checksums complete before they leave (a wire never
	// carries a partial one; XDP would translate it as it stands).
	n.gen.SetChecksumOffload(b, rateIfClient, false, true)
	n.remote.SetChecksumOffload(b, rateIfSink, false, true)
	n.gen.PassXDP(b, rateIfClient)
	n.remote.AttachXDP(b, rateIfSink, objs.Sink)
	bpftest.ServeUDPEcho(b, n.remote, "backend", fmt.Sprintf(":%d", 8080))

	var client, nodeMAC net.HardwareAddr
	if err := n.gen.Do(func() error {
		ifc, err := net.InterfaceByName(rateIfClient)
		if err != nil {
			return err
		}
		client = ifc.HardwareAddr
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	if err := node.Do(func() error {
		ifc, err := net.InterfaceByName(rateIfGen)
		if err == nil {
			nodeMAC = ifc.HardwareAddr
		}
		return err
	}); err != nil {
		b.Fatal(err)
	}
	// 60 bytes on the wire before the FCS, the smallest Ethernet frame: the
	// sink's mark and padding.
	payload := append([]byte("G"), make([]byte, 17)...)
	n.datagram = bpftest.UDPPacket(netip.AddrPortFrom(rateClientIP, rateClientPort), netip.AddrPortFrom(rateNodeIP, rateUDPPort), payload)
	n.syns = floodSYNs(netip.AddrPortFrom(rateNodeIP, rateTCPPort))
	n.newFlows = newFlowDatagrams(netip.AddrPortFrom(rateNodeIP, rateUDPPort), payload)
	for _, f := range append(append([][]byte{n.datagram}, n.syns...), n.newFlows...) {
		copy(f[0:6], nodeMAC)
		copy(f[6:12], client)
	}
	n.e.api = apiservertest.StartIn(b, node)
	return n
}

// connectWire joins the wire's two ports by XDP redirects, each way.
func (n *rateNode) connectWire(b *testing.B) {
	b.Helper()
	for _, port := range []string{rateIfWireGen, rateIfWireNode} {
		n.wire.AttachXDP(b, port, n.objs.Wire)
	}
	// A devmap resolves an ifindex in the writer's namespace.
	if err := n.wire.Do(func() error {
		var idx [2]uint32
		for i, name := range []string{rateIfWireGen, rateIfWireNode} {
			ifc, err := net.InterfaceByName(name)
			if err != nil {
				return err
			}
			idx[i] = uint32(ifc.Index)
		}
		for i := range idx {
			if err := n.objs.WirePorts.Put(idx[i], idx[1-i]); err != nil {
				return fmt.Errorf("wire %d -> %d: %w", idx[i], idx[1-i], err)
			}
		}
		b.Cleanup(func() {
			for _, k := range idx {
				n.objs.WirePorts.Delete(k)
			}
		})
		return nil
	}); err != nil {
		b.Fatal(err)
	}
}

// createService creates the NodePort Service, its datagram port and its
// TCP port, whose endpoint is the backend on the remote node.
func (n *rateNode) createService(b *testing.B) {
	ctx := context.Background()
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "rate"}, Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort,
		Ports: []v1.ServicePort{
			{Name: "udp", Port: 80, Protocol: v1.ProtocolUDP, NodePort: rateUDPPort},
			{Name: "tcp", Port: 80, Protocol: v1.ProtocolTCP, NodePort: rateTCPPort},
		}}}
	if _, err := n.e.api.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	udp, tcp := v1.ProtocolUDP, v1.ProtocolTCP
	udpName, tcpName, port, remote := "udp", "tcp", int32(8080), "remote"
	es := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "rate-1", Labels: map[string]string{discovery.LabelServiceName: "rate"}},
		AddressType: discovery.AddressTypeIPv4,
		Endpoints:   []discovery.Endpoint{{Addresses: []string{rateBackendIP.String()}, NodeName: &remote}},
		Ports: []discovery.EndpointPort{
			{Name: &udpName, Port: &port, Protocol: &udp},
			{Name: &tcpName, Port: &port, Protocol: &tcp},
		}}
	if _, err := n.e.api.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
}

// probe sends datagrams of the generator's flow (its addresses and ports)
// until one is answered: the proxy is programmed, and the flow established
// both ways in its conntrack, before the generator sends a frame.
func (n *rateNode) probe(b *testing.B) {
	b.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		last = n.gen.Do(func() error {
			c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(rateClientIP, rateClientPort)))
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := c.WriteToUDPAddrPort([]byte("probe"), netip.AddrPortFrom(rateNodeIP, rateUDPPort)); err != nil {
				return err
			}
			c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			buf := make([]byte, 64)
			m, _, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return err
			}
			if got := string(buf[:m]); got != "backend probe" {
				return fmt.Errorf("answer %q", got)
			}
			return nil
		})
		if last == nil {
			return
		}
	}
	b.Fatalf("the NodePort never answered the probe: %v", last)
}

// oneCorePerSide moves the receive work of the node's slxg into a thread
// of its own on rateNodeCPU, and the sink's onto rateOtherCPU.
func (n *rateNode) oneCorePerSide(b *testing.B) {
	b.Helper()
	for _, side := range []struct {
		ns    *bpftest.NetNS
		iface string
		cpu   int
	}{{n.e.node, rateIfGen, rateNodeCPU}, {n.remote, rateIfSink, rateOtherCPU}, {n.wire, rateIfWireGen, rateOtherCPU}} {
		if side.ns == nil {
			continue
		}
		side.ns.Run("sh", "-c", fmt.Sprintf("echo 1 > /sys/class/net/%s/threaded", side.iface))
		for _, pid := range napiThreads(b, side.iface) {
			var set unix.CPUSet
			set.Set(side.cpu)
			if err := unix.SchedSetaffinity(pid, &set); err != nil {
				b.Fatalf("pin %s's NAPI thread %d: %v", side.iface, pid, err)
			}
		}
	}
}

// napiThreads finds iface's threaded NAPI kernel threads (napi/IFACE-ID):
// one per receive queue.
func napiThreads(b *testing.B, iface string) []int {
	b.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err == nil && strings.HasPrefix(string(comm), "napi/"+iface+"-") {
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		b.Fatalf("no NAPI thread for %s: threaded NAPI did not start", iface)
	}
	return pids
}

// envRate reads a rate a second from the environment, or def.
func envRate(b *testing.B, name string, def float64) float64 {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	return float64(n)
}

// threadCPU is the CPU time the threads have run (schedstat).
func threadCPU(b *testing.B, pids []int) time.Duration {
	b.Helper()
	var total time.Duration
	for _, pid := range pids {
		s, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			b.Fatal(err)
		}
		ns, err := strconv.ParseInt(strings.Fields(string(s))[0], 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/schedstat: %v", pid, err)
		}
		total += time.Duration(ns)
	}
	return total
}

// ratePhase is what one phase sent and the sink counted.
type ratePhase struct {
	sent, delivered           uint64
	floodSent, floodDelivered uint64
	nodeCPU, elapsed          time.Duration
}

func (p ratePhase) rate() float64     { return float64(p.delivered) / p.elapsed.Seconds() }
func (p ratePhase) nodeBusy() float64 { return p.nodeCPU.Seconds() / p.elapsed.Seconds() }
func (p ratePhase) loss() float64 {
	if p.sent == 0 {
		return 0
	}
	return 1 - float64(p.delivered)/float64(p.sent)
}

// phase sends flow's frames, in turn, for d at pps a second (0: flat
// out), and the SYN flood beside it at floodPPS a second (-1: no flood),
// and reads what the sink counted and the node's thread ran.
func (n *rateNode) phase(b *testing.B, d time.Duration, flow [][]byte, pps, floodPPS float64) ratePhase {
	b.Helper()
	threads := napiThreads(b, rateIfGen)
	counts0 := n.sinkCounts(b)
	cpu0 := threadCPU(b, threads)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	var p ratePhase
	var errs [2]error
	wg.Go(func() { p.sent, errs[0] = n.send(ctx, flow, pps, nil) })
	if floodPPS >= 0 {
		wg.Go(func() { p.floodSent, errs[1] = n.send(ctx, n.syns, floodPPS, nextFloodPort) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // what is in flight arrives
	p.elapsed = time.Since(start) - 100*time.Millisecond
	p.nodeCPU = threadCPU(b, threads) - cpu0
	counts := n.sinkCounts(b)
	p.delivered = counts[0] - counts0[0]
	p.floodDelivered = counts[1] - counts0[1]
	return p
}

// send writes frames, in turn, from the generator's veth until ctx ends,
// pps a second (0: as fast as it can), on rateOtherCPU; after each round
// of them, nextRound (if any) may change them. It returns how many it
// sent.
func (n *rateNode) send(ctx context.Context, frames [][]byte, pps float64, nextRound func([][]byte)) (uint64, error) {
	// A paced burst fits the node veth's ring (256) before it drains.
	const batch = 64
	var sent uint64
	err := n.gen.Do(func() error {
		var was, only unix.CPUSet
		if err := unix.SchedGetaffinity(0, &was); err != nil {
			return err
		}
		only.Set(rateOtherCPU)
		if err := unix.SchedSetaffinity(0, &only); err != nil {
			return err
		}
		defer unix.SchedSetaffinity(0, &was)
		sock, err := newPacketSocket(rateIfClient, batch)
		if err != nil {
			return err
		}
		defer sock.close()
		start, next := time.Now(), 0
		for ctx.Err() == nil {
			count := batch
			if pps > 0 {
				due := int64(pps*time.Since(start).Seconds()) - int64(sent)
				if due <= 0 {
					time.Sleep(100 * time.Microsecond)
					continue
				}
				count = int(min(due, batch))
			}
			k, err := sock.send(frames, next, count)
			if err != nil {
				return err
			}
			sent += uint64(k)
			if next += k; next >= len(frames) {
				next %= len(frames)
				if nextRound != nil {
					nextRound(frames)
				}
			}
		}
		return nil
	})
	return sent, err
}

// packetSocket sends whole frames out of one interface, many a system call,
// past the qdisc: a packet generator's way on a host without pktgen.
type packetSocket struct {
	fd   int
	iovs []unix.Iovec
	msgs []mmsghdr
}

// mmsghdr is struct mmsghdr, sendmmsg's array element.
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

func newPacketSocket(iface string, batch int) (*packetSocket, error) {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("PACKET_QDISC_BYPASS: %w", err)
	}
	// A frame's buffer is charged to the socket until the receiver frees
	// it: with the default allowance the generator would wait for the node
	// to drain its ring, and send at its pace.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 64<<20); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("SO_SNDBUFFORCE: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: ifc.Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind to %s: %w", iface, err)
	}
	return &packetSocket{fd: fd, iovs: make([]unix.Iovec, batch), msgs: make([]mmsghdr, batch)}, nil
}

// send sends up to count frames from frames[from:] in one sendmmsg, and
// returns how many the kernel took.
func (s *packetSocket) send(frames [][]byte, from, count int) (int, error) {
	count = min(count, len(s.msgs), len(frames)-from)
	for i := range count {
		f := frames[from+i]
		s.iovs[i].Base = &f[0]
		s.iovs[i].SetLen(len(f))
		s.msgs[i].hdr = unix.Msghdr{Iov: &s.iovs[i]}
		s.msgs[i].hdr.SetIovlen(1)
	}
	for {
		k, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&s.msgs[0])), uintptr(count), 0, 0, 0)
		switch errno {
		case 0:
			return int(k), nil
		case unix.ENOBUFS, unix.EAGAIN, unix.EINTR:
			// The veth's ring is full. Whatever drains it may share this
			// CPU (the wire's thread, frames=xdp): yield to it, or this
			// loop holds the CPU it needs.
			unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			continue
		default:
			return 0, fmt.Errorf("sendmmsg: %w", errno)
		}
	}
}

func (s *packetSocket) close() { unix.Close(s.fd) }

// floodSYNs builds the flood's SYNs to dst, one from each address of
// rateFloodSrc's /16, all from its port.
func floodSYNs(dst netip.AddrPort) [][]byte {
	base := rateFloodSrc.Addr().As4()
	frames := make([][]byte, 1<<16)
	for i := range frames {
		src := base
		src[2], src[3] = byte(i>>8), byte(i)
		frames[i] = bpftest.TCPPacket(netip.AddrPortFrom(netip.AddrFrom4(src), rateFloodSrc.Port()), dst, bpftest.SYN)
	}
	return frames
}

// newFlowDatagrams builds a datagram to dst for each of rateNewFlows flows,
// each from its own address of rateFloodSrc's /16 and its own port (so that
// each keeps its port through SNAT), with payload.
func newFlowDatagrams(dst netip.AddrPort, payload []byte) [][]byte {
	base := rateFloodSrc.Addr().As4()
	frames := make([][]byte, rateNewFlows)
	for i := range frames {
		src := base
		src[2], src[3] = byte(i>>8), byte(i)
		frames[i] = bpftest.UDPPacket(netip.AddrPortFrom(netip.AddrFrom4(src), uint16(1024+i)), dst, payload)
	}
	return frames
}

// nextFloodPort moves every SYN to the next source port, so each round of
// the flood is new flows: the port and TCP's checksum, changed by as much
// (RFC 1624).
func nextFloodPort(frames [][]byte) {
	const sport, check = 14 + 20, 14 + 20 + 16
	for _, f := range frames {
		old := binary.BigEndian.Uint16(f[sport:])
		port := old + 1
		if port < 1024 {
			port = 1024
		}
		binary.BigEndian.PutUint16(f[sport:], port)
		sum := uint32(^binary.BigEndian.Uint16(f[check:])) + uint32(^old) + uint32(port)
		sum = (sum & 0xffff) + sum>>16
		sum = (sum & 0xffff) + sum>>16
		binary.BigEndian.PutUint16(f[check:], ^uint16(sum))
	}
}

// sinkCounts sums the sink's per-CPU counts: datagrams, SYNs.
func (n *rateNode) sinkCounts(b *testing.B) [2]uint64 {
	b.Helper()
	var out [2]uint64
	for kind := range out {
		var per []uint64
		if err := n.objs.SinkCounts.Lookup(uint32(kind), &per); err != nil {
			b.Fatal(err)
		}
		for _, v := range per {
			out[kind] += v
		}
	}
	return out
}

// xdpDecisions reads the agent's XDP decisions from its pins.
func (n *rateNode) xdpDecisions(b *testing.B) map[string]uint64 {
	b.Helper()
	set, err := maps.Open(maps.OpenOptions{PinDir: n.e.pinDir, NoCreate: true})
	if err != nil {
		b.Fatal(err)
	}
	defer set.Close()
	m, err := maps.XDPDecisions.In(set)
	if err != nil {
		b.Fatal(err)
	}
	names, err := maps.XDPDecisionNames()
	if err != nil {
		b.Fatal(err)
	}
	dec, err := maps.ReadXDPDecisions(m, names)
	if err != nil {
		b.Fatal(err)
	}
	return dec
}
