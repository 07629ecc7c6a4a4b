package bench

import (
	"bufio"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// BenchmarkPodToPodRR is a request/response between two pods of one node
// over one TCP connection, as netperf's TCP_RR: each round trip is a short
// line to the server and its answer back, two packets through the node. It
// reports µs per round trip (rr-us), the machine's busy CPU time per round
// trip (cpu-us/rr: every CPU's, from /proc/stat, at its 10 ms resolution; a
// round trip is serial, so it follows rr-us), and the node's own forwarded
// datagrams per round trip (stack-fwd/rr):
//
//   - no-programs: the node's stack alone, nothing attached;
//   - stack-routing: Sluice's programs, with CFG_STACK_ROUTING (the node's
//     stack forwards between them);
//   - local-delivery: Sluice's programs, packets handed from one pod's
//     interface to the other's (bpf/include/deliver.h);
//   - local-delivery-service: the same through a ClusterIP (translated both
//     ways).
//
// The rows take turns (rrTurns): compare the rows of one run.
func BenchmarkPodToPodRR(b *testing.B) {
	bpftest.Require(b)
	plain := newDirectEnv(b) // pods behind veths, no programs
	d := bpftest.NewDatapath(b, nodeIP)
	topo := bpftest.NewTopology(b, d, "client", "server")
	bpftest.ServeTCP(b, topo.Pods["server"], "server", ":8080")
	server := netip.AddrPortFrom(topo.PodIP["server"], 8080)
	vip := netip.MustParseAddrPort("10.96.0.10:80")
	d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: 6, Backends: []bpftest.Backend{{AP: server, Local: true}}})

	rows := []struct {
		name   string
		ns     *bpftest.NetNS // the client pod
		node   *bpftest.NetNS
		to     string
		routed bool // CFG_STACK_ROUTING
	}{
		{"no-programs", plain.client, plain.node, plain.directTargets()[0], false},
		{"stack-routing", topo.Pods["client"], topo.Node, server.String(), true},
		{"local-delivery", topo.Pods["client"], topo.Node, server.String(), false},
		{"local-delivery-service", topo.Pods["client"], topo.Node, vip.String(), false},
	}
	conns := make([]*rrConn, len(rows))
	for i, r := range rows {
		c, err := dialRR(r.ns, r.to)
		if err != nil {
			b.Fatalf("%s: %v", r.name, err)
		}
		defer c.Close()
		conns[i] = c
	}
	// The rows take turns, so that what the machine does meanwhile weighs
	// on each alike.
	type sums struct {
		wall, cpu time.Duration
		fwd, n    uint64
	}
	got := make([]sums, len(rows))
	turns, perTurn := rrTurns()
	for range turns {
		for i, r := range rows {
			setStackRouting(b, d, r.routed)
			fwd, busy, start := forwarded(b, r.node), busyCPU(b), time.Now()
			if err := conns[i].roundTrips(perTurn); err != nil {
				b.Fatalf("%s: %v", r.name, err)
			}
			got[i].wall += time.Since(start)
			got[i].cpu += busyCPU(b) - busy
			got[i].fwd += forwarded(b, r.node) - fwd
			got[i].n += uint64(perTurn)
		}
	}
	for i, r := range rows {
		b.Run(r.name, func(b *testing.B) {
			for b.Loop() {
			}
			g := got[i]
			b.ReportMetric(float64(g.wall.Nanoseconds())/1000/float64(g.n), "rr-us")
			b.ReportMetric(float64(g.cpu.Nanoseconds())/1000/float64(g.n), "cpu-us/rr")
			b.ReportMetric(float64(g.fwd)/float64(g.n), "stack-fwd/rr")
		})
	}
}

// rrTurns is how many turns the rows take and how many round trips each
// makes in a turn: a few in CI, more with SLUICE_BENCH_FULL=1.
func rrTurns() (turns, perTurn int) {
	if os.Getenv("SLUICE_BENCH_FULL") == "1" {
		return 10, 10000
	}
	return 2, 1000
}

type rrConn struct {
	net.Conn
	r *bufio.Reader
}

func dialRR(ns *bpftest.NetNS, to string) (*rrConn, error) {
	var c net.Conn
	err := ns.Do(func() (err error) { c, err = net.DialTimeout("tcp4", to, 3*time.Second); return err })
	if err != nil {
		return nil, err
	}
	return &rrConn{Conn: c, r: bufio.NewReader(c)}, nil
}

// roundTrips sends n lines, each after the answer to the one before.
func (c *rrConn) roundTrips(n int) error {
	for range n {
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		if _, err := c.r.ReadString('\n'); err != nil {
			return err
		}
	}
	return nil
}

// setStackRouting sets or clears CFG_STACK_ROUTING, keeping the other
// settings.
func setStackRouting(b *testing.B, d *bpftest.Datapath, on bool) {
	var cfg gen.SluiceConfig
	if err := d.Objs.SlConfigV1.Lookup(uint32(0), &cfg); err != nil {
		b.Fatal(err)
	}
	cfg.Flags &^= gen.SluiceConfigFlagsCFG_STACK_ROUTING
	if on {
		cfg.Flags |= gen.SluiceConfigFlagsCFG_STACK_ROUTING
	}
	if err := d.Objs.SlConfigV1.Update(uint32(0), cfg, ebpf.UpdateAny); err != nil {
		b.Fatal(err)
	}
}

// busyCPU is the time every CPU of the machine has spent busy (/proc/stat:
// all but idle and iowait), at the clock tick's resolution.
func busyCPU(b *testing.B) time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		b.Fatalf("/proc/stat: %q", line)
	}
	var ticks uint64
	for i, v := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			b.Fatalf("/proc/stat: %q", line)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ
}

// userHZ is the unit of /proc/stat's times (USER_HZ, 100 on Linux).
const userHZ = 100

// forwarded is the IPv4 datagrams a namespace's stack has forwarded.
func forwarded(b *testing.B, ns *bpftest.NetNS) uint64 { v4, _ := ns.Forwarded(b); return v4 }
