package nat

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

func ep(addr string, mods ...func(*Endpoint)) Endpoint {
	e := Endpoint{Addr: netip.MustParseAddrPort(addr), Ready: true, Serving: true}
	for _, m := range mods {
		m(&e)
	}
	return e
}

var (
	local       = func(e *Endpoint) { e.Local = true }
	terminating = func(e *Endpoint) { e.Ready = false; e.Terminating = true }
	notServing  = func(e *Endpoint) { e.Serving = false }
	zoneHint    = func(z ...string) func(*Endpoint) { return func(e *Endpoint) { hints(e).Zones = z } }
	nodeHint    = func(n ...string) func(*Endpoint) { return func(e *Endpoint) { hints(e).Nodes = n } }
)

func hints(e *Endpoint) *Hints {
	if e.Hints == nil {
		e.Hints = &Hints{}
	}
	return e.Hints
}

func addrs(eps []Endpoint) []string {
	if eps == nil {
		return nil
	}
	out := []string{}
	for _, e := range eps {
		out = append(out, e.Addr.String())
	}
	slices.Sort(out)
	return out
}

// The cases of kube-proxy's CategorizeEndpoints tests, as listed in
// kube-proxy-semantics.md ("Choosing endpoints").
func TestCategorizeEndpoints(t *testing.T) {
	clusterIP := &ServicePort{}
	itpLocal := &ServicePort{InternalPolicy: PolicyLocal}
	etpLocal := &ServicePort{ExternalPolicy: PolicyLocal, NodePort: 30000}
	both := &ServicePort{InternalPolicy: PolicyLocal, ExternalPolicy: PolicyLocal, NodePort: 30000}
	node := &Node{Name: "node-a", Zone: "zone-a"}
	cases := []struct {
		name           string
		svc            *ServicePort
		node           *Node
		eps            []Endpoint
		cluster, local []string
		hasAny         bool
	}{
		{"no hints: all ready", clusterIP, node,
			[]Endpoint{ep("10.0.0.1:80"), ep("10.0.0.2:80"), ep("10.0.0.3:80", terminating)},
			[]string{"10.0.0.1:80", "10.0.0.2:80"}, nil, true},
		{"zone hints for this zone", clusterIP, node,
			[]Endpoint{ep("10.0.0.1:80", zoneHint("zone-a")), ep("10.0.0.2:80", zoneHint("zone-b")), ep("10.0.0.3:80", zoneHint("zone-a"))},
			[]string{"10.0.0.1:80", "10.0.0.3:80"}, nil, true},
		{"one unhinted endpoint disables zone filtering", clusterIP, node,
			[]Endpoint{ep("10.0.0.1:80", zoneHint("zone-a")), ep("10.0.0.2:80")},
			[]string{"10.0.0.1:80", "10.0.0.2:80"}, nil, true},
		{"no hint names this zone: no filtering", clusterIP, node,
			[]Endpoint{ep("10.0.0.1:80", zoneHint("zone-b")), ep("10.0.0.2:80", zoneHint("zone-c"))},
			[]string{"10.0.0.1:80", "10.0.0.2:80"}, nil, true},
		{"node without zone label: no filtering", clusterIP, &Node{Name: "node-a"},
			[]Endpoint{ep("10.0.0.1:80", zoneHint("zone-a")), ep("10.0.0.2:80", zoneHint("zone-b"))},
			[]string{"10.0.0.1:80", "10.0.0.2:80"}, nil, true},
		{"node hints win over zone hints", clusterIP, node,
			[]Endpoint{ep("10.0.0.1:80", nodeHint("node-a"), zoneHint("zone-a")), ep("10.0.0.2:80", nodeHint("node-b"), zoneHint("zone-a"))},
			[]string{"10.0.0.1:80"}, nil, true},
		{"hints on terminating endpoints do not count", clusterIP, node,
			[]Endpoint{ep("10.0.0.1:80", zoneHint("zone-a")), ep("10.0.0.2:80", zoneHint("zone-b")), ep("10.0.0.3:80", terminating)},
			[]string{"10.0.0.1:80"}, nil, true},
		{"no ready endpoints: serving terminating ones, topology ignored", clusterIP, node,
			[]Endpoint{ep("10.0.0.1:80", terminating, zoneHint("zone-b")), ep("10.0.0.2:80", terminating, notServing)},
			[]string{"10.0.0.1:80"}, nil, true},
		{"nothing usable", clusterIP, node,
			[]Endpoint{ep("10.0.0.1:80", terminating, notServing)},
			nil, nil, false},
		{"internal local: local ready only, no cluster set", itpLocal, node,
			[]Endpoint{ep("10.0.0.1:80", local), ep("10.0.0.2:80")},
			nil, []string{"10.0.0.1:80"}, true},
		{"internal local without local endpoints: empty, but has any", itpLocal, node,
			[]Endpoint{ep("10.0.0.2:80")},
			nil, []string{}, true},
		{"local falls back to local serving terminating", itpLocal, node,
			[]Endpoint{ep("10.0.0.1:80", local, terminating), ep("10.0.0.2:80")},
			nil, []string{"10.0.0.1:80"}, true},
		{"local never topology-filtered", itpLocal, node,
			[]Endpoint{ep("10.0.0.1:80", local, zoneHint("zone-b")), ep("10.0.0.2:80", zoneHint("zone-a"))},
			nil, []string{"10.0.0.1:80"}, true},
		{"external local: cluster and local sets", etpLocal, node,
			[]Endpoint{ep("10.0.0.1:80", local), ep("10.0.0.2:80")},
			[]string{"10.0.0.1:80", "10.0.0.2:80"}, []string{"10.0.0.1:80"}, true},
		{"both local with NodePort still has cluster set", both, node,
			[]Endpoint{ep("10.0.0.1:80", local), ep("10.0.0.2:80")},
			[]string{"10.0.0.1:80", "10.0.0.2:80"}, []string{"10.0.0.1:80"}, true},
		{"remote serving terminating counts as has endpoints", itpLocal, node,
			[]Endpoint{ep("10.0.0.2:80", terminating)},
			nil, []string{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sets := CategorizeEndpoints(c.eps, c.svc, c.node)
			if got := addrs(sets.Cluster); !slices.Equal(got, c.cluster) {
				t.Errorf("cluster %v, want %v", got, c.cluster)
			}
			if got := addrs(sets.Local); !slices.Equal(got, c.local) || (got == nil) != (c.local == nil) {
				t.Errorf("local %v, want %v", got, c.local)
			}
			if sets.HasAny != c.hasAny {
				t.Errorf("hasAny %v, want %v", sets.HasAny, c.hasAny)
			}
		})
	}
}

