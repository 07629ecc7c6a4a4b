package kubeproxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-net/sluice/nat"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// Labels and annotations kube-proxy honours.
const (
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	LabelHeadless         = "service.kubernetes.io/headless"
	LabelServiceName      = discovery.LabelServiceName
	AnnotationTriggerTime = "endpoints.kubernetes.io/last-change-trigger-time"
	LabelZone             = "topology.kubernetes.io/zone"
)

// DefaultAffinityTimeout is ClientIP affinity's default timeoutSeconds.
const DefaultAffinityTimeout = 10800

// MaxEndpointsPerSlice is the API's limit; a larger slice is a bad object.
const MaxEndpointsPerSlice = 1000

// Converter turns Kubernetes objects into the nat model.
type Converter struct {
	// NodeName decides which endpoints are local.
	NodeName string
	// NodePortMin and NodePortMax bound valid NodePorts (30000-32767 by default).
	NodePortMin, NodePortMax uint16
}

func (c *Converter) nodePortRange() (uint16, uint16) {
	if c.NodePortMin == 0 && c.NodePortMax == 0 {
		return 30000, 32767
	}
	return c.NodePortMin, c.NodePortMax
}

// ParseIPSloppy parses an IPv4 or IPv6 address, accepting the leading zeros
// older Kubernetes accepted in IPv4 ("010.001.002.003" is 10.1.2.3), as
// kube-proxy does. An IPv4-mapped IPv6 address is its IPv4 address.
func ParseIPSloppy(s string) (netip.Addr, error) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), nil
	}
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	var b [4]byte
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 8)
		if err != nil || p == "" {
			return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
		}
		b[i] = byte(n)
	}
	return netip.AddrFrom4(b), nil
}

// Skipped reports why a Service is not for this proxy (empty: it is).
func Skipped(svc *v1.Service) string {
	if _, other := svc.Labels[LabelServiceProxyName]; other { // any value, even empty
		return "labelled for another proxy"
	}
	switch {
	case svc.Spec.Type == v1.ServiceTypeExternalName:
		return "ExternalName"
	case svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == v1.ClusterIPNone:
		return "headless"
	}
	return ""
}

// ServicePorts converts one Service: one service port per port and IP family
// of its clusterIPs (a dual-stack Service gives each port twice, the IPv6
// one named so), each with its family's externalIPs, load balancer IPs and
// source ranges, as kube-proxy's proxier of that family sees them. A Service
// that is not for this proxy gives none; a malformed one an error naming the
// Service and the field.
func (c *Converter) ServicePorts(svc *v1.Service) ([]*nat.ServicePort, error) {
	if Skipped(svc) != "" {
		return nil, nil
	}
	name := svc.Namespace + "/" + svc.Name
	bad := func(format string, args ...any) error {
		return fmt.Errorf("service %s: "+format, append([]any{name}, args...)...)
	}
	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	var byFamily [2]netip.Addr // the first clusterIP of each family: IPv4, IPv6
	for _, s := range clusterIPs {
		ip, err := ParseIPSloppy(s)
		if err != nil {
			return nil, bad("clusterIP: %v", err)
		}
		if f := family(ip); !byFamily[f].IsValid() {
			byFamily[f] = ip
		}
	}
	var externalIPs, lbIPs [2][]netip.Addr
	for _, s := range svc.Spec.ExternalIPs {
		ip, err := ParseIPSloppy(s)
		if err != nil {
			return nil, bad("externalIPs: %v", err)
		}
		externalIPs[family(ip)] = append(externalIPs[family(ip)], ip)
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy) {
			continue // ipMode Proxy: the load balancer proxies, the node must not intercept
		}
		ip, err := ParseIPSloppy(ing.IP)
		if err != nil {
			return nil, bad("loadBalancer ingress: %v", err)
		}
		lbIPs[family(ip)] = append(lbIPs[family(ip)], ip)
	}
	var ranges [2][]netip.Prefix
	for _, s := range svc.Spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, bad("loadBalancerSourceRanges: %q is not a CIDR", s)
		}
		ranges[family(p.Addr())] = append(ranges[family(p.Addr())], p.Masked())
	}
	affinity := uint32(0)
	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		affinity = DefaultAffinityTimeout
		if cfg := svc.Spec.SessionAffinityConfig; cfg != nil && cfg.ClientIP != nil && cfg.ClientIP.TimeoutSeconds != nil {
			t := *cfg.ClientIP.TimeoutSeconds
			if t <= 0 || t > nat.MaxAffinityTimeout {
				return nil, bad("sessionAffinityConfig timeoutSeconds %d: out of range 1-%d", t, nat.MaxAffinityTimeout)
			}
			affinity = uint32(t)
		}
	}
	external := nat.PolicyCluster
	if svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal &&
		(svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer) {
		external = nat.PolicyLocal
	}
	internal := nat.PolicyCluster
	if p := svc.Spec.InternalTrafficPolicy; p != nil && *p == v1.ServiceInternalTrafficPolicyLocal {
		internal = nat.PolicyLocal
	}
	distribution := ""
	if svc.Spec.TrafficDistribution != nil {
		distribution = *svc.Spec.TrafficDistribution
	}
	lo, hi := c.nodePortRange()
	var out []*nat.ServicePort
	for _, p := range svc.Spec.Ports {
		proto, err := nat.ParseProtocol(string(p.Protocol))
		if err != nil {
			return nil, bad("port %q: %v", p.Name, err)
		}
		if p.Port <= 0 || p.Port > 65535 {
			return nil, bad("port %q: port %d out of range 1-65535", p.Name, p.Port)
		}
		if p.NodePort != 0 && (p.NodePort < int32(lo) || p.NodePort > int32(hi)) {
			return nil, bad("port %q: nodePort %d outside the node-port range %d-%d", p.Name, p.NodePort, lo, hi)
		}
		for f, clusterIP := range byFamily {
			if !clusterIP.IsValid() {
				continue
			}
			sp, err := nat.NewServicePort(nat.ServicePort{
				Name:      nat.ServicePortName{Namespace: svc.Namespace, Name: svc.Name, Port: p.Name, IPv6: f == 1},
				ClusterIP: clusterIP, Port: uint16(p.Port), Protocol: proto, NodePort: uint16(p.NodePort),
				ExternalIPs: externalIPs[f], LoadBalancerIPs: lbIPs[f], LoadBalancerSourceRanges: ranges[f],
				AffinityTimeout: affinity, ExternalPolicy: external, InternalPolicy: internal,
				HealthCheckNodePort: uint16(svc.Spec.HealthCheckNodePort), TrafficDistribution: distribution,
				Created: svc.CreationTimestamp.Time,
			})
			if err != nil {
				return nil, err
			}
			out = append(out, sp)
		}
	}
	return out, nil
}

