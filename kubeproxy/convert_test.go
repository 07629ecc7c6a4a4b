package kubeproxy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/nat"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func ptr[T any](v T) *T { return &v }

func service(name string, mods ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}
	for _, m := range mods {
		m(s)
	}
	return s
}

func TestServiceConversionRules(t *testing.T) {
	c := &Converter{NodeName: "node-a"}
	cases := []struct {
		name  string
		svc   *v1.Service
		ports int
		check func(*nat.ServicePort) string
		err   string
	}{
		{name: "ClusterIP", svc: service("a"), ports: 1},
		{name: "headless skipped", svc: service("a", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", nil })},
		{name: "ExternalName skipped", svc: service("a", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName })},
		{name: "other proxy skipped", svc: service("a", func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "x"} })},
		{name: "other proxy skipped, empty label value", svc: service("a", func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: ""} })},
		{name: "IPv6-only", svc: service("a", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "fd00::1", []string{"fd00::1"}
			s.Spec.ExternalIPs = []string{"192.0.2.1", "2001:db8::1"} // the IPv4 one is no family's of this Service
		}), ports: 1, check: func(sp *nat.ServicePort) string {
			if !sp.Name.IPv6 || sp.ClusterIP != netip.MustParseAddr("fd00::1") || len(sp.ExternalIPs) != 1 || sp.ExternalIPs[0] != netip.MustParseAddr("2001:db8::1") {
				return "wrong"
			}
			return ""
		}},
		{name: "dual-stack: a port per family, each with its family's addresses", svc: service("a", func(s *v1.Service) {
			s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
			s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24", "2001:db8::/32"}
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.1"}, {IP: "2001:db8:1::1"}}
		}), ports: 2, check: func(sp *nat.ServicePort) string {
			if sp.Name.IPv6 || len(sp.LoadBalancerIPs) != 1 || !sp.LoadBalancerIPs[0].Is4() || len(sp.LoadBalancerSourceRanges) != 1 ||
				!sp.LoadBalancerSourceRanges[0].Addr().Is4() || sp.NodePort != 30080 {
				return "IPv4 port wrong"
			}
			return ""
		}},
		{name: "leading zeros normalised", svc: service("a", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "010.096.000.010", nil }), ports: 1,
			check: func(sp *nat.ServicePort) string {
				if sp.ClusterIP != netip.MustParseAddr("10.96.0.10") {
					return sp.ClusterIP.String()
				}
				return ""
			}},
		{name: "LoadBalancer: ipMode Proxy left out, ranges trimmed, local policy, affinity default", svc: service("a", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000
			s.Spec.LoadBalancerSourceRanges = []string{" 192.0.2.0/24 "}
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.1"}, {IP: "203.0.113.2", IPMode: ptr(v1.LoadBalancerIPModeProxy)}}
		}), ports: 1, check: func(sp *nat.ServicePort) string {
			if len(sp.LoadBalancerIPs) != 1 || sp.LoadBalancerIPs[0].String() != "203.0.113.1" || sp.ExternalPolicy != nat.PolicyLocal ||
				sp.AffinityTimeout != DefaultAffinityTimeout || sp.HealthCheckNodePort != 32000 || sp.LoadBalancerSourceRanges[0].String() != "192.0.2.0/24" {
				return "wrong"
			}
			return ""
		}},
		{name: "eTP Local ignored on ClusterIP", svc: service("a", func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }), ports: 1,
			check: func(sp *nat.ServicePort) string {
				if sp.ExternalPolicy != nat.PolicyCluster {
					return "external policy"
				}
				return ""
			}},
		{name: "nodePort out of range", svc: service("a", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort; s.Spec.Ports[0].NodePort = 80 }),
			err: `service default/a: port "http": nodePort 80 outside the node-port range 30000-32767`},
		{name: "unparsable externalIP", svc: service("a", func(s *v1.Service) { s.Spec.ExternalIPs = []string{"1.2.3"} }),
			err: `service default/a: externalIPs: "1.2.3" is not an IP address`},
		{name: "bad source range", svc: service("a", func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"nope"} }),
			err: `loadBalancerSourceRanges: "nope" is not a CIDR`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ports, err := c.ServicePorts(tc.svc)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || len(ports) != tc.ports {
				t.Fatalf("%d ports, %v", len(ports), err)
			}
			if tc.check != nil {
				if msg := tc.check(ports[0]); msg != "" {
					t.Fatalf("port %+v: %s", ports[0], msg)
				}
			}
			if len(ports) == 2 { // dual-stack: the IPv6 twin
				v6 := ports[1]
				if !v6.Name.IPv6 || v6.ClusterIP != netip.MustParseAddr("fd00::10") || len(v6.LoadBalancerIPs) != 1 ||
					!v6.LoadBalancerIPs[0].Is6() || len(v6.LoadBalancerSourceRanges) != 1 || v6.NodePort != 30080 {
					t.Fatalf("IPv6 port %+v", v6)
				}
			}
		})
	}
}

