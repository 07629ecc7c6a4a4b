package kubeproxy

import (
	"net/netip"
	"strings"
	"testing"

	discovery "k8s.io/api/discovery/v1"
)

// A SimpleService becomes, through the converter the proxier uses, the one
// service port and the ready endpoints it describes, in either family.
func TestSimpleServiceConverts(t *testing.T) {
	for _, s := range []SimpleService{
		{Name: "web", IP: "10.96.7.7", Port: 80, Protocol: "TCP", TargetPort: 8080, Backends: []string{"10.1.0.7", "10.1.0.8"}},
		{Name: "dns", Namespace: "infra", IP: "fd00:96::53", Port: 53, Protocol: "UDP", TargetPort: 5353, Backends: []string{"fd00:1::7"}},
	} {
		if err := s.Check(); err != nil {
			t.Fatal(err)
		}
		svc, slice := s.Objects()
		var c Converter
		ports, err := c.ServicePorts(svc)
		if err != nil || len(ports) != 1 {
			t.Fatalf("%s: ports %v, %v", s.Name, ports, err)
		}
		p := ports[0]
		if p.ClusterIP != netip.MustParseAddr(s.IP) || p.Port != uint16(s.Port) || p.Protocol.String() != s.Protocol {
			t.Errorf("%s: service port %+v", s.Name, p)
		}
		eps, errs := c.Endpoints([]*discovery.EndpointSlice{slice})
		if len(errs) > 0 || len(eps) != 1 {
			t.Fatalf("%s: endpoints %v, %v", s.Name, eps, errs)
		}
		for _, list := range eps {
			if len(list) != len(s.Backends) {
				t.Fatalf("%s: endpoints %v", s.Name, list)
			}
			for i, e := range list {
				if e.Addr != netip.AddrPortFrom(netip.MustParseAddr(s.Backends[i]), uint16(s.TargetPort)) || !e.Ready {
					t.Errorf("%s: endpoint %+v", s.Name, e)
				}
			}
		}
	}
}

// Check names the service and the field of every mistake.
func TestSimpleServiceCheck(t *testing.T) {
	good := SimpleService{Name: "web", IP: "10.96.7.7", Port: 80, Protocol: "TCP", TargetPort: 8080, Backends: []string{"10.1.0.7"}}
	for _, c := range []struct {
		change func(*SimpleService)
		want   string
	}{
		{func(s *SimpleService) { s.IP = "10.96.7" }, `service "web": ip`},
		{func(s *SimpleService) { s.Port = 0 }, `service "web": port 0`},
		{func(s *SimpleService) { s.TargetPort = 70000 }, `service "web": targetPort 70000`},
		{func(s *SimpleService) { s.Protocol = "ICMP" }, `service "web": protocol "ICMP"`},
		{func(s *SimpleService) { s.Backends = []string{"10.1.0"} }, `service "web": backend`},
		{func(s *SimpleService) { s.Backends = []string{"fd00::1"} }, `backend fd00::1 is not of the family`},
		{func(s *SimpleService) { s.Name = "" }, `service at 10.96.7.7: no name`},
	} {
		s := good
		c.change(&s)
		if err := s.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", s, err, c.want)
		}
	}
}
