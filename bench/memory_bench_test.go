package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// BenchmarkAgentMemory: each proxy's resident memory (VmRSS) once it has
// programmed N Services × 10 endpoints listed from a real API server, in the
// same run: Sluice and kube-proxy in nftables mode. The objects exist before
// the proxy starts (its initial list), and a probe Service created after
// them answers when everything before it is programmed. CI: 100 Services;
// SLUICE_BENCH_FULL=1: 1,000, 10,000 and 50,000. SLUICE_BENCH_HEAP_PROFILE,
// a folder, receives Sluice's heap profile at the measurement
// (sluice-N.heap, for go tool pprof, and sluice-N.heap.txt with the
// runtime's memory statistics).
func BenchmarkAgentMemory(b *testing.B) {
	bpftest.Require(b)
	if _, _, err := apiservertest.Binaries(); err != nil {
		b.Skip(err)
	}
	sluice, kubeProxy := proxyBinaries(b)
	sizes := []int{100}
	if os.Getenv("SLUICE_BENCH_FULL") == "1" {
		sizes = []int{1_000, 10_000, 50_000}
	}
	if s := os.Getenv("SLUICE_BENCH_MEMORY_SIZES"); s != "" {
		sizes = nil
		for f := range strings.SplitSeq(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				b.Fatalf("SLUICE_BENCH_MEMORY_SIZES: %v", err)
			}
			sizes = append(sizes, n)
		}
	}
	for _, n := range sizes {
		for _, proxy := range []string{"sluice", "nftables"} {
			b.Run(fmt.Sprintf("services=%d/%s", n, proxy), func(b *testing.B) {
				var at proxyAtScale
				measured := false
				for b.Loop() {
					if !measured { // once: b.N's growth reuses it
						at, measured = memoryAt(b, proxy, n, sluice, kubeProxy), true
					}
				}
				b.ReportMetric(at.rss.total, "rss-MB")
				// What the process allocated, and the pages of its binary
				// it touched (the same for every size: code and tables).
				b.ReportMetric(at.rss.anon, "anon-MB")
				b.ReportMetric(at.rss.file, "file-MB")
				b.ReportMetric(at.metricsKB, "metrics-KB")
				b.ReportMetric(at.scrapeCPUMs, "scrape-cpu-ms")
				b.ReportMetric(at.startupMs, "startup-ms")
				b.ReportMetric(at.cpuS, "startup-cpu-s")
				b.ReportMetric(at.changeMs, "change-ms")
			})
		}
	}
}

// proxyAtScale is what memoryAt measures of a proxy: its memory; its
// /metrics as a Prometheus scrape gets it (the size, and the proxy's CPU
// time a scrape costs, averaged over 30); the time from its start to the
// probe's answer (every object listed and programmed) and the CPU it spent
// on that; and the time one EndpointSlice change then takes to reach a
// client.
type proxyAtScale struct {
	rss                    residentMemory
	metricsKB, scrapeCPUMs float64
	startupMs, cpuS        float64
	changeMs               float64
}

// residentMemory is a process's resident set (VmRSS) and its two parts,
// anonymous (RssAnon) and file-backed (RssFile), in MB.
type residentMemory struct{ total, anon, file float64 }

func memoryAt(b *testing.B, proxy string, n int, sluice, kubeProxy string) proxyAtScale {
	e := newBaselineEnv(b)
	start := time.Now()
	e.createServicesWithEndpoints(b, n, 10)
	b.Logf("created %d Services and their EndpointSlices in %v", n, time.Since(start).Round(time.Second))
	profiles := os.Getenv("SLUICE_BENCH_HEAP_PROFILE")
	var extra []string
	if proxy == "sluice" { // on kube-proxy's address, with its default flags
		extra = []string{"--metrics-bind-address=127.0.0.1:10249"}
		if profiles != "" {
			extra = append(extra, "--profiling")
		}
	}
	started := time.Now()
	p := e.startProxy(b, proxy, sluice, kubeProxy, extra...)
	probe := e.createServices(b, "probe", 1, e.backendIPs[0])
	e.waitFor(b, probe[0]+":80", "b1", 10*time.Minute)
	at := proxyAtScale{startupMs: float64(time.Since(started).Microseconds()) / 1000,
		cpuS: processCPU(b, p.Pid).Seconds()}
	time.Sleep(3 * time.Second) // the sync that programmed the probe settles
	if profiles != "" && proxy == "sluice" {
		// The runtime's own figures first (heap in use, idle, returned), as
		// they were at the RSS reading; then the profile, after a GC.
		defer e.saveHeapProfile(b, "http://127.0.0.1:10249/debug/pprof/heap?gc=1", filepath.Join(profiles, fmt.Sprintf("sluice-%d.heap", n)))
		defer e.saveHeapProfile(b, "http://127.0.0.1:10249/debug/pprof/heap?debug=1", filepath.Join(profiles, fmt.Sprintf("sluice-%d.heap.txt", n)))
	}
	at.rss = readResidentMemory(b, p.Pid)
	const scrapes = 30
	size := e.scrape(b, "http://127.0.0.1:10249/metrics") // the first: a collector's state set up
	cpu := processCPU(b, p.Pid)
	for range scrapes {
		size = e.scrape(b, "http://127.0.0.1:10249/metrics")
	}
	at.scrapeCPUMs = float64(processCPU(b, p.Pid)-cpu) / float64(time.Millisecond) / scrapes
	at.metricsKB = float64(size) / 1000
	at.changeMs = e.timeOneChange(b, probe[0])
	return at
}

