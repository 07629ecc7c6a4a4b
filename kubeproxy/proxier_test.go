package kubeproxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy"
	proxymetrics "github.com/sluice-net/sluice/kubeproxy/metrics"
	"github.com/sluice-net/sluice/kubeproxy/source"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func ptr[T any](v T) *T { return &v }

type env struct {
	t       *testing.T
	set     *maps.Set
	p       *kubeproxy.Proxier
	reg     *prometheus.Registry
	metrics *proxymetrics.Metrics
}

func newEnv(t *testing.T, cfg kubeproxy.Config) *env {
	set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	syncer, err := nat.NewSyncer(nat.Options{Maps: set})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName == "" {
		cfg.NodeName = "node-a"
	}
	if cfg.MinSyncPeriod == 0 {
		cfg.MinSyncPeriod = 20 * time.Millisecond
	}
	cfg.HealthCheckBindIP = "127.0.0.1"
	reg := prometheus.NewRegistry()
	m := proxymetrics.NewMetrics(reg)
	p := kubeproxy.NewProxier(cfg, syncer, nil, m, nil)
	p.SetNodeIPs([]netip.Addr{netip.MustParseAddr("10.0.0.1")})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	t.Cleanup(func() { // before the maps close: a sync may be writing them
		cancel()
		<-stopped
	})
	go func() {
		defer close(stopped)
		p.Run(ctx)
	}()
	return &env{t: t, set: set, p: p, reg: reg, metrics: m}
}

// frontends lists the programmed frontends as "ip:port/proto".
func (e *env) frontends() map[string]gen.SluiceFeValue {
	m, err := maps.Frontends.In(e.set)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]gen.SluiceFeValue{}
	m.Iterate(func(k gen.SluiceFeKey, v gen.SluiceFeValue) bool {
		if k.Proto != 1 { // not the echo markers
			out[fmt.Sprintf("%v:%d/%d", gen.AddrFromNet(k.Addr), gen.PortFromNet(k.Port), k.Proto)] = v
		}
		return true
	})
	return out
}

func (e *env) eventually(what string, cond func() bool) {
	e.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	e.t.Fatalf("timed out waiting for %s; frontends %v", what, e.frontends())
}

func svc(name, ip string, mods ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}
	for _, m := range mods {
		m(s)
	}
	return s
}

