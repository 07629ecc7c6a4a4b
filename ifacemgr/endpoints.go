package ifacemgr

import (
	"cmp"
	"net/netip"
	"slices"
)

// WorkloadEndpoint binds a pod's policies to its host-side interface.
type WorkloadEndpoint struct {
	ID       string
	Iface    string
	IPs      []netip.Addr
	Policies []string
}

// WildcardIface binds a host endpoint to every data interface.
const WildcardIface = "*"

// HostEndpoint binds host policies to node interfaces: by name, by the IPs the
// interface is expected to hold (Iface empty), or to every data interface
// (Iface "*").
type HostEndpoint struct {
	ID          string
	Iface       string
	ExpectedIPs []netip.Addr
	Policies    []string
}

// Endpoint is the endpoint bound to one interface.
type Endpoint struct {
	ID       string
	Host     bool
	Policies []string
}

// endpoints resolves which endpoint applies to an interface.
type endpoints struct {
	workloads map[string]WorkloadEndpoint
	hosts     map[string]HostEndpoint
}

// workloadFor: among workload endpoints naming the interface, the lowest ID
// wins; the others are shadowed and take over, lowest first, when it goes.
func (e *endpoints) workloadFor(ifname string) (WorkloadEndpoint, bool) {
	var best WorkloadEndpoint
	found := false
	for _, w := range e.workloads {
		if w.Iface == ifname && (!found || w.ID < best.ID) {
			best, found = w, true
		}
	}
	return best, found
}

// hostFor: a host endpoint applies to an interface named by it, holding one of
// its expected IPs, or (wildcard) being a data interface; the lowest ID wins.
func (e *endpoints) hostFor(ifname string, addrs []netip.Addr, class Class) (HostEndpoint, bool) {
	var matches []HostEndpoint
	for _, h := range e.hosts {
		switch {
		case h.Iface == WildcardIface:
			if class == Data {
				matches = append(matches, h)
			}
		case h.Iface != "":
			if h.Iface == ifname {
				matches = append(matches, h)
			}
		default:
			if slices.ContainsFunc(h.ExpectedIPs, func(ip netip.Addr) bool { return slices.Contains(addrs, ip) }) {
				matches = append(matches, h)
			}
		}
	}
	if len(matches) == 0 {
		return HostEndpoint{}, false
	}
	return slices.MinFunc(matches, func(a, b HostEndpoint) int { return cmp.Compare(a.ID, b.ID) }), true
}

// endpointFor resolves the endpoint of an interface of the given class.
func (e *endpoints) endpointFor(ifname string, addrs []netip.Addr, class Class) (Endpoint, bool) {
	switch class {
	case Workload:
		if w, ok := e.workloadFor(ifname); ok {
			return Endpoint{ID: w.ID, Policies: w.Policies}, true
		}
	case Data, L3:
		if h, ok := e.hostFor(ifname, addrs, class); ok {
			return Endpoint{ID: h.ID, Host: true, Policies: h.Policies}, true
		}
	}
	return Endpoint{}, false
}