func slice(name string, eps []discovery.Endpoint, ports ...discovery.EndpointPort) *discovery.EndpointSlice {
	if len(ports) == 0 {
		ports = []discovery.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(v1.ProtocolTCP)}}
	}
	return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{LabelServiceName: "a"}},
		AddressType: discovery.AddressTypeIPv4, Endpoints: eps, Ports: ports}
}

func TestEndpointConversionRules(t *testing.T) {
	c := &Converter{NodeName: "node-a"}
	e := func(ip string, mods ...func(*discovery.Endpoint)) discovery.Endpoint {
		ep := discovery.Endpoint{Addresses: []string{ip}}
		for _, m := range mods {
			m(&ep)
		}
		return ep
	}
	terminating := func(ep *discovery.Endpoint) {
		ep.Conditions = discovery.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}
	}
	onNode := func(ep *discovery.Endpoint) { ep.NodeName = ptr("node-a"); ep.Zone = ptr("z1") }
	got, errs := c.Endpoints([]*discovery.EndpointSlice{
		slice("s1", []discovery.Endpoint{e("10.0.0.1", onNode), e("10.0.0.2", terminating), {}}),
		slice("s2", []discovery.Endpoint{e("10.0.0.2"), e("10.0.0.3", terminating)}),                // 10.0.0.2 again, not terminating: wins
		slice("s3", []discovery.Endpoint{e("10.0.0.4")}, discovery.EndpointPort{Name: ptr("http")}), // no port number: ignored
		{ObjectMeta: metav1.ObjectMeta{Name: "fqdn"}, AddressType: discovery.AddressTypeFQDN, Endpoints: []discovery.Endpoint{e("x.example")}},
		slice("bad", []discovery.Endpoint{e("10.0.0.999")}),
	})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "endpointslice default/bad") {
		t.Fatalf("errors %v", errs)
	}
	list := got[portKey{name: "http", proto: nat.TCP}]
	if len(list) != 3 {
		t.Fatalf("endpoints %+v", list)
	}
	byIP := map[string]nat.Endpoint{}
	for _, ep := range list {
		byIP[ep.Addr.String()] = ep
	}
	if ep := byIP["10.0.0.1:8080"]; !ep.Ready || !ep.Serving || ep.Terminating || !ep.Local {
		t.Fatalf("unset conditions must default to ready and serving, local from nodeName: %+v", ep)
	}
	if ep := byIP["10.0.0.2:8080"]; !ep.Ready || ep.Terminating {
		t.Fatalf("duplicate address: the non-terminating entry must win: %+v", ep)
	}
	if ep := byIP["10.0.0.3:8080"]; ep.Ready || !ep.Serving || !ep.Terminating {
		t.Fatalf("terminating endpoint: %+v", ep)
	}
	// IPv6 slices are the IPv6 port's; an address of the other family in
	// a slice is a bad slice, named.
	v6 := slice("v6", []discovery.Endpoint{e("fd00:2::7", onNode), e("fd00:2::8")})
	v6.AddressType = discovery.AddressTypeIPv6
	wrong := slice("v6-wrong", []discovery.Endpoint{e("10.0.0.9")})
	wrong.AddressType = discovery.AddressTypeIPv6
	got, errs = c.Endpoints([]*discovery.EndpointSlice{slice("s1", []discovery.Endpoint{e("10.0.0.1")}), v6, wrong})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), `endpointslice default/v6-wrong: address "10.0.0.9" is not IPv6`) {
		t.Fatalf("errors %v", errs)
	}
	if l := got[portKey{name: "http", proto: nat.TCP, ipv6: true}]; len(l) != 2 || l[0].Addr != netip.MustParseAddrPort("[fd00:2::7]:8080") || !l[0].Local {
		t.Fatalf("IPv6 endpoints %+v", l)
	}
	if l := got[portKey{name: "http", proto: nat.TCP}]; len(l) != 1 {
		t.Fatalf("IPv4 endpoints %+v", l)
	}

	huge := make([]discovery.Endpoint, MaxEndpointsPerSlice+1)
	for i := range huge {
		huge[i] = e("10.1.0.1")
	}
	if _, errs := c.Endpoints([]*discovery.EndpointSlice{slice("huge", huge)}); len(errs) != 1 {
		t.Fatal("a slice over the API limit was accepted")
	}
}