func endpointSlice(svcName, name string, ips ...string) *discovery.EndpointSlice {
	s := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
		Labels: map[string]string{kubeproxy.LabelServiceName: svcName}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(v1.ProtocolTCP)}}}
	for _, ip := range ips {
		local := strings.HasSuffix(ip, "@local")
		ip = strings.TrimSuffix(ip, "@local")
		ep := discovery.Endpoint{Addresses: []string{ip}, NodeName: ptr("node-b")}
		if local {
			ep.NodeName = ptr("node-a")
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

func TestInformersDriveTheMaps(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{})
	client := fake.NewClientset()
	ctx := context.Background()
	create := func(obj any) {
		var err error
		switch o := obj.(type) {
		case *v1.Service:
			_, err = client.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *discovery.EndpointSlice:
			_, err = client.DiscoveryV1().EndpointSlices(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	create(svc("web", "10.96.0.10"))
	create(endpointSlice("web", "web-1", "10.2.0.1", "10.2.0.2"))
	create(svc("np", "10.96.0.11", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort; s.Spec.Ports[0].NodePort = 30011 }))
	create(svc("lb", "10.96.0.12", func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30012
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.12"}}
	}))
	create(svc("ext", "10.96.0.13", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName; s.Spec.ExternalName = "x.example" }))
	create(svc("headless", "None"))
	create(svc("other-proxy", "10.96.0.14", func(s *v1.Service) { s.Labels = map[string]string{kubeproxy.LabelServiceProxyName: "other"} }))
	hs := endpointSlice("web", "web-headless", "10.9.9.9")
	hs.Labels[kubeproxy.LabelHeadless] = ""
	create(hs)

	if err := source.RunInformers(ctx, client, e.p, 0); err != nil {
		t.Fatal(err)
	}
	e.eventually("every service type programmed", func() bool {
		fe := e.frontends()
		// web; np: ClusterIP, node IP, wildcard; lb: ClusterIP, LB IP, node IP, wildcard
		return fe["10.96.0.10:80/6"].Count == 2 && len(fe) == 8
	})
	fe := e.frontends()
	for _, k := range []string{"10.96.0.11:80/6", "10.0.0.1:30011/6", "255.255.255.255:30011/6", "10.96.0.12:80/6", "203.0.113.12:80/6", "10.0.0.1:30012/6"} {
		if _, ok := fe[k]; !ok {
			t.Errorf("frontend %s missing", k)
		}
	}
	for _, k := range []string{"10.96.0.13:80/6", "10.96.0.14:80/6"} {
		if _, ok := fe[k]; ok {
			t.Errorf("frontend %s of a service that is not ours", k)
		}
	}

	// Update: scale down; change type; delete.
	s2 := endpointSlice("web", "web-1", "10.2.0.1")
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, s2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	np, _ := client.CoreV1().Services("default").Get(ctx, "np", metav1.GetOptions{})
	np.Spec.Type, np.Spec.Ports[0].NodePort = v1.ServiceTypeClusterIP, 0
	if _, err := client.CoreV1().Services("default").Update(ctx, np, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Services("default").Delete(ctx, "lb", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("updates and deletes followed", func() bool {
		fe := e.frontends()
		_, nodePort := fe["10.0.0.1:30011/6"]
		_, lb := fe["203.0.113.12:80/6"]
		return fe["10.96.0.10:80/6"].Count == 1 && !nodePort && !lb && len(fe) == 2
	})
	if got := testutil.ToFloat64(e.metrics.ServiceChanges); got < 7 {
		t.Fatalf("service changes counted %v", got)
	}

	// A slice's deletion reaches the tracker from what the informer's
	// cache kept of it.
	if err := client.DiscoveryV1().EndpointSlices("default").Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("a slice's deletion followed", func() bool {
		web, ok := e.frontends()["10.96.0.10:80/6"]
		return ok && web.Count == 0
	})

	// A slice relabelled in place to another service leaves the one it was
	// filed under (the informer's update carries the slice before).
	create(svc("api", "10.96.0.15"))
	create(endpointSlice("web", "shared-1", "10.2.0.7"))
	e.eventually("a slice of web", func() bool { return e.frontends()["10.96.0.10:80/6"].Count == 1 })
	moved := endpointSlice("api", "shared-1", "10.2.0.7")
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, moved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("the relabelled slice is api's and no longer web's", func() bool {
		fe := e.frontends()
		return fe["10.96.0.10:80/6"].Count == 0 && fe["10.96.0.15:80/6"].Count == 1
	})
}

func TestTerminatingAndLocalEndpoints(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{})
	tr := e.p.Tracker()
	s := svc("web", "10.96.0.10", func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30020
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})
	sl := endpointSlice("web", "web-1", "10.2.0.1@local", "10.2.0.2")
	sl.Endpoints[1].Conditions = discovery.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}
	tr.OnService(s, false)
	tr.OnEndpointSlice(sl, false)
	e.p.OnServicesSynced()
	e.p.OnEndpointSlicesSynced()
	e.eventually("external-local service", func() bool {
		v := e.frontends()["10.0.0.1:30020/6"]
		// Cluster: the ready endpoint only (a terminating one is a fallback);
		// local: the local ready one.
		return v.Count == 1 && v.LocalCount == 1 && v.Flags&gen.SluiceFeFlagsFE_EXT_LOCAL != 0
	})
}

