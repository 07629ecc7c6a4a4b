package nat_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

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