func TestBackendLayoutKeepsBothSetsContiguous(t *testing.T) {
	a, b, c := ep("10.0.0.1:80", local, terminating), ep("10.0.0.2:80", local), ep("10.0.0.3:80")
	list, localN, start, count := backendLayout(EndpointSets{Local: []Endpoint{a, b}, Cluster: []Endpoint{c, b}}, nil)
	if len(list) != 3 || localN != 2 || start != 1 || count != 2 {
		t.Fatalf("layout %d entries, local %d, cluster %d+%d", len(list), localN, start, count)
	}
	if list[0] != beValue(&a) || list[1] != beValue(&b) || list[2] != beValue(&c) {
		t.Fatalf("order %v", list)
	}
}

func TestServicePortValidationNamesTheField(t *testing.T) {
	good := ServicePort{Name: ServicePortName{Namespace: "default", Name: "web", Port: "http"}, ClusterIP: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: TCP}
	cases := map[string]func(*ServicePort){
		"clusterIP":                func(s *ServicePort) { s.ClusterIP = netip.MustParseAddr("fd00::1") },
		"port 0":                   func(s *ServicePort) { s.Port = 0 },
		"protocol":                 func(s *ServicePort) { s.Protocol = 99 },
		"externalIPs":              func(s *ServicePort) { s.ExternalIPs = []netip.Addr{{}} },
		"loadBalancerSourceRanges": func(s *ServicePort) { s.LoadBalancerSourceRanges = []netip.Prefix{{}} },
		"timeoutSeconds":           func(s *ServicePort) { s.AffinityTimeout = 100000 },
	}
	for field, mod := range cases {
		s := good
		mod(&s)
		_, err := NewServicePort(s)
		if err == nil || !strings.Contains(err.Error(), field) || !strings.Contains(err.Error(), "default/web:http") {
			t.Errorf("%s: error %v does not name the service and field", field, err)
		}
	}
	if _, err := NewServicePort(good); err != nil {
		t.Fatal(err)
	}
}

func TestBackendLayoutKeepsOrdinalsOfRemainingEndpoints(t *testing.T) {
	a, b, c, d := ep("10.0.0.1:80"), ep("10.0.0.2:80"), ep("10.0.0.3:80"), ep("10.0.0.4:80")
	prev, _, _, _ := backendLayout(EndpointSets{Cluster: []Endpoint{a, b, c}}, nil)
	// b replaced by d: only ordinal 1 changes.
	next, _, _, _ := backendLayout(EndpointSets{Cluster: []Endpoint{d, c, a}}, prev)
	if next[0] != prev[0] || next[2] != prev[2] || next[1] != beValue(&d) {
		t.Fatalf("replace: %v -> %v", prev, next)
	}
	// a removed: the last one moves into its slot, the rest stay.
	next2, _, _, _ := backendLayout(EndpointSets{Cluster: []Endpoint{d, c}}, next)
	if len(next2) != 2 || next2[1] != next[1] || next2[0] != beValue(&c) {
		t.Fatalf("remove: %v -> %v", next, next2)
	}
}

// Addresses that are not a service's own — the NodePort wildcard's broadcast
// address among them — are refused wherever a Service names them.
func TestSpecialAddressesAreRefused(t *testing.T) {
	good := ServicePort{Name: ServicePortName{Namespace: "default", Name: "web", Port: "http"}, ClusterIP: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: TCP}
	for _, ip := range []string{"255.255.255.255", "240.0.0.1", "0.0.0.0", "0.1.2.3", "127.0.0.1", "169.254.0.9", "224.0.0.5"} {
		addr := netip.MustParseAddr(ip)
		for field, mod := range map[string]func(*ServicePort){
			"clusterIP":               func(s *ServicePort) { s.ClusterIP = addr },
			"externalIPs":             func(s *ServicePort) { s.ExternalIPs = []netip.Addr{addr} },
			"loadBalancer ingress IP": func(s *ServicePort) { s.LoadBalancerIPs = []netip.Addr{addr} },
		} {
			s := good
			mod(&s)
			if _, err := NewServicePort(s); err == nil || !strings.Contains(err.Error(), field) || !strings.Contains(err.Error(), ip) {
				t.Errorf("%s %s: error %v does not refuse it by name", field, ip, err)
			}
		}
	}
}

// A node keeps one Endpoint per endpoint of the cluster (100,000 at
// 10,000 services of 10): the record stays at 48 bytes, what programming
// reads and no more.
func TestEndpointStaysSmall(t *testing.T) {
	if size := unsafe.Sizeof(Endpoint{}); size > 48 {
		t.Fatalf("an Endpoint is %d bytes", size)
	}
}