// 100 changes in a burst are coalesced into a few syncs, not 100.
func TestCoalescing(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{MinSyncPeriod: 100 * time.Millisecond})
	tr := e.p.Tracker()
	e.p.OnServicesSynced()
	e.p.OnEndpointSlicesSynced()
	e.eventually("first sync", func() bool { return e.p.Runs() >= 1 })
	before := e.p.Runs()
	for i := range 100 {
		tr.OnService(svc(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.1.%d", i)), false)
	}
	e.eventually("all 100 services programmed", func() bool { return len(e.frontends()) == 100 })
	// One more change after the burst: once it is programmed, every sync the
	// burst queued has run (a trigger queued meanwhile is coalesced into its).
	tr.OnService(svc("marker", "10.96.2.1"), false)
	e.eventually("the marker programmed", func() bool { return len(e.frontends()) == 101 })
	if syncs := e.p.Runs() - before; syncs > 4 {
		t.Fatalf("100 changes and a marker took %d syncs", syncs)
	}
}

// No sync runs before both Services and EndpointSlices are listed.
func TestWaitsForBothLists(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{})
	e.p.OnServicesSynced()
	e.eventually("a sync after the Services list", func() bool { return e.p.Runs() >= 1 })
	// This event's sync starts after the event: once it has run, a sync
	// that would program the Service has had its chance.
	e.p.Tracker().OnService(svc("web", "10.96.0.10"), false)
	e.eventually("a sync after the Service", func() bool { return e.p.Runs() >= 2 })
	if len(e.frontends()) != 0 || e.p.Applied() != 0 {
		t.Fatal("synced before EndpointSlices were listed")
	}
	e.p.OnEndpointSlicesSynced()
	e.eventually("sync after both lists", func() bool { return len(e.frontends()) == 1 })
}

func TestBadObjectsSkippedOthersProgrammed(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{})
	tr := e.p.Tracker()
	tr.OnService(svc("bad", "10.96.0.30", func(s *v1.Service) { s.Spec.Ports[0].NodePort = 99; s.Spec.Type = v1.ServiceTypeNodePort }), false)
	tr.OnService(svc("good", "10.96.0.31"), false)
	bad := endpointSlice("good", "good-bad", "10.2.0.300")
	tr.OnEndpointSlice(bad, false)
	tr.OnEndpointSlice(endpointSlice("good", "good-1", "10.2.0.5"), false)
	e.p.OnServicesSynced()
	e.p.OnEndpointSlicesSynced()
	e.eventually("good service programmed", func() bool { return e.frontends()["10.96.0.31:80/6"].Count == 1 })
	if _, ok := e.frontends()["10.96.0.30:80/6"]; ok {
		t.Fatal("bad service programmed")
	}
	if got := testutil.ToFloat64(e.metrics.SkippedObjects); got != 2 {
		t.Fatalf("skipped objects counted %v, want 2 (each logged once)", got)
	}
}

// getJSON fetches a health endpoint and decodes its JSON answer.
func getJSON(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("content type %q", resp.Header.Get("Content-Type"))
	}
	return resp.StatusCode, m
}

func nodeA(deleting bool) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.0.0.1"}}}}
	if deleting {
		n.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	}
	return n
}

// /healthz as kube-proxy's: 200 with the node eligible, 503 while the node is
// being deleted (counted); /livez stays 200.
func TestHealthzOfANodeBeingDeleted(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{SyncPeriod: time.Hour})
	h := httptest.NewServer(e.p.Health.Handler())
	defer h.Close()
	code, body := getJSON(t, h.URL+"/healthz")
	if code != 200 || body["nodeEligible"] != true || body["lastUpdated"] == nil || body["currentTime"] == nil {
		t.Fatalf("healthz %d %v", code, body)
	}
	if code, body := getJSON(t, h.URL+"/livez"); code != 200 || body["nodeEligible"] != nil {
		t.Fatalf("livez %d %v", code, body)
	}
	e.p.OnNode(nodeA(true))
	if code, body := getJSON(t, h.URL+"/healthz"); code != 503 || body["nodeEligible"] != false {
		t.Fatalf("healthz of a node being deleted: %d %v", code, body)
	}
	if code, _ := getJSON(t, h.URL+"/livez"); code != 200 {
		t.Fatalf("livez of a node being deleted: %d", code)
	}
	if got := testutil.ToFloat64(e.metrics.Healthz.WithLabelValues("503")); got != 1 {
		t.Fatalf("healthz 503 counted %v", got)
	}
}