// Slim keeps what the proxier reads and drops the rest: managed fields,
// owner references, annotations (an EndpointSlice's trigger time excepted),
// endpoints' target references and deprecated topology, a Node's images.
func TestSlimDropsWhatTheProxierNeverReads(t *testing.T) {
	mf := []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"}, ManagedFields: mf,
		Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 4096)}},
		Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10"}}
	owner := []metav1.OwnerReference{{Kind: "Service", Name: "web"}}
	slice := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-1", ManagedFields: mf, OwnerReferences: owner,
		Labels:      map[string]string{LabelServiceName: "web"},
		Annotations: map[string]string{AnnotationTriggerTime: "2026-12-01T00:00:00Z", "other": "x"}},
		Endpoints: []discovery.Endpoint{{Addresses: []string{"10.1.0.5"}, NodeName: ptr("n"), Zone: ptr("a"),
			Hints:              &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "a"}}},
			TargetRef:          &v1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web-abc"},
			DeprecatedTopology: map[string]string{"kubernetes.io/hostname": "n"}}}}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ManagedFields: mf, Labels: map[string]string{"topology.kubernetes.io/zone": "a"},
		Annotations: map[string]string{"x": "y"}},
		Status: v1.NodeStatus{Images: []v1.ContainerImage{{Names: []string{"big"}}}, Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.0.0.1"}}}}
	for _, o := range []any{svc, slice, node} {
		if _, err := Slim(o); err != nil {
			t.Fatal(err)
		}
	}
	if svc.ManagedFields != nil || svc.Annotations != nil || svc.Labels["app"] != "web" || svc.Spec.ClusterIP != "10.96.0.10" {
		t.Errorf("service %+v", svc.ObjectMeta)
	}
	if slice.ManagedFields != nil || slice.OwnerReferences != nil || len(slice.Annotations) != 1 || slice.Annotations[AnnotationTriggerTime] == "" ||
		slice.Labels[LabelServiceName] != "web" {
		t.Errorf("slice %+v", slice.ObjectMeta)
	}
	if ep := slice.Endpoints[0]; ep.TargetRef != nil || ep.DeprecatedTopology != nil || ep.Addresses[0] != "10.1.0.5" ||
		*ep.NodeName != "n" || *ep.Zone != "a" || ep.Hints == nil {
		t.Errorf("endpoint %+v", ep)
	}
	if node.ManagedFields != nil || node.Status.Images != nil || node.Labels["topology.kubernetes.io/zone"] != "a" || len(node.Status.Addresses) != 1 {
		t.Errorf("node %+v %+v", node.ObjectMeta, node.Status)
	}
	// A tombstone or another type passes untouched.
	if o, err := Slim("x"); err != nil || o != "x" {
		t.Errorf("%v %v", o, err)
	}
}

// A service of one slice of one port takes the slice's converted list as it
// is, unless an address is there twice: then the non-terminating entry wins
// there too, and it is listed once.
func TestOneSliceTakesItsOwnListUnlessAnAddressRepeats(t *testing.T) {
	c := Converter{NodeName: "node-a"}
	ready := discovery.Endpoint{Addresses: []string{"10.0.0.1"}}
	other := discovery.Endpoint{Addresses: []string{"10.0.0.2"}}
	term := discovery.Endpoint{Addresses: []string{"10.0.0.1"},
		Conditions: discovery.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}}
	conv := c.Slice(slice("s1", []discovery.Endpoint{ready, other}))
	got, errs := mergeSlices([]*SliceEndpoints{conv})
	list := got[portKey{name: "http", proto: nat.TCP}]
	if len(errs) != 0 || len(list) != 2 || &list[0] != &conv.Endpoints()[0] || list[0].Addr != netip.MustParseAddrPort("10.0.0.1:8080") {
		t.Fatalf("one slice: %v %v, want the slice's own list", list, errs)
	}
	conv = c.Slice(slice("s1", []discovery.Endpoint{term, other, ready}))
	got, _ = mergeSlices([]*SliceEndpoints{conv})
	list = got[portKey{name: "http", proto: nat.TCP}]
	i := slices.IndexFunc(list, func(e nat.Endpoint) bool { return e.Addr == netip.MustParseAddrPort("10.0.0.1:8080") })
	if len(list) != 2 || i < 0 || !list[i].Ready || list[i].Terminating {
		t.Fatalf("an address twice: %+v, want it once, ready", list)
	}
}