// family indexes per-family lists: 0 for IPv4, 1 for IPv6.
func family(ip netip.Addr) int {
	if ip.Is6() {
		return 1
	}
	return 0
}

// portKey names the endpoints of one service port: its name, protocol and
// address family.
type portKey struct {
	name  string
	proto nat.Protocol
	ipv6  bool
}

// SliceEndpoints is one EndpointSlice as the proxier reads it, converted
// when the slice arrives so that nothing keeps the slice's own endpoints:
// at 10,000 Services they were the largest part of the agent's memory.
type SliceEndpoints struct {
	name  string
	ports []portKey // with the port number
	nums  []uint16
	// eps have the slice's port when it has one, else port 0; unique: no
	// address twice.
	eps    []nat.Endpoint
	unique bool
	errs   []error // what was malformed (reported at the sync)
}

// Name is the slice's name.
func (s *SliceEndpoints) Name() string { return s.name }

// Endpoints are the slice's endpoints, with its port when it has one (port 0
// when it has several), in the slice's order. Not to be changed.
func (s *SliceEndpoints) Endpoints() []nat.Endpoint { return s.eps }

// Slice converts one EndpointSlice. FQDN slices, endpoints without addresses
// and ports without numbers are ignored; a malformed slice converts to no
// endpoints and its error, a malformed port to its error.
func (c *Converter) Slice(s *discovery.EndpointSlice) *SliceEndpoints {
	out := &SliceEndpoints{name: s.Name}
	if s.AddressType != discovery.AddressTypeIPv4 && s.AddressType != discovery.AddressTypeIPv6 {
		return out
	}
	if len(s.Endpoints) > MaxEndpointsPerSlice {
		out.errs = append(out.errs, fmt.Errorf("endpointslice %s/%s: %d endpoints, more than the API's %d", s.Namespace, s.Name, len(s.Endpoints), MaxEndpointsPerSlice))
		return out
	}
	eps, err := c.sliceEndpoints(s)
	if err != nil {
		out.errs = append(out.errs, err)
		return out
	}
	for _, p := range s.Ports {
		if p.Port == nil {
			continue
		}
		port := *p.Port
		if port <= 0 || port > 65535 {
			out.errs = append(out.errs, fmt.Errorf("endpointslice %s/%s: port %d out of range 1-65535", s.Namespace, s.Name, port))
			continue
		}
		proto := nat.TCP
		if p.Protocol != nil {
			if proto, err = nat.ParseProtocol(string(*p.Protocol)); err != nil {
				out.errs = append(out.errs, fmt.Errorf("endpointslice %s/%s: %w", s.Namespace, s.Name, err))
				continue
			}
		}
		key := portKey{proto: proto, ipv6: s.AddressType == discovery.AddressTypeIPv6}
		if p.Name != nil {
			key.name = *p.Name
		}
		out.ports, out.nums = append(out.ports, key), append(out.nums, uint16(port))
	}
	if len(out.ports) == 1 {
		for i := range eps {
			eps[i].Addr = netip.AddrPortFrom(eps[i].Addr.Addr(), out.nums[0])
		}
	}
	out.eps = slices.Clip(eps)
	out.unique = unique(eps)
	return out
}