// A source that cannot be read, or interfaces without their programs:
// /healthz says so, /livez does not (a restart would not help).
func TestHealthzNamesASourceError(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{SyncPeriod: time.Hour})
	h := httptest.NewServer(e.p.Health.Handler())
	defer h.Close()
	e.p.OnNode(nodeA(false))
	e.p.Health.SetSourceError("manifests", errors.New("manifests folder /m: no such file or directory"))
	if code, body := getJSON(t, h.URL+"/healthz"); code != 503 || !strings.Contains(fmt.Sprint(body["sourceErrors"]), "no such file") {
		t.Fatalf("healthz with an unreadable source: %d %v", code, body)
	}
	if code, _ := getJSON(t, h.URL+"/livez"); code != 200 {
		t.Fatalf("livez with an unreadable source: %d", code)
	}
	e.p.Health.SetSourceError("manifests", nil)
	if code, body := getJSON(t, h.URL+"/healthz"); code != 200 || body["sourceErrors"] != nil {
		t.Fatalf("healthz once the source is back: %d %v", code, body)
	}
}

// A LoadBalancer service with externalTrafficPolicy Local gets a
// health-check NodePort: 200 with a local endpoint, 503 without, closed when
// the service goes. A source error elsewhere does not take the node out of
// the load balancer: traffic still flows.
func TestHealthCheckNodePort(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{SyncPeriod: time.Hour})
	tr := e.p.Tracker()
	lb := svc("lb", "10.96.0.40", func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30040
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 32140
	})
	tr.OnService(lb, false)
	tr.OnEndpointSlice(endpointSlice("lb", "lb-1", "10.2.0.1@local", "10.2.0.2@local", "10.2.0.3"), false)
	e.p.OnServicesSynced()
	e.p.OnEndpointSlicesSynced()
	e.eventually("health check port open", func() bool { return len(e.p.HealthCheckPorts()) == 1 })
	code, body := getJSON(t, "http://127.0.0.1:32140/")
	svcBody, _ := body["service"].(map[string]any)
	if code != 200 || body["localEndpoints"] != float64(2) || body["serviceProxyHealthy"] != true ||
		svcBody["namespace"] != "default" || svcBody["name"] != "lb" {
		t.Fatalf("health check %d %v", code, body)
	}
	e.p.Health.SetSourceError("interfaces", errors.New("programs not in place on slw1"))
	if code, body := getJSON(t, "http://127.0.0.1:32140/"); code != 200 || body["serviceProxyHealthy"] != true {
		t.Fatalf("health check with a source error: %d %v", code, body)
	}
	e.p.Health.SetSourceError("interfaces", nil)
	tr.OnEndpointSlice(endpointSlice("lb", "lb-1", "10.2.0.3"), false)
	e.eventually("no local endpoints: 503", func() bool { c, _ := getJSON(t, "http://127.0.0.1:32140/"); return c == 503 })
	tr.OnService(lb, true)
	e.eventually("health check port closed", func() bool { return len(e.p.HealthCheckPorts()) == 0 })
	if _, err := http.Get("http://127.0.0.1:32140/"); err == nil {
		t.Fatal("health check port still answers after the service went")
	}
}

