package kubeproxy

import (
	"cmp"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// SimpleService is a ClusterIP service of one port, for sources that are not
// Kubernetes (a file, an API of one's own): Objects gives the Service and
// EndpointSlice a Kubernetes source would send the proxier.
type SimpleService struct {
	Name       string   `json:"name"`
	Namespace  string   `json:"namespace,omitempty"` // default: "default"
	IP         string   `json:"ip"`
	Port       int32    `json:"port"`
	Protocol   string   `json:"protocol"` // TCP, UDP or SCTP
	TargetPort int32    `json:"targetPort"`
	Backends   []string `json:"backends"` // IPs of one family with IP
}

// Check says what is wrong with s, naming the service and the field.
func (s SimpleService) Check() error {
	ip, err := netip.ParseAddr(s.IP)
	if err != nil {
		return fmt.Errorf("service %q: ip: %w", s.Name, err)
	}
	if s.Name == "" {
		return fmt.Errorf("service at %s: no name", s.IP)
	}
	for _, p := range [][2]any{{"port", s.Port}, {"targetPort", s.TargetPort}} {
		if n := p[1].(int32); n < 1 || n > 65535 {
			return fmt.Errorf("service %q: %s %d: want 1-65535", s.Name, p[0], n)
		}
	}
	switch v1.Protocol(s.Protocol) {
	case v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP:
	default:
		return fmt.Errorf("service %q: protocol %q: want TCP, UDP or SCTP", s.Name, s.Protocol)
	}
	for _, b := range s.Backends {
		a, err := netip.ParseAddr(b)
		if err != nil {
			return fmt.Errorf("service %q: backend: %w", s.Name, err)
		}
		if a.Is4() != ip.Is4() {
			return fmt.Errorf("service %q: backend %s is not of the family of %s", s.Name, b, s.IP)
		}
	}
	return nil
}

// Objects is s as a Service and an EndpointSlice with every backend ready.
func (s SimpleService) Objects() (*v1.Service, *discovery.EndpointSlice) {
	meta := metav1.ObjectMeta{Name: s.Name, Namespace: cmp.Or(s.Namespace, metav1.NamespaceDefault)}
	proto := v1.Protocol(s.Protocol)
	family, addressType := v1.IPv4Protocol, discovery.AddressTypeIPv4
	if ip, err := netip.ParseAddr(s.IP); err == nil && ip.Is6() {
		family, addressType = v1.IPv6Protocol, discovery.AddressTypeIPv6
	}
	svc := &v1.Service{ObjectMeta: meta, Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP,
		ClusterIP: s.IP, ClusterIPs: []string{s.IP}, IPFamilies: []v1.IPFamily{family},
		Ports: []v1.ServicePort{{Port: s.Port, Protocol: proto, TargetPort: intstr.FromInt32(s.TargetPort)}}}}
	slice := &discovery.EndpointSlice{ObjectMeta: meta, AddressType: addressType,
		Ports: []discovery.EndpointPort{{Name: new(""), Port: new(s.TargetPort), Protocol: &proto}}}
	slice.Labels = map[string]string{discovery.LabelServiceName: s.Name}
	for _, b := range s.Backends {
		slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{Addresses: []string{b},
			Conditions: discovery.EndpointConditions{Ready: new(true)}})
	}
	return svc, slice
}