// unique tells whether no address is there twice (searched for a slice of
// a few endpoints, mapped for a large one).
func unique(eps []nat.Endpoint) bool {
	if len(eps) <= 32 {
		for i := range eps {
			for j := range i {
				if eps[j].Addr.Addr() == eps[i].Addr.Addr() {
					return false
				}
			}
		}
		return true
	}
	seen := make(map[netip.Addr]bool, len(eps))
	for i := range eps {
		if seen[eps[i].Addr.Addr()] {
			return false
		}
		seen[eps[i].Addr.Addr()] = true
	}
	return true
}

// Endpoints converts a service's EndpointSlices into endpoints per port and
// family (see Slice). A malformed slice is left out and reported (the rest
// still count).
func (c *Converter) Endpoints(eps []*discovery.EndpointSlice) (map[portKey][]nat.Endpoint, []error) {
	conv := make([]*SliceEndpoints, len(eps))
	for i, s := range eps {
		conv[i] = c.Slice(s)
	}
	return mergeSlices(conv)
}

// mergeSlices gathers a service's converted slices into endpoints per port
// and family. The same address in two slices counts once, a non-terminating
// entry winning. A service with one slice of one port gets that slice's
// list itself, not a copy.
func mergeSlices(list []*SliceEndpoints) (map[portKey][]nat.Endpoint, []error) {
	var errs []error
	for _, s := range list {
		errs = append(errs, s.errs...)
	}
	if len(list) == 1 && len(list[0].ports) == 1 && list[0].unique {
		if s := list[0]; len(s.eps) > 0 {
			return map[portKey][]nat.Endpoint{s.ports[0]: s.eps}, errs
		}
		return map[portKey][]nat.Endpoint{}, errs
	}
	type entry struct {
		ep    nat.Endpoint
		order int
	}
	byPort := map[portKey]map[netip.AddrPort]entry{}
	order := 0
	for _, s := range list {
		for i, key := range s.ports {
			if byPort[key] == nil {
				byPort[key] = map[netip.AddrPort]entry{}
			}
			for _, e := range s.eps {
				e.Addr = netip.AddrPortFrom(e.Addr.Addr(), s.nums[i])
				if cur, dup := byPort[key][e.Addr]; dup && (!cur.ep.Terminating || e.Terminating) {
					continue // the first non-terminating entry wins
				}
				order++
				byPort[key][e.Addr] = entry{e, order}
			}
		}
	}
	out := map[portKey][]nat.Endpoint{}
	for k, m := range byPort {
		list := make([]entry, 0, len(m))
		for _, e := range m {
			list = append(list, e)
		}
		// Stable input for the syncer: the order the slices listed them.
		slices.SortFunc(list, func(a, b entry) int { return a.order - b.order })
		// Exactly sized: the lists live as long as their Service does, and
		// appending one by one left them up to half empty (a fifth of the
		// converted endpoints' memory at 10,000 Services x 10 endpoints).
		if len(list) == 0 {
			continue
		}
		eps := make([]nat.Endpoint, len(list))
		for i, e := range list {
			eps[i] = e.ep
		}
		out[k] = eps
	}
	return out, errs
}

// sliceEndpoints converts a slice's endpoints (port still 0).
func (c *Converter) sliceEndpoints(s *discovery.EndpointSlice) ([]nat.Endpoint, error) {
	out := make([]nat.Endpoint, 0, len(s.Endpoints)) // kept as long as the slice is: no room to spare
	ipv6 := s.AddressType == discovery.AddressTypeIPv6
	for _, e := range s.Endpoints {
		if len(e.Addresses) == 0 {
			continue
		}
		ip, err := ParseIPSloppy(e.Addresses[0])
		if err != nil || ip.Is6() != ipv6 {
			return nil, fmt.Errorf("endpointslice %s/%s: address %q is not %s", s.Namespace, s.Name, e.Addresses[0], s.AddressType)
		}
		ep := nat.Endpoint{
			Addr:        netip.AddrPortFrom(ip, 0),
			Ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
			Serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
			Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
		}
		ep.Local = e.NodeName != nil && *e.NodeName == c.NodeName
		// Hints' names are interned: a cluster has a few zones and nodes,
		// and each decoded endpoint has its own copy.
		if h := e.Hints; h != nil && len(h.ForZones)+len(h.ForNodes) > 0 {
			ep.Hints = &nat.Hints{}
			for _, z := range h.ForZones {
				ep.Hints.Zones = append(ep.Hints.Zones, intern(z.Name))
			}
			for _, n := range h.ForNodes {
				ep.Hints.Nodes = append(ep.Hints.Nodes, intern(n.Name))
			}
		}
		out = append(out, ep)
	}
	return out, nil
}
