package ifacemgr

import "net/netip"

// WorkloadEndpoint binds a pod's policies to its host-side interface.
type WorkloadEndpoint struct {
	ID       string
	Iface    string
	IPs      []netip.Addr
	Policies []string
}

// Endpoint is the endpoint bound to one interface.
type Endpoint struct {
	ID       string
	Policies []string
	// Host marks a data or tunnel interface: the node's own, whose policy
	// is its host endpoint's (the PolicyProvider finds it by the
	// interface's name).
	Host bool
}

// endpoints resolves which endpoint applies to an interface: a workload
// endpoint for a pod's interface; every data and tunnel interface is a host
// endpoint.
type endpoints struct {
	workloads map[string]WorkloadEndpoint
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

// endpointFor resolves the endpoint of an interface of the given class.
func (e *endpoints) endpointFor(ifname string, class Class) (Endpoint, bool) {
	switch class {
	case Data, L3:
		return Endpoint{Host: true}, true
	case Workload:
		w, ok := e.workloadFor(ifname)
		return Endpoint{ID: w.ID, Policies: w.Policies}, ok
	}
	return Endpoint{}, false
}