func TestMetricsAreExposed(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{})
	tr := e.p.Tracker()
	sl := endpointSlice("web", "web-1", "10.2.0.1")
	sl.Annotations = map[string]string{kubeproxy.AnnotationTriggerTime: time.Now().Format(time.RFC3339Nano)}
	tr.OnService(svc("web", "10.96.0.10", func(s *v1.Service) { s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal) }), false)
	tr.OnEndpointSlice(sl, false)
	e.p.OnServicesSynced()
	e.p.OnEndpointSlicesSynced()
	e.eventually("synced", func() bool { return len(e.frontends()) == 1 })
	e.eventually("metrics", func() bool { return testutil.ToFloat64(e.metrics.LastSync) > 0 })
	names := map[string]bool{}
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"kubeproxy_sync_proxy_rules_duration_seconds", "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
		"kubeproxy_network_programming_duration_seconds", "kubeproxy_sync_proxy_rules_endpoint_changes_total",
		"kubeproxy_sync_proxy_rules_service_changes_total", "kubeproxy_sync_proxy_rules_no_local_endpoints_total"} {
		if !names[n] {
			t.Errorf("metric %s missing", n)
		}
	}
	if got := testutil.ToFloat64(e.metrics.NoLocalEndpoints.WithLabelValues("internal")); got != 1 {
		t.Fatalf("no-local-endpoints (internal) %v, want 1", got)
	}
	if n := testutil.CollectAndCount(e.metrics.NetworkProgramming); n != 1 {
		t.Fatalf("network programming latency observed %d series", n)
	}
}

// --nodeport-addresses: NodePorts only on node IPs inside the CIDRs, no
// wildcard; a node IP change re-derives them.
func TestNodePortAddresses(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}})
	e.p.SetNodeIPs([]netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("192.168.1.1")})
	e.p.Tracker().OnService(svc("np", "10.96.0.11", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort; s.Spec.Ports[0].NodePort = 30011 }), false)
	e.p.OnServicesSynced()
	e.p.OnEndpointSlicesSynced()
	e.eventually("NodePort on the allowed node IP only", func() bool {
		fe := e.frontends()
		_, allowed := fe["192.168.1.1:30011/6"]
		_, other := fe["10.0.0.1:30011/6"]
		_, wild := fe["255.255.255.255:30011/6"]
		return allowed && !other && !wild
	})
	e.p.SetNodeIPs([]netip.Addr{netip.MustParseAddr("192.168.1.2")})
	e.eventually("NodePort moved with the node IP", func() bool {
		fe := e.frontends()
		_, old := fe["192.168.1.1:30011/6"]
		_, moved := fe["192.168.1.2:30011/6"]
		return moved && !old
	})
}

// kube-proxy's "primary" keyword: NodePorts on the Node's primary IP (its
// first InternalIP, whatever the order of its addresses) and no other.
func TestNodePortAddressesPrimary(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{NodePortPrimary: true})
	e.p.OnNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
		{Type: v1.NodeExternalIP, Address: "203.0.113.7"}, {Type: v1.NodeInternalIP, Address: "10.0.0.5"},
		{Type: v1.NodeInternalIP, Address: "10.0.0.6"}}}})
	e.p.Tracker().OnService(svc("np", "10.96.0.13", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort; s.Spec.Ports[0].NodePort = 30013 }), false)
	e.p.OnServicesSynced()
	e.p.OnEndpointSlicesSynced()
	e.eventually("NodePort on the primary IP only", func() bool {
		fe := e.frontends()
		_, primary := fe["10.0.0.5:30013/6"]
		_, second := fe["10.0.0.6:30013/6"]
		_, external := fe["203.0.113.7:30013/6"]
		_, wild := fe["255.255.255.255:30013/6"]
		return primary && !second && !external && !wild
	})
}

// A Node object without addresses (a manifest that omits them, a status not
// written yet) does not take the node's NodePorts away.
func TestNodeWithoutAddressesKeepsNodePorts(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{})
	e.p.Tracker().OnService(svc("np", "10.96.0.12", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort; s.Spec.Ports[0].NodePort = 30012 }), false)
	e.p.OnServicesSynced()
	e.p.OnEndpointSlicesSynced()
	e.eventually("NodePort on the node IP", func() bool { _, ok := e.frontends()["10.0.0.1:30012/6"]; return ok })
	e.p.OnNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}})
	// A change after the Node: the sync that programs it knows the Node.
	e.p.Tracker().OnService(svc("marker", "10.96.2.1"), false)
	e.eventually("the marker programmed", func() bool { _, ok := e.frontends()["10.96.2.1:80/6"]; return ok })
	if _, ok := e.frontends()["10.0.0.1:30012/6"]; !ok {
		t.Fatal("a Node without addresses removed the NodePort")
	}
}

