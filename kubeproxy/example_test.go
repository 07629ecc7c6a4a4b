package kubeproxy_test

import (
	"fmt"

	"github.com/sluice-net/sluice/kubeproxy"
)

// A source that is not Kubernetes describes its services simply; the
// proxier takes them as the Service and EndpointSlice Kubernetes would send
// (Proxier.Tracker().OnService and OnEndpointSlice; see agent.Config.Source).
func ExampleSimpleService() {
	s := kubeproxy.SimpleService{Name: "web", IP: "10.96.7.7", Port: 80, Protocol: "TCP", TargetPort: 8080,
		Backends: []string{"10.1.0.7", "10.1.0.8"}}
	if err := s.Check(); err != nil {
		fmt.Println(err)
		return
	}
	svc, slice := s.Objects()
	fmt.Println(svc.Namespace+"/"+svc.Name, svc.Spec.ClusterIP, svc.Spec.Ports[0].Port, "->", len(slice.Endpoints), "endpoints on", *slice.Ports[0].Port)

	s.Backends = append(s.Backends, "fd00::7")
	fmt.Println(s.Check())
	// Output:
	// default/web 10.96.7.7 80 -> 2 endpoints on 8080
	// service "web": backend fd00::7 is not of the family of 10.96.7.7
}
