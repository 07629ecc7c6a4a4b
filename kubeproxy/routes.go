package kubeproxy

import (
	"maps"
	"net/netip"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
)

// NodeRoutes tells which node an endpoint IP is on, from every Node's pod
// CIDRs (spec.podCIDRs) and addresses (a host-network endpoint is its node's
// own address): the route lookup of the NAT syncer's internalTrafficPolicy
// Local NodePort expansion (nat.Options.Routes).
type NodeRoutes struct {
	// OnChange, if set, is called after the routes changed
	// (nat.Syncer.RoutesChanged).
	OnChange func()

	mu     sync.RWMutex
	nodes  map[string][]nodeRoute // by Node name
	routes []nodeRoute            // every node's, longest prefix first
}

type nodeRoute struct {
	prefix netip.Prefix
	node   netip.Addr
}

// Lookup returns the IP of the node whose pod CIDR or address holds ip.
func (r *NodeRoutes) Lookup(ip netip.Addr) (netip.Addr, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, rt := range r.routes {
		if rt.prefix.Contains(ip) {
			return rt.node, true
		}
	}
	return netip.Addr{}, false
}

// OnNode records a Node (deleted: forgets it).
func (r *NodeRoutes) OnNode(n *v1.Node, deleted bool) {
	r.update(func(nodes map[string][]nodeRoute) {
		if deleted {
			delete(nodes, n.Name)
		} else {
			nodes[n.Name] = routesOf(n)
		}
	})
}

// SetNodes replaces every Node (a folder of manifests is read whole).
func (r *NodeRoutes) SetNodes(list []*v1.Node) {
	r.update(func(nodes map[string][]nodeRoute) {
		clear(nodes)
		for _, n := range list {
			nodes[n.Name] = routesOf(n)
		}
	})
}

func (r *NodeRoutes) update(change func(map[string][]nodeRoute)) {
	r.mu.Lock()
	if r.nodes == nil {
		r.nodes = map[string][]nodeRoute{}
	}
	change(r.nodes)
	var routes []nodeRoute
	for _, name := range slices.Sorted(maps.Keys(r.nodes)) {
		routes = append(routes, r.nodes[name]...)
	}
	slices.SortStableFunc(routes, func(a, b nodeRoute) int { return b.prefix.Bits() - a.prefix.Bits() })
	same := slices.Equal(routes, r.routes)
	r.routes = routes
	r.mu.Unlock()
	if !same && r.OnChange != nil {
		r.OnChange()
	}
}

// routesOf is a Node's routes: its addresses and pod CIDRs, each toward
// the Node's first InternalIP (else ExternalIP) of the same family. A family
// without such an address has none.
func routesOf(n *v1.Node) []nodeRoute {
	var nodeIP [2]netip.Addr
	var addrs []netip.Addr
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			if ip, err := ParseIPSloppy(a.Address); a.Type == typ && err == nil {
				if !nodeIP[family(ip)].IsValid() {
					nodeIP[family(ip)] = ip
				}
				addrs = append(addrs, ip)
			}
		}
	}
	var out []nodeRoute
	for _, a := range addrs {
		out = append(out, nodeRoute{netip.PrefixFrom(a, a.BitLen()), nodeIP[family(a)]})
	}
	for _, c := range cmpOrSlice(n.Spec.PodCIDRs, n.Spec.PodCIDR) {
		if p, err := netip.ParsePrefix(c); err == nil && nodeIP[family(p.Addr())].IsValid() {
			out = append(out, nodeRoute{p.Masked(), nodeIP[family(p.Addr())]})
		}
	}
	return out
}
