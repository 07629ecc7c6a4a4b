package nat_test

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
)

func benchSyncer(b *testing.B) *nat.Syncer {
	set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { set.Close() })
	s, err := nat.NewSyncer(nat.Options{Maps: set})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func benchState(n int) nat.State {
	svcs, e := scale(n, 10)
	st := nat.State{Node: nat.Node{Name: "node-a", NodePortIPs: []netip.Addr{nodeIP}, AllNodePortIPs: true},
		Services: map[nat.ServicePortName]*nat.ServicePort{}, Endpoints: e}
	for _, s := range svcs {
		st.Services[s.Name] = s
	}
	return st
}

func report(b *testing.B, writes int) {
	b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
}

// BenchmarkApplyFull: services × 10 endpoints programmed from empty maps.
func BenchmarkApplyFull(b *testing.B) {
	for _, n := range []int{100, 1_000, 10_000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) { benchFull(b, n) })
	}
}

func benchFull(b *testing.B, n int) {
	st := benchState(n)
	writes := 0
	for b.Loop() {
		b.StopTimer()
		s := benchSyncer(b)
		b.StartTimer()
		stats, err := s.Apply(st)
		if err != nil {
			b.Fatal(err)
		}
		writes += stats.Writes
	}
	report(b, writes)
}

// BenchmarkApplyOneEndpointChanged: one endpoint of one service replaced, at
// 10,000 services × 10 endpoints, with the change named in State.Changed (as
// the kube-proxy shim's change tracker does) and without (full compare).
func BenchmarkApplyOneEndpointChanged(b *testing.B) {
	for _, n := range []int{100, 1_000, 10_000} {
		b.Run(fmt.Sprintf("services=%d/change-set", n), func(b *testing.B) { benchOneChange(b, n, true) })
		b.Run(fmt.Sprintf("services=%d/full-compare", n), func(b *testing.B) { benchOneChange(b, n, false) })
	}
}

func benchOneChange(b *testing.B, n int, changeSet bool) {
	st := benchState(n)
	s := benchSyncer(b)
	if _, err := s.Apply(st); err != nil {
		b.Fatal(err)
	}
	name := nat.ServicePortName{Namespace: "default", Name: fmt.Sprintf("s%d", n/2), Port: "p"}
	orig := st.Endpoints[name]
	alt := slices.Clone(orig)
	alt[3].Addr = netip.MustParseAddrPort("10.250.0.1:8080")
	if changeSet {
		st.Changed = map[nat.ServicePortName]bool{name: true}
	}
	writes, i := 0, 0
	for b.Loop() {
		if i%2 == 0 {
			st.Endpoints[name] = alt
		} else {
			st.Endpoints[name] = orig
		}
		i++
		stats, err := s.Apply(st)
		if err != nil {
			b.Fatal(err)
		}
		writes += stats.Writes + stats.Deletes
	}
	report(b, writes)
}

// BenchmarkApplyNoChange: the same 10,000 × 10 state applied again.
func BenchmarkApplyNoChange(b *testing.B) {
	st := benchState(10_000)
	s := benchSyncer(b)
	if _, err := s.Apply(st); err != nil {
		b.Fatal(err)
	}
	writes := 0
	for b.Loop() {
		stats, err := s.Apply(st)
		if err != nil {
			b.Fatal(err)
		}
		writes += stats.Writes + stats.Deletes
	}
	report(b, writes)
}

