package main

import (
	"fmt"
	"net/netip"

	"github.com/sluice-net/sluice/agent"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// check says what is wrong with a service, naming the field.
func (s service) check() error {
	if _, err := netip.ParseAddr(s.IP); err != nil {
		return fmt.Errorf("ip: %w", err)
	}
	for _, b := range s.Backends {
		if _, err := netip.ParseAddr(b); err != nil {
			return fmt.Errorf("backend: %w", err)
		}
	}
	if s.Protocol != "TCP" && s.Protocol != "UDP" {
		return fmt.Errorf("protocol %q: want TCP or UDP", s.Protocol)
	}
	return nil
}

// objects is the service as the Service and EndpointSlice the agent's
// proxier takes: what a Kubernetes source would send.
func (s service) objects() (*v1.Service, *discovery.EndpointSlice) {
	meta := metav1.ObjectMeta{Name: s.Name, Namespace: "default"}
	proto := v1.Protocol(s.Protocol)
	svc := &v1.Service{ObjectMeta: meta, Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP,
		ClusterIP: s.IP, ClusterIPs: []string{s.IP},
		Ports: []v1.ServicePort{{Port: s.Port, Protocol: proto, TargetPort: intstr.FromInt32(s.TargetPort)}}}}
	slice := &discovery.EndpointSlice{ObjectMeta: meta, AddressType: discovery.AddressTypeIPv4,
		Ports: []discovery.EndpointPort{{Name: new(""), Port: &s.TargetPort, Protocol: &proto}}}
	slice.Labels = map[string]string{discovery.LabelServiceName: s.Name}
	for _, b := range s.Backends {
		slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{Addresses: []string{b},
			Conditions: discovery.EndpointConditions{Ready: new(true)}})
	}
	return svc, slice
}

// parseIP adds a node IP from a flag.
func parseIP(s string, cfg *agent.Config) error {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return err
	}
	cfg.NodeIPs = append(cfg.NodeIPs, ip)
	return nil
}