// Affinity entries of services that are gone are swept once per sync
// period, not left until the LRU needs their room.
func TestStaleAffinitySweptEverySyncPeriod(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{SyncPeriod: 100 * time.Millisecond})
	aff, err := maps.Affinity.In(e.set)
	if err != nil {
		t.Fatal(err)
	}
	e.p.OnServicesSynced()
	e.p.OnEndpointSlicesSynced()
	e.eventually("the first sync", func() bool { return e.p.Applied() > 0 })
	// Left by a service deleted while the agent was down, say: no sync
	// that follows changes anything.
	stale := gen.SluiceAffKey{SvcId: 999, Client: gen.NetAddr(netip.MustParseAddr("10.1.0.9"))}
	if err := aff.Put(stale, gen.SluiceAffValue{Ts: 1}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	e.eventually("the stale affinity entry swept", func() bool {
		_, err := aff.Get(stale)
		return errors.Is(err, maps.ErrKeyNotExist)
	})
}

// An SCTP Service port is programmed beside the Service's TCP port, with
// nothing skipped: the datapath balances SCTP as it does TCP and UDP.
func TestSCTPServicePortIsProgrammed(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{})
	tr := e.p.Tracker()
	tr.OnService(svc("mixed", "10.96.0.40", func(s *v1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "diameter", Port: 3868, Protocol: v1.ProtocolSCTP})
	}), false)
	tr.OnService(svc("good", "10.96.0.41"), false)
	e.p.OnServicesSynced()
	e.p.OnEndpointSlicesSynced()
	e.eventually("the TCP and SCTP ports programmed", func() bool {
		fe := e.frontends()
		_, mixed := fe["10.96.0.40:80/6"]
		_, sctp := fe["10.96.0.40:3868/132"]
		_, good := fe["10.96.0.41:80/6"]
		return mixed && sctp && good
	})
	if got := testutil.ToFloat64(e.metrics.SkippedObjects); got != 0 {
		t.Fatalf("skipped objects counted %v, want 0", got)
	}
}

// A dual-stack Service with a slice per family, on a dual-stack Node with
// --nodeport-addresses=primary: each family's frontends on that family's
// primary address, each to its own endpoints.
func TestDualStackServiceThroughTheProxier(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{NodePortPrimary: true})
	e.p.OnNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
		{Type: v1.NodeInternalIP, Address: "10.0.0.5"}, {Type: v1.NodeInternalIP, Address: "fd00::5"},
		{Type: v1.NodeInternalIP, Address: "fd00::6"}}}})
	e.p.Tracker().OnService(svc("web", "10.96.0.20", func(s *v1.Service) {
		s.Spec.ClusterIPs = []string{"10.96.0.20", "fd00:96::20"}
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30020
	}), false)
	v6 := endpointSlice("web", "web-v6", "fd00:2::1", "fd00:2::2")
	v6.AddressType = discovery.AddressTypeIPv6
	e.p.Tracker().OnEndpointSlice(endpointSlice("web", "web-v4", "10.2.0.1"), false)
	e.p.Tracker().OnEndpointSlice(v6, false)
	e.p.OnServicesSynced()
	e.p.OnEndpointSlicesSynced()

	want := map[string]int{
		"10.96.0.20:80": 1, "10.0.0.5:30020": 1,
		"[fd00:96::20]:80": 2, "[fd00::5]:30020": 2,
	}
	var got map[string]int
	e.eventually("both families programmed", func() bool {
		fes, err := nat.ReadFrontends(e.set)
		if err != nil {
			t.Fatal(err)
		}
		got = map[string]int{}
		for _, f := range fes {
			got[f.Address.String()] = len(f.Backends)
		}
		return fmt.Sprint(got) == fmt.Sprint(want)
	})
	fes, _ := nat.ReadFrontends(e.set)
	for _, f := range fes {
		if f.Address.Addr().Is6() != strings.HasSuffix(f.Service, "(IPv6)") {
			t.Errorf("frontend %v named %q", f.Address, f.Service)
		}
		for _, b := range f.Backends {
			if b.Address.Addr().Is6() != f.Address.Addr().Is6() {
				t.Errorf("frontend %v has backend %v of the other family", f.Address, b.Address)
			}
		}
	}
}