// BenchmarkApplyFullMaglev: services × 100 endpoints programmed from empty
// maps with Maglev tables of the default size, beside the same without
// Maglev. kernel-MiB is what the node's available memory dropped by while
// the maps held the result (the tables dominate it: 64 KiB each).
//
//	go test -run XXX -bench ApplyFullMaglev -benchtime 1x ./nat
func BenchmarkApplyFullMaglev(b *testing.B) {
	for _, n := range []int{100, 10_000} {
		for _, on := range []bool{false, true} {
			b.Run(fmt.Sprintf("services=%d/backends=100/maglev=%v", n, on), func(b *testing.B) {
				svcs, e := scale(n, 100)
				st := nat.State{Node: nat.Node{Name: "node-a", NodePortIPs: []netip.Addr{nodeIP}, AllNodePortIPs: true},
					Services: map[nat.ServicePortName]*nat.ServicePort{}, Endpoints: e}
				for _, s := range svcs {
					s.NodePort = 30000 // the frontends Maglev serves
					st.Services[s.Name] = s
				}
				var dropped float64
				for b.Loop() {
					b.StopTimer()
					set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(b)})
					if err != nil {
						b.Fatal(err)
					}
					opts := nat.Options{Maps: set}
					var outer *ebpf.Map
					if on {
						spec, err := gen.Spec()
						if err != nil {
							b.Fatal(err)
						}
						if outer, err = ebpf.NewMap(spec.Maps[gen.SluiceMapSlMaglevV1]); err != nil {
							b.Fatal(err)
						}
						opts.Maglev = &nat.MaglevOptions{Tables: outer}
					}
					s, err := nat.NewSyncer(opts)
					if err != nil {
						b.Fatal(err)
					}
					before := memAvailable(b)
					b.StartTimer()
					if _, err := s.Apply(st); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					dropped += float64(before-memAvailable(b)) / (1 << 20)
					if outer != nil {
						outer.Close()
					}
					set.Close()
					b.StartTimer()
				}
				b.ReportMetric(dropped/float64(b.N), "kernel-MiB")
			})
		}
	}
}

// memAvailable is /proc/meminfo's MemAvailable, in bytes.
func memAvailable(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		var kb int64
		if _, err := fmt.Sscanf(line, "MemAvailable: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	b.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}

// BenchmarkReplanMaglev: every Service planned again with Maglev on, 1,000
// Services × 100 backends already programmed. A node address change keeps
// every Service's cluster backends, so each table is reused; a change of
// every Service's backends (one backend's port each) builds each again.
func BenchmarkReplanMaglev(b *testing.B) {
	for _, change := range []string{"node-address", "every-service-backends"} {
		b.Run(change, func(b *testing.B) {
			svcs, e := scale(1_000, 100)
			st := nat.State{Node: nat.Node{Name: "node-a", NodePortIPs: []netip.Addr{nodeIP}, AllNodePortIPs: true},
				Services: map[nat.ServicePortName]*nat.ServicePort{}, Endpoints: e}
			for _, s := range svcs {
				s.NodePort = 30000
				st.Services[s.Name] = s
			}
			set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(b)})
			if err != nil {
				b.Fatal(err)
			}
			defer set.Close()
			spec, err := gen.Spec()
			if err != nil {
				b.Fatal(err)
			}
			outer, err := ebpf.NewMap(spec.Maps[gen.SluiceMapSlMaglevV1])
			if err != nil {
				b.Fatal(err)
			}
			defer outer.Close()
			s, err := nat.NewSyncer(nat.Options{Maps: set, Maglev: &nat.MaglevOptions{Tables: outer}})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Apply(st); err != nil {
				b.Fatal(err)
			}
			built := 0
			for i := 0; b.Loop(); i++ {
				if change == "node-address" {
					st.Node.NodePortIPs = []netip.Addr{nodeIP, netip.AddrFrom4([4]byte{10, 0, 1, byte(i)})}
				} else {
					for _, s := range svcs {
						eps := slices.Clone(e[s.Name])
						eps[0].Addr = netip.AddrPortFrom(eps[0].Addr.Addr(), uint16(9000+i%1000))
						e[s.Name] = eps
					}
				}
				stats, err := s.Apply(st)
				if err != nil {
					b.Fatal(err)
				}
				built += stats.MaglevTablesBuilt
			}
			b.ReportMetric(float64(built)/float64(b.N), "tables-built/op")
		})
	}
}
