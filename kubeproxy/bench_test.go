package kubeproxy_test

import (
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
	discovery "k8s.io/api/discovery/v1"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEndpointSliceToMaps: one EndpointSlice update recorded in the
// store (the tracker informers feed), then the sync that writes it, at 10,000
// services × 10 endpoints. ns/op is store-to-maps latency (the runner's
// min-sync-period wait aside); cpu-ns/sync is the process CPU per sync.
func BenchmarkEndpointSliceToMaps(b *testing.B) {
	set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer set.Close()
	syncer, err := nat.NewSyncer(nat.Options{Maps: set})
	if err != nil {
		b.Fatal(err)
	}
	p := kubeproxy.NewProxier(kubeproxy.Config{NodeName: "node-a"}, syncer, nil, nil, nil)
	p.SetNodeIPs([]netip.Addr{netip.MustParseAddr("10.0.0.1")})
	tr := p.Tracker()
	for i := range 10_000 {
		name := fmt.Sprintf("s%d", i)
		tr.OnService(svc(name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)), false)
		var ips []string
		for j := range 10 {
			ips = append(ips, fmt.Sprintf("10.%d.%d.%d", 100+j, i/250, i%250+1))
		}
		tr.OnEndpointSlice(endpointSlice(name, name+"-1", ips...), false)
	}
	p.OnServicesSynced()
	p.OnEndpointSlicesSynced()
	if err := p.Sync(); err != nil {
		b.Fatal(err)
	}
	a := endpointSlice("s1234", "s1234-1", "10.100.4.235", "10.101.4.235", "10.250.0.1")
	c := endpointSlice("s1234", "s1234-1", "10.100.4.235", "10.101.4.235", "10.250.0.2")
	cpu0 := cpuTime()
	i := 0
	for b.Loop() {
		tr.OnEndpointSlice([]*discovery.EndpointSlice{a, c}[i%2], false)
		if err := p.Sync(); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(i), "cpu-ns/sync")
}
