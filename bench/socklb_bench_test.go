package bench

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// BenchmarkConnect: TCP connect() latency from a process in a cgroup with the
// socket-LB programs attached, to a ClusterIP (rewritten to the backend) and
// straight to the backend's address, in the same run. The listener is on the
// namespace's loopback, so the figure is the connect path itself.
func BenchmarkConnect(b *testing.B) {
	d := bpftest.NewDatapath(b, nodeIP)
	ns, cg := bpftest.NewNetNS(b), bpftest.NewCgroup(b)
	vip, be := netip.MustParseAddrPort("10.96.0.10:80"), netip.MustParseAddrPort("127.0.0.2:8080")
	bpftest.ServeTCP(b, ns, "b1", be.String())
	d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: be}}})
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cg.Path, Attach: ebpf.AttachCGroupInet4Connect, Program: d.Objs.SlConnect4})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	var direct float64
	for _, c := range []struct {
		name string
		addr netip.AddrPort
	}{{"direct", be}, {"socket-lb", vip}} {
		b.Run(c.name, func(b *testing.B) {
			b.StopTimer() // the helper measures connect() itself
			out := cg.RunHelper(ns, "connect-loop", c.addr.String(), strconv.Itoa(max(b.N, 100)))
			ns, err := strconv.ParseFloat(strings.TrimPrefix(out[0], "ns="), 64)
			if err != nil {
				b.Fatalf("helper said %q", out)
			}
			b.ReportMetric(ns, "ns/connect")
			if c.name == "direct" {
				direct = ns
			} else if direct > 0 {
				b.ReportMetric(ns/direct, "x-direct")
			}
		})
	}
}

// BenchmarkXDP: the prefilter's pass and drop paths beside an empty XDP
// program, in the same run (BPF_PROG_TEST_RUN with repeat: XDP does not
// rewrite the packet, so every repetition takes the same path).
func BenchmarkXDP(b *testing.B) {
	d := bpftest.NewDatapath(b, nodeIP)
	var floor FloorObjects
	if err := LoadFloorObjects(&floor, nil); err != nil {
		b.Fatal(err)
	}
	defer floor.Close()
	d.Put(d.Objs.SlPrefilterV1, gen.SluicePrefilterKey{Prefixlen: 24, Addr: gen.NetAddr(netip.MustParseAddr("198.51.100.0"))}, gen.SluicePrefilterValue{})
	dst := netip.AddrPortFrom(nodeIP, 30080)
	pass := bpftest.TCPPacket(netip.MustParseAddrPort("203.0.113.7:4000"), dst, bpftest.SYN)
	drop := bpftest.TCPPacket(netip.MustParseAddrPort("198.51.100.7:4000"), dst, bpftest.SYN)
	var emptyNs float64
	for _, c := range []struct {
		name  string
		prog  *ebpf.Program
		frame []byte
		want  uint32
	}{
		{"empty", floor.FloorXdpPass, pass, 2},
		{"pass", d.Objs.SlXdpPrefilter, pass, 2},
		{"drop", d.Objs.SlXdpPrefilter, drop, 1},
	} {
		b.Run(c.name, func(b *testing.B) {
			ret, per, err := c.prog.Benchmark(c.frame, b.N, b.ResetTimer)
			if err != nil || ret != c.want {
				b.Fatalf("verdict %d, want %d: %v", ret, c.want, err)
			}
			ns := float64(per.Nanoseconds())
			b.ReportMetric(ns, "ns/packet")
			if c.name == "empty" {
				emptyNs = ns
			} else if emptyNs > 0 {
				b.ReportMetric(ns/emptyNs, "x-empty")
			}
		})
	}
}
