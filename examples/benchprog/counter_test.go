package benchprog

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen/bpftest"
)

var (
	client  = netip.MustParseAddrPort("10.0.0.5:40000")
	service = netip.MustParseAddrPort("10.96.0.10:80")
)

// The counter counts: three packets through it, three in its map.
func TestCounterCounts(t *testing.T) {
	bpftest.Require(t)
	prog, counts, err := NewCounter()
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	defer counts.Close()
	frame := bpftest.TCPPacket(client, service, bpftest.SYN)
	for range 3 {
		if ret, err := prog.Run(&ebpf.RunOptions{Data: frame}); err != nil || ret != bpftest.ActOK {
			t.Fatalf("run: %d %v", ret, err)
		}
	}
	var n uint64
	if err := counts.Lookup(uint32(0), &n); err != nil || n != 3 {
		t.Fatalf("count %d, %v; want 3", n, err)
	}
}

// BenchmarkCounterBesideSluice times one's own program and Sluice's
// from-workload program on the same new TCP connection to a Service, in one
// run, and reports each in ns/packet and their ratio.
func BenchmarkCounterBesideSluice(b *testing.B) {
	prog, counts, err := NewCounter()
	if err != nil {
		b.Fatal(err)
	}
	defer prog.Close()
	defer counts.Close()
	d := bpftest.NewDatapath(b, netip.MustParseAddr("10.0.0.1"))
	d.AddService(bpftest.Service{ID: 1, Front: service, Proto: 6,
		Backends: []bpftest.Backend{{AP: netip.MustParseAddrPort("10.1.0.7:8080")}}})
	frame := bpftest.TCPPacket(client, service, bpftest.SYN)
	timeOf := func(p *ebpf.Program) float64 {
		ret, per, err := p.Benchmark(frame, b.N, nil)
		if err != nil || ret != bpftest.ActOK {
			b.Fatalf("%v: verdict %d, %v", p, ret, err)
		}
		return float64(per.Nanoseconds())
	}
	b.ResetTimer()
	own, sluice := timeOf(prog), timeOf(d.Objs.SlFromWl)
	b.ReportMetric(own, "own-ns/packet")
	b.ReportMetric(sluice, "sluice-ns/packet")
	b.ReportMetric(sluice/max(own, 1), "sluice/own")
}