// readResidentMemory reads a process's VmRSS, RssAnon and RssFile.
func readResidentMemory(b *testing.B, pid int) residentMemory {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	var m residentMemory
	fields := map[string]*float64{"VmRSS:": &m.total, "RssAnon:": &m.anon, "RssFile:": &m.file}
	for line := range strings.Lines(string(status)) {
		if f := strings.Fields(line); len(f) >= 2 && fields[f[0]] != nil {
			kb, err := strconv.Atoi(f[1])
			if err != nil {
				b.Fatalf("/proc status: %q: %v", line, err)
			}
			*fields[f[0]] = float64(kb) / 1024
			delete(fields, f[0])
		}
	}
	if len(fields) != 0 {
		b.Fatalf("/proc status lacks %v", slices.Collect(maps.Keys(fields)))
	}
	return m
}

// scrape fetches url in the node namespace as Prometheus would (text
// format) and returns the bytes it served.
func (e *baselineEnv) scrape(b *testing.B, url string) int {
	out, err := exec.Command("ip", "netns", "exec", e.node.Name, "curl", "-sSf", "-o", "/dev/null", "-w", "%{size_download}",
		"-H", "Accept: text/plain;version=0.0.4", url).CombinedOutput()
	if err != nil {
		b.Fatalf("%s: %v: %s", url, err, out)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		b.Fatalf("%s: size %q: %v", url, out, err)
	}
	return n
}

// createServicesWithEndpoints creates n Services with perService endpoints
// each (addresses nothing answers on: only the probe is dialled), from 16
// clients at once.
func (e *baselineEnv) createServicesWithEndpoints(b *testing.B, n, perService int) {
	ctx := context.Background()
	inParallel(b, 16, n, func(i int) error {
		svc, err := manifestService(i)
		if err != nil {
			return err
		}
		if _, err := e.api.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{FieldManager: "kubectl-client-side-apply"}); err != nil {
			return err
		}
		_, err = e.api.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, controllerSlice(i, perService), metav1.CreateOptions{FieldManager: "endpointslice-controller"})
		return err
	})
}

// manifestService is Service i (named m<i>) as `kubectl apply` of a
// Helm-labelled manifest creates it: the manifest in the last-applied
// annotation (the API server adds managedFields for kubectl's field
// manager).
func manifestService(i int) (*v1.Service, error) {
	name := fmt.Sprintf("m%d", i)
	svc := &v1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{
			"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name + "-prod", "app.kubernetes.io/version": "1.24.3",
			"app.kubernetes.io/component": "server", "app.kubernetes.io/part-of": "shop", "app.kubernetes.io/managed-by": "Helm",
			"helm.sh/chart": "shop-server-4.2.1", "team": "checkout"}},
		Spec: v1.ServiceSpec{Selector: map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name + "-prod"},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromString("http")}}}}
	applied, err := json.Marshal(svc)
	if err != nil {
		return nil, err
	}
	svc.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": string(applied) + "\n",
		"meta.helm.sh/release-name": name + "-prod", "meta.helm.sh/release-namespace": "default"}
	return svc, nil
}

// controllerSlice is Service i's EndpointSlice of perService endpoints as
// the EndpointSlice controller writes it: besides the endpoints, its
// owner, its labels, and the Pod behind each endpoint.
func controllerSlice(i, perService int) *discovery.EndpointSlice {
	name := fmt.Sprintf("m%d", i)
	var addrs []string
	for j := range perService {
		addrs = append(addrs, fmt.Sprintf("10.%d.%d.%d", 100+j, (i>>8)&0xff, i&0xff))
	}
	s := slice(name, 8080, addrs...)
	s.Namespace = "default"
	s.Annotations = map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": time.Now().UTC().Format(time.RFC3339)}
	s.Labels["endpointslice.kubernetes.io/managed-by"] = "endpointslice-controller.k8s.io"
	s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name,
		UID: serviceUID(i), Controller: ptr(true), BlockOwnerDeletion: ptr(true)}}
	for j := range s.Endpoints {
		s.Endpoints[j].Conditions = discovery.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}
		s.Endpoints[j].NodeName = ptr(fmt.Sprintf("node-%d", j))
		s.Endpoints[j].TargetRef = &v1.ObjectReference{Kind: "Pod", Namespace: "default", Name: fmt.Sprintf("%s-%d-x7k2p", name, j),
			UID: types.UID(fmt.Sprintf("00000000-0000-0000-%04d-%012d", j, i))}
	}
	return s
}

// serviceUID is the UID Service i is given where the benchmark stores it
// itself (storeServicesWithEndpoints), and its slice's owner's.
func serviceUID(i int) types.UID { return types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", i)) }

// inParallel calls do for 0..n-1 from workers goroutines (item i on worker
// i mod workers), as many API clients creating objects at once; the first
// error fails b.
func inParallel(b *testing.B, workers, n int, do func(i int) error) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				if err := do(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// saveHeapProfile writes the heap profile served at url in the node
// namespace to file. It runs after the RSS is read: fetching a profile
// allocates.
func (e *baselineEnv) saveHeapProfile(b *testing.B, url, file string) {
	if out, err := exec.Command("ip", "netns", "exec", e.node.Name, "curl", "-sSf", "-o", file, url).CombinedOutput(); err != nil {
		b.Fatalf("%s: %v: %s", url, err, out)
	}
}

func ptr[T any](v T) *T { return &v }
