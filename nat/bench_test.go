package nat_test

import (
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

// BenchmarkApplyFull: 10,000 services × 10 endpoints programmed from empty maps.
func BenchmarkApplyFull(b *testing.B) {
	st := benchState(10_000)
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
	b.Run("change-set", func(b *testing.B) { benchOneChange(b, true) })
	b.Run("full-compare", func(b *testing.B) { benchOneChange(b, false) })
}

func benchOneChange(b *testing.B, changeSet bool) {
	st := benchState(10_000)
	s := benchSyncer(b)
	if _, err := s.Apply(st); err != nil {
		b.Fatal(err)
	}
	name := nat.ServicePortName{Namespace: "default", Name: "s1234", Port: "p"}
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