// A Maglev table the map has no room for: the sync programs everything and
// reports itself degraded (a sync error counted, /healthz 503 naming the
// map, /livez 200); once the map has room again, /healthz is 200.
func TestMaglevTablesFullShowInHealthz(t *testing.T) {
	dir := bpftest.PinDir(t)
	set, err := maps.Open(maps.OpenOptions{PinDir: dir, MaglevTableSize: 251, Capacity: map[string]uint32{gen.SluiceMapSlMaglevV1: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	syncer, err := nat.NewSyncer(nat.Options{Maps: set, Maglev: &nat.MaglevOptions{Tables: set.Map(gen.SluiceMapSlMaglevV1), TableSize: 251}})
	if err != nil {
		t.Fatal(err)
	}
	m := proxymetrics.NewMetrics(prometheus.NewRegistry())
	p := kubeproxy.NewProxier(kubeproxy.Config{NodeName: "node-a", MinSyncPeriod: 20 * time.Millisecond, SyncPeriod: time.Hour,
		HealthCheckBindIP: "127.0.0.1"}, syncer, nil, m, nil)
	p.SetNodeIPs([]netip.Addr{netip.MustParseAddr("10.0.0.1")})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)
	e := &env{t: t, set: set, p: p, metrics: m}
	h := httptest.NewServer(p.Health.Handler())
	defer h.Close()
	p.OnNode(nodeA(false))

	tr := p.Tracker()
	nodePort := func(port int32) func(*v1.Service) {
		return func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort; s.Spec.Ports[0].NodePort = port }
	}
	tr.OnService(svc("a", "10.96.0.40", nodePort(30040)), false)
	tr.OnService(svc("b", "10.96.0.41", nodePort(30041)), false)
	tr.OnEndpointSlice(endpointSlice("a", "a-1", "10.2.0.5"), false)
	tr.OnEndpointSlice(endpointSlice("b", "b-1", "10.2.0.6"), false)
	p.OnServicesSynced()
	p.OnEndpointSlicesSynced()
	e.eventually("both services programmed", func() bool {
		fes := e.frontends()
		return fes["10.96.0.40:80/6"].Count == 1 && fes["10.96.0.41:80/6"].Count == 1
	})
	e.eventually("the degraded sync counted", func() bool { return testutil.ToFloat64(m.SyncErrors) > 0 })
	if code, body := getJSON(t, h.URL+"/healthz"); code != 503 || !strings.Contains(fmt.Sprint(body["sourceErrors"]), gen.SluiceMapSlMaglevV1) {
		t.Fatalf("healthz with a Maglev table refused: %d %v", code, body)
	}
	if code, _ := getJSON(t, h.URL+"/livez"); code != 200 {
		t.Fatalf("livez with a Maglev table refused: %d", code)
	}

	tr.OnService(svc("b", "10.96.0.41", nodePort(30041)), true) // deleted: a's table fits alone
	e.eventually("healthz 200 again", func() bool {
		code, _ := getJSON(t, h.URL+"/healthz")
		return code == 200
	})
}

// serviceNets lists sl_svcnet_v1 as "prefix kind", sorted (IPv4 unmapped).
func (e *env) serviceNets() []string {
	m, err := maps.ServiceNets.In(e.set)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	m.Iterate(func(k gen.SluiceSvcnetKey, v gen.SluiceSvcnetValue) bool {
		kind := "range"
		if v.Kind == gen.SluiceSvcnetKindSVCNET_CLUSTER_IP {
			kind = "clusterIP"
		}
		out = append(out, fmt.Sprintf("%v %s", k.Prefix(), kind))
		return true
	})
	slices.Sort(out)
	return out
}

// TestServiceCIDRsFollowTheAPI: the ServiceCIDR objects' CIDRs, as kube-proxy
// follows them, and every ClusterIP, reach the datapath's service networks;
// a CIDR that does not parse is left out and the others are kept.
func TestServiceCIDRsFollowTheAPI(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{})
	client := fake.NewClientset()
	client.Resources = servesServiceCIDRs
	ctx := context.Background()
	cidr := func(name string, cidrs ...string) *networkingv1.ServiceCIDR {
		return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
	}
	if _, err := client.NetworkingV1().ServiceCIDRs().Create(ctx, cidr("kubernetes", "10.96.0.0/16", "fd00:96::/112"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runWebInformers(t, e, client)
	e.waitServiceNets("the first list", "10.96.0.0/16 range", "10.96.0.10/32 clusterIP", "fd00:96::/112 range")

	if _, err := client.NetworkingV1().ServiceCIDRs().Create(ctx, cidr("extra", "10.97.0.0/24", "not-a-cidr"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitServiceNets("a second ServiceCIDR", "10.96.0.0/16 range", "10.96.0.10/32 clusterIP", "10.97.0.0/24 range", "fd00:96::/112 range")
	if err := client.NetworkingV1().ServiceCIDRs().Delete(ctx, "kubernetes", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitServiceNets("the first ServiceCIDR and the Service deleted", "10.97.0.0/24 range")
}

// runWebInformers creates Service web (10.96.0.10) and its slice in client,
// then feeds e's proxier from client's informers.
func runWebInformers(t *testing.T, e *env, client *fake.Clientset) {
	t.Helper()
	ctx := context.Background()
	if _, err := client.CoreV1().Services("default").Create(ctx, svc("web", "10.96.0.10"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, endpointSlice("web", "web-1", "10.2.0.1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := source.RunInformers(ctx, client, e.p, 0); err != nil {
		t.Fatal(err)
	}
}

// waitServiceNets waits up to 10 s for the service networks to be want.
func (e *env) waitServiceNets(what string, want ...string) {
	e.t.Helper()
	var got []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got = e.serviceNets(); slices.Equal(got, want) {
			return
		}
	}
	e.t.Fatalf("%s: service networks %q, want %q", what, got, want)
}

// servesServiceCIDRs is the discovery answer of an API server that serves
// ServiceCIDRs (Kubernetes 1.33 and later).
var servesServiceCIDRs = []*metav1.APIResourceList{{GroupVersion: "networking.k8s.io/v1",
	APIResources: []metav1.APIResource{{Name: "networkpolicies"}, {Name: "servicecidrs"}}}}

// TestServiceCIDRsNotServed: an API server without ServiceCIDRs (before
// 1.33) gets no ServiceCIDR informer, whose list would fail forever; the
// Services are served and there are no ranges.
func TestServiceCIDRsNotServed(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{})
	client := fake.NewClientset()
	client.Resources = []*metav1.APIResourceList{{GroupVersion: "networking.k8s.io/v1",
		APIResources: []metav1.APIResource{{Name: "networkpolicies"}}}}
	runWebInformers(t, e, client)
	e.waitServiceNets("Services without ServiceCIDRs", "10.96.0.10/32 clusterIP")
	for _, a := range client.Actions() {
		if a.GetResource().Resource == "servicecidrs" {
			t.Errorf("%s servicecidrs on an API server that does not serve them", a.GetVerb())
		}
	}
}
