package kubeproxy_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy"
	"github.com/sluice-net/sluice/kubeproxy/source"
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
	p := benchProxier(b)
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

// BenchmarkManifestOneFileChanged: a folder of 5,000 Services with their
// EndpointSlices, one file each; one small file is rewritten and the source
// syncs. ns/op is the folder sync (list, re-read the changed file, diff);
// cpu-ns/sync is the process CPU of it.
func BenchmarkManifestOneFileChanged(b *testing.B) {
	p := benchProxier(b)
	dir := benchManifestFolder(b)
	src := &source.ManifestSource{Dir: dir}
	src.Sync(p)
	cpu0 := cpuTime()
	i := 0
	for b.Loop() {
		if err := os.WriteFile(filepath.Join(dir, "s42.yaml"), []byte(benchManifest(42, fmt.Sprintf("10.100.0.%d", 2+i%2))), 0o644); err != nil {
			b.Fatal(err)
		}
		src.Sync(p)
		i++
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(i), "cpu-ns/sync")
}

// BenchmarkManifestFolderUnchanged: the same folder, nothing changed: the
// cost of one check (list and stat every file), which polling pays every
// interval and an inotify-watched folder only every recheck (30 s).
func BenchmarkManifestFolderUnchanged(b *testing.B) {
	p := benchProxier(b)
	src := &source.ManifestSource{Dir: benchManifestFolder(b)}
	src.Sync(p)
	cpu0 := cpuTime()
	i := 0
	for b.Loop() {
		src.Sync(p)
		i++
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(i), "cpu-ns/sync")
}

// benchManifestFolder writes 5,000 Services with one EndpointSlice each, a
// file per Service.
func benchManifestFolder(b *testing.B) string {
	dir := b.TempDir()
	for i := range 5_000 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("s%d.yaml", i)), []byte(benchManifest(i, "10.100.0.1")), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

func benchManifest(i int, backend string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: s%d}
spec: {clusterIP: 10.96.%d.%d, ports: [{name: http, port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s%d-1, labels: {kubernetes.io/service-name: s%d}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ["%s"]}]
`, i, i/250, i%250+1, i, i, backend)
}

// benchProxier is a proxier on maps of its own, for benchmarks.
func benchProxier(b *testing.B) *kubeproxy.Proxier {
	set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { set.Close() })
	syncer, err := nat.NewSyncer(nat.Options{Maps: set})
	if err != nil {
		b.Fatal(err)
	}
	return kubeproxy.NewProxier(kubeproxy.Config{NodeName: "node-a"}, syncer, nil, nil, nil)
}
