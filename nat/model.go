package nat

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Protocol is an IP protocol number.
type Protocol uint8

// The protocols a service port may use.
const (
	TCP  Protocol = 6
	UDP  Protocol = 17
	SCTP Protocol = 132
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return fmt.Sprintf("protocol(%d)", uint8(p))
}

// ParseProtocol parses "TCP", "UDP" or "SCTP" (Kubernetes spelling).
func ParseProtocol(s string) (Protocol, error) {
	switch s {
	case "TCP", "":
		return TCP, nil
	case "UDP":
		return UDP, nil
	case "SCTP":
		return SCTP, nil
	}
	return 0, fmt.Errorf("protocol %q: want TCP, UDP or SCTP", s)
}

// ServicePortName names one port of one service, in one address family.
type ServicePortName struct {
	Namespace, Name, Port string
	// IPv6 names the service port's IPv6 half. A dual-stack Service is
	// programmed as one service port per family, as kube-proxy runs one
	// proxier per family; each has its own id, frontends and backends.
	IPv6 bool
}

func (n ServicePortName) String() string {
	s := n.Namespace + "/" + n.Name
	if n.Port != "" {
		s += ":" + n.Port
	}
	if n.IPv6 {
		s += " (IPv6)"
	}
	return s
}

// TrafficPolicy is a service's internal or external traffic policy.
type TrafficPolicy uint8

// Traffic policies.
const (
	PolicyCluster TrafficPolicy = iota
	PolicyLocal
)

// MaxAffinityTimeout is Kubernetes' upper bound for sessionAffinityConfig.
const MaxAffinityTimeout = 86400

// ServicePort is one port of one service, with everything that decides how
// packets to it are balanced.
type ServicePort struct {
	Name      ServicePortName
	ClusterIP netip.Addr
	Port      uint16
	Protocol  Protocol
	// NodePort is 0 when the service has none.
	NodePort                 uint16
	ExternalIPs              []netip.Addr
	LoadBalancerIPs          []netip.Addr
	LoadBalancerSourceRanges []netip.Prefix
	// AffinityTimeout is the ClientIP session affinity timeout in seconds; 0
	// means no session affinity.
	AffinityTimeout     uint32
	ExternalPolicy      TrafficPolicy
	InternalPolicy      TrafficPolicy
	HealthCheckNodePort uint16
	// TrafficDistribution is the service's spec.trafficDistribution (informational:
	// topology is decided by the endpoints' hints, as kube-proxy does).
	TrafficDistribution string
	// Created is when the Service was created. When two Services claim the
	// same frontend (an externalIP:port the API server accepts twice), the
	// older one has it; the zero time counts as oldest, then names decide.
	Created time.Time
}

// NewServicePort validates s and returns a copy with its lists normalised
// (source ranges masked); the error names the service and the bad field.
func NewServicePort(s ServicePort) (*ServicePort, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	c := s
	c.ExternalIPs = slices.Clone(s.ExternalIPs)
	c.LoadBalancerIPs = slices.Clone(s.LoadBalancerIPs)
	c.LoadBalancerSourceRanges = make([]netip.Prefix, len(s.LoadBalancerSourceRanges))
	for i, p := range s.LoadBalancerSourceRanges {
		c.LoadBalancerSourceRanges[i] = p.Masked()
	}
	return &c, nil
}

// Validate checks every field; the error names the service and the field.
func (s *ServicePort) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("service %s: "+format, append([]any{s.Name}, args...)...)
	}
	if s.Name.Namespace == "" || s.Name.Name == "" {
		return bad("name: namespace and name are required")
	}
	if !s.ClusterIP.IsValid() || s.ClusterIP.Is4In6() || s.ClusterIP.Zone() != "" {
		return bad("clusterIP %v: not an IPv4 or IPv6 address", s.ClusterIP)
	}
	if s.ClusterIP.Is6() != s.Name.IPv6 {
		return bad("clusterIP %v: not of the service port's family (%s)", s.ClusterIP, familyName(s.Name.IPv6))
	}
	if why := specialAddr(s.ClusterIP); why != "" {
		return bad("clusterIP %v: %s", s.ClusterIP, why)
	}
	if s.Port == 0 {
		return bad("port 0: out of range 1-65535")
	}
	switch s.Protocol {
	case TCP, UDP, SCTP:
	default:
		return bad("protocol %v: want TCP, UDP or SCTP", s.Protocol)
	}
	family := familyName(s.ClusterIP.Is6())
	for _, ip := range s.ExternalIPs {
		if !sameFamily(ip, s.ClusterIP) {
			return bad("externalIPs: %v is not an %s address", ip, family)
		}
		if why := specialAddr(ip); why != "" {
			return bad("externalIPs: %v: %s", ip, why)
		}
	}
	for _, ip := range s.LoadBalancerIPs {
		if !sameFamily(ip, s.ClusterIP) {
			return bad("loadBalancer ingress IP %v: not an %s address", ip, family)
		}
		if why := specialAddr(ip); why != "" {
			return bad("loadBalancer ingress IP %v: %s", ip, why)
		}
	}
	for _, p := range s.LoadBalancerSourceRanges {
		if !p.IsValid() || !sameFamily(p.Addr(), s.ClusterIP) {
			return bad("loadBalancerSourceRanges: %v is not an %s CIDR", p, family)
		}
	}
	if s.AffinityTimeout > MaxAffinityTimeout {
		return bad("sessionAffinity timeoutSeconds %d: above %d", s.AffinityTimeout, MaxAffinityTimeout)
	}
	if s.ExternalPolicy > PolicyLocal || s.InternalPolicy > PolicyLocal {
		return bad("traffic policy: unknown value")
	}
	return nil
}

