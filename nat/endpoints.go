package nat

import (
	"net/netip"
	"slices"
)

// Node is what endpoint choice and NodePorts need to know about this node.
type Node struct {
	Name string
	// Zone is the node's topology.kubernetes.io/zone label ("" if none).
	Zone string
	// NodePortIPs are the addresses NodePorts are opened on (already filtered by
	// --nodeport-addresses).
	NodePortIPs []netip.Addr
	// AllNodePortIPs: every local address accepts NodePorts (no
	// --nodeport-addresses), so the wildcard entry is programmed too.
	AllNodePortIPs bool
}

func (n *Node) equal(o *Node) bool {
	return n.Name == o.Name && n.Zone == o.Zone && n.AllNodePortIPs == o.AllNodePortIPs &&
		slices.Equal(n.NodePortIPs, o.NodePortIPs)
}

// EndpointSets is kube-proxy's choice of endpoints for one service port. A
// set may share its array with the endpoints it was chosen from: neither is
// to be changed.
type EndpointSets struct {
	// Cluster are the endpoints for cluster-wide traffic (nil when the service
	// does not use cluster endpoints).
	Cluster []Endpoint
	// Local are the endpoints for node-local traffic (nil when the service does
	// not use local endpoints). May be empty: such traffic is dropped.
	Local []Endpoint
	// HasAny: any ready or serving-terminating endpoint exists anywhere. Without
	// one, traffic is rejected.
	HasAny bool
}

// CategorizeEndpoints chooses endpoints exactly as kube-proxy does (see
// kube-proxy-semantics.md, "Choosing endpoints"):
//
//   - Cluster: the ready endpoints that pass the topology filter; if there are
//     none, every serving and terminating endpoint (topology ignored).
//   - Local: the local ready endpoints; if none, the local serving and
//     terminating ones; never topology-filtered.
//   - Topology (over ready endpoints only): same node if every ready endpoint
//     has a node hint and one names this node; else same zone if every ready
//     endpoint has a zone hint and one names this node's zone; else none.
func CategorizeEndpoints(eps []Endpoint, svc *ServicePort, node *Node) EndpointSets {
	var sets EndpointSets
	for i := range eps {
		if eps[i].Ready || (eps[i].Serving && eps[i].Terminating) {
			sets.HasAny = true
			break
		}
	}
	if svc.UsesClusterEndpoints() {
		keep := topologyFilter(eps, node)
		sets.Cluster = filter(eps, func(e *Endpoint) bool { return e.Ready && keep(e) })
		if len(sets.Cluster) == 0 {
			sets.Cluster = filter(eps, func(e *Endpoint) bool { return e.Serving && e.Terminating })
		}
	}
	if svc.UsesLocalEndpoints() {
		sets.Local = filter(eps, func(e *Endpoint) bool { return e.Ready && e.Local })
		if len(sets.Local) == 0 {
			sets.Local = filter(eps, func(e *Endpoint) bool { return e.Serving && e.Terminating && e.Local })
		}
		if sets.Local == nil {
			sets.Local = []Endpoint{}
		}
	}
	return sets
}

// filter returns the endpoints keep keeps, nil for none. When it keeps
// every one it returns eps itself (capped, so an append copies): at 10,000
// services the copies were a tenth of the agent's heap, and endpoint lists
// are immutable once given to the syncer.
func filter(eps []Endpoint, keep func(*Endpoint) bool) []Endpoint {
	for i := range eps {
		if keep(&eps[i]) {
			continue
		}
		out := slices.Clone(eps[:i])
		for j := i + 1; j < len(eps); j++ {
			if keep(&eps[j]) {
				out = append(out, eps[j])
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	}
	if len(eps) == 0 {
		return nil
	}
	return slices.Clip(eps)
}

// topologyFilter returns the predicate ready endpoints must pass.
func topologyFilter(eps []Endpoint, node *Node) func(*Endpoint) bool {
	all := func(*Endpoint) bool { return true }
	var ready []*Endpoint
	for i := range eps {
		if eps[i].Ready {
			ready = append(ready, &eps[i])
		}
	}
	if len(ready) == 0 {
		return all
	}
	if node.Name != "" && usable(ready, func(e *Endpoint) []string { return e.Hints.nodes() }, node.Name) {
		return func(e *Endpoint) bool { return slices.Contains(e.Hints.nodes(), node.Name) }
	}
	if node.Zone != "" && usable(ready, func(e *Endpoint) []string { return e.Hints.zones() }, node.Zone) {
		return func(e *Endpoint) bool { return slices.Contains(e.Hints.zones(), node.Zone) }
	}
	return all
}

// usable: every ready endpoint has a hint of this kind and one names want.
func usable(ready []*Endpoint, hints func(*Endpoint) []string, want string) bool {
	named := false
	for _, e := range ready {
		h := hints(e)
		if len(h) == 0 {
			return false
		}
		if slices.Contains(h, want) {
			named = true
		}
	}
	return named
}