// ExternallyAccessible reports whether the service has external destinations.
func (s *ServicePort) ExternallyAccessible() bool {
	return s.NodePort != 0 || len(s.ExternalIPs) > 0 || len(s.LoadBalancerIPs) > 0
}

// UsesClusterEndpoints: internal policy Cluster, or any external destination
// (external traffic from pods goes to every endpoint even with eTP Local).
func (s *ServicePort) UsesClusterEndpoints() bool {
	return s.InternalPolicy == PolicyCluster || s.ExternallyAccessible()
}

// UsesLocalEndpoints: internal policy Local, or external policy Local on an
// externally accessible service.
func (s *ServicePort) UsesLocalEndpoints() bool {
	return s.InternalPolicy == PolicyLocal || (s.ExternalPolicy == PolicyLocal && s.ExternallyAccessible())
}

// Equal reports whether two service ports program the same entries.
func (s *ServicePort) Equal(o *ServicePort) bool {
	if s == o {
		return true
	}
	if s == nil || o == nil {
		return false
	}
	return s.Name == o.Name && s.ClusterIP == o.ClusterIP && s.Port == o.Port && s.Protocol == o.Protocol &&
		s.NodePort == o.NodePort && slices.Equal(s.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(s.LoadBalancerIPs, o.LoadBalancerIPs) &&
		slices.Equal(s.LoadBalancerSourceRanges, o.LoadBalancerSourceRanges) &&
		s.AffinityTimeout == o.AffinityTimeout && s.ExternalPolicy == o.ExternalPolicy &&
		s.InternalPolicy == o.InternalPolicy && s.HealthCheckNodePort == o.HealthCheckNodePort &&
		s.TrafficDistribution == o.TrafficDistribution
}

// Endpoint is one backend address of a service port, with its conditions.
// It keeps what programming the service reads, as kube-proxy's endpoint
// info does: whether it is local, not the node's or zone's name. A node
// holds one per endpoint of the cluster: 48 bytes.
type Endpoint struct {
	Addr netip.AddrPort
	// Ready, Serving and Terminating are the EndpointSlice conditions, already
	// defaulted (ready and serving unset mean true, terminating unset false).
	Ready, Serving, Terminating bool
	// Local: the endpoint runs on this node.
	Local bool
	// Weight is the endpoint's share of a Maglev table against the others
	// (MaglevOptions); 0 counts as 1, which is what every Kubernetes
	// endpoint gets. Random picks ignore it.
	Weight uint32
	// Hints are the endpoint's topology hints; nil for none (most
	// endpoints: a pointer keeps the record small).
	Hints *Hints
}

// Hints are an EndpointSlice endpoint's hints: the zones (forZones) and
// nodes (forNodes) it is meant for.
type Hints struct {
	Zones, Nodes []string
}

func (h *Hints) zones() []string {
	if h == nil {
		return nil
	}
	return h.Zones
}

func (h *Hints) nodes() []string {
	if h == nil {
		return nil
	}
	return h.Nodes
}

// NewEndpoint validates e; the error names the bad field.
func NewEndpoint(e Endpoint) (Endpoint, error) {
	if a := e.Addr.Addr(); !a.IsValid() || a.Is4In6() || a.Zone() != "" {
		return e, fmt.Errorf("endpoint %v: not an IPv4 or IPv6 address", e.Addr)
	}
	if e.Addr.Port() == 0 {
		return e, fmt.Errorf("endpoint %v: port 0: out of range 1-65535", e.Addr)
	}
	return e, nil
}

// Equal reports whether two endpoints are the same in every field.
func (e *Endpoint) Equal(o *Endpoint) bool {
	return e.Addr == o.Addr && e.Ready == o.Ready && e.Serving == o.Serving && e.Terminating == o.Terminating &&
		e.Local == o.Local &&
		slices.Equal(e.Hints.zones(), o.Hints.zones()) && slices.Equal(e.Hints.nodes(), o.Hints.nodes()) && e.Weight == o.Weight
}

// reserved is 240.0.0.0/4 (RFC 1112 "future use"), which holds the limited
// broadcast address 255.255.255.255, the datapath's NodePort wildcard.
var reserved = netip.MustParsePrefix("240.0.0.0/4")

func familyName(ipv6 bool) string {
	if ipv6 {
		return "IPv6"
	}
	return "IPv4"
}

// sameFamily: both IPv4 or both IPv6 (an IPv4-mapped address is neither's:
// callers give unmapped addresses).
func sameFamily(a, b netip.Addr) bool {
	return a.IsValid() && !a.Is4In6() && a.Zone() == "" && a.Is6() == b.Is6()
}

// specialAddr says why an address cannot be a Service's (as the API server
// refuses them in externalIPs): it would capture traffic that is not the
// Service's, or collide with the NodePort wildcard encoding. "" when usable.
func specialAddr(ip netip.Addr) string {
	if ip.Is6() {
		switch {
		case ip.IsUnspecified():
			return "the unspecified address (::), not a service address"
		case ip.IsLoopback():
			return "a loopback address"
		case ip.IsLinkLocalUnicast():
			return "a link-local address"
		case ip.IsMulticast():
			return "a multicast address (ff00::/8, which holds the NodePort wildcard ffff:...:ffff)"
		}
		return ""
	}
	switch {
	case ip.IsUnspecified() || ip.As4()[0] == 0:
		return `an address of "this network" (0.0.0.0/8), not a service address`
	case ip.IsLoopback():
		return "a loopback address"
	case ip.IsLinkLocalUnicast():
		return "a link-local address"
	case ip.IsMulticast():
		return "a multicast address"
	case reserved.Contains(ip):
		return "a reserved or broadcast address (240.0.0.0/4, 255.255.255.255)"
	}
	return ""
}
