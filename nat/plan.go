package nat

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/sluice-net/sluice/gen"
)

// The NodePort wildcard frontend addresses (bpf/include/service.h,
// service6.h): all ones, per family.
var (
	wildcardIP  = netip.AddrFrom4([4]byte{255, 255, 255, 255})
	wildcardIP6 = netip.AddrFrom16([16]byte{0: 0xff, 1: 0xff, 2: 0xff, 3: 0xff, 4: 0xff, 5: 0xff, 6: 0xff, 7: 0xff,
		8: 0xff, 9: 0xff, 10: 0xff, 11: 0xff, 12: 0xff, 13: 0xff, 14: 0xff, 15: 0xff})
)

func wildcardFor(ip netip.Addr) netip.Addr {
	if ip.Is6() {
		return wildcardIP6
	}
	return wildcardIP
}

// idKey names one backend set: a service port's main set (node invalid) or its
// set for one remote node (internalTrafficPolicy Local NodePort expansion).
type idKey struct {
	name ServicePortName
	node netip.Addr
}

// plan is everything one service port puts in the maps.
type plan struct {
	svc *ServicePort // a copy of the input, for comparing contents
	eps []Endpoint
	// svcIn and epsIn are the caller's own pointers, for the identity check.
	svcIn      *ServicePort
	epsIn      []Endpoint
	generation uint64

	// Entries in the planning layout of both families (family.go). Slices,
	// not maps: a plan has a few of each, and at 10,000 services the maps
	// were a tenth of the agent's heap.
	frontends []frontend
	sets      []backendSet
	srcRanges []gen.SluiceSrcrange6Key
	maglev    map[uint32][]uint32 // service id -> Maglev table (MaglevOptions)
	ips       []netip.Addr        // service IPs whose echo requests are answered
	// routeMisses are endpoint IPs whose node the route lookup did not know.
	routeMisses []netip.Addr
}

type frontend struct {
	key gen.SluiceFe6Key
	val gen.SluiceFeValue
}

// backendSet is one service id's backends by ordinal: the service's own
// (node invalid), or those behind another node's NodePort (node).
type backendSet struct {
	node netip.Addr
	id   uint32
	list []gen.SluiceBe6Value
}

// setFrontend plans k as v, replacing what the plan had for k.
func (pl *plan) setFrontend(k gen.SluiceFe6Key, v gen.SluiceFeValue) {
	for i := range pl.frontends {
		if pl.frontends[i].key == k {
			pl.frontends[i].val = v
			return
		}
	}
	pl.frontends = append(pl.frontends, frontend{k, v})
}

// backends returns service id's backends in the plan, and whether the plan
// has the id.
func (pl *plan) backends(id uint32) ([]gen.SluiceBe6Value, bool) {
	if pl == nil {
		return nil, false
	}
	for _, b := range pl.sets {
		if b.id == id {
			return b.list, true
		}
	}
	return nil, false
}

func feKey(ip netip.Addr, port uint16, proto Protocol) gen.SluiceFe6Key {
	return gen.SluiceFe6Key{Addr: gen.NetAddr6(ip), Port: gen.NetPort(port), Proto: uint8(proto)}
}

func beValue(e *Endpoint) gen.SluiceBe6Value {
	v := gen.SluiceBe6Value{Addr: gen.NetAddr6(e.Addr.Addr()), Port: gen.NetPort(e.Addr.Port())}
	if e.Local {
		v.Flags = gen.SluiceBeFlagsBE_LOCAL
	}
	return v
}

// backendLayout orders a service's backends as [local only][local and
// cluster][cluster only] (see struct fe_value) and returns the list with the
// number of local backends, the first cluster ordinal and the cluster count.
//
// An endpoint that was at an ordinal inside its group's new range in prev stays
// there, so a change to one endpoint rewrites one entry rather than shifting
// the rest; newcomers fill the free ordinals in address order.
func backendLayout(sets EndpointSets, prev []gen.SluiceBe6Value) (list []gen.SluiceBe6Value, local, clusterStart, count uint32) {
	inCluster, inLocal := addrSet(sets.Cluster), addrSet(sets.Local)
	// The groups' values, laid out in one array: each endpoint is copied
	// once, as its map value.
	values := make([]gen.SluiceBe6Value, 0, len(sets.Local)+len(sets.Cluster))
	var localOnly, both, clusterOnly []gen.SluiceBe6Value
	for _, want := range []bool{false, true} {
		start := len(values)
		for i := range sets.Local {
			if inCluster(sets.Local[i].Addr) == want {
				values = append(values, beValue(&sets.Local[i]))
			}
		}
		if want {
			both = values[start:]
		} else {
			localOnly = values[start:]
		}
	}
	start := len(values)
	for i := range sets.Cluster {
		if !inLocal(sets.Cluster[i].Addr) {
			values = append(values, beValue(&sets.Cluster[i]))
		}
	}
	clusterOnly = values[start:]
	prevAt := ordinals(prev)
	list = make([]gen.SluiceBe6Value, len(values))
	slots := make([]bool, len(values))
	restBuf := make([]gen.SluiceBe6Value, 0, len(values))
	lo := 0
	for _, group := range [][]gen.SluiceBe6Value{localOnly, both, clusterOnly} {
		rest := restBuf[:0] // the whole buffer again: the fill below advances rest
		for _, v := range group {
			if at, ok := prevAt(v); ok && at >= lo && at < lo+len(group) && !slots[at] {
				list[at], slots[at] = v, true
				continue
			}
			rest = append(rest, v)
		}
		slices.SortFunc(rest, compareBackends)
		for i := lo; i < lo+len(group); i++ {
			if !slots[i] {
				list[i], rest = rest[0], rest[1:]
			}
		}
		lo += len(group)
	}
	return list, uint32(len(sets.Local)), uint32(len(localOnly)), uint32(len(sets.Cluster))
}

// smallSet is the size up to which backendLayout searches lists instead of
// building maps: a service's lists are mostly a few endpoints, and each
// sync lays out every changed service (at 20,000 services the maps were
// most of a full sync's garbage).
const smallSet = 32

// addrSet tells whether an address is one of eps'.
func addrSet(eps []Endpoint) func(netip.AddrPort) bool {
	if len(eps) <= smallSet {
		return func(a netip.AddrPort) bool {
			return slices.ContainsFunc(eps, func(e Endpoint) bool { return e.Addr == a })
		}
	}
	m := make(map[netip.AddrPort]bool, len(eps))
	for _, e := range eps {
		m[e.Addr] = true
	}
	return func(a netip.AddrPort) bool { return m[a] }
}

// ordinals finds a backend's ordinal in prev (its last, should it be there
// twice).
func ordinals(prev []gen.SluiceBe6Value) func(gen.SluiceBe6Value) (int, bool) {
	if len(prev) <= smallSet {
		return func(v gen.SluiceBe6Value) (int, bool) {
			i := lastIndex(prev, v)
			return i, i >= 0
		}
	}
	m := make(map[gen.SluiceBe6Value]int, len(prev))
	for i, v := range prev {
		m[v] = i
	}
	return func(v gen.SluiceBe6Value) (int, bool) { i, ok := m[v]; return i, ok }
}

func lastIndex(list []gen.SluiceBe6Value, v gen.SluiceBe6Value) int {
	for i := len(list) - 1; i >= 0; i-- {
		if list[i] == v {
			return i
		}
	}
	return -1
}

func compareBackends(a, b gen.SluiceBe6Value) int {
	return cmp.Or(backendAddr(a).Compare(backendAddr(b)), cmp.Compare(a.Flags, b.Flags))
}

// backendAddr is a planned backend's address (IPv4 unmapped).
func backendAddr(v gen.SluiceBe6Value) netip.AddrPort {
	return netip.AddrPortFrom(gen.AddrFromNet6(v.Addr).Unmap(), gen.PortFromNet(v.Port))
}

// planner computes plans; ids come from the syncer.
type planner struct {
	node   *Node
	routes RouteLookup
	idFor  func(k idKey, fe gen.SluiceFe6Key) uint32
	// prev returns the backends a service id has now, so ordinals stay put.
	prev func(id uint32) []gen.SluiceBe6Value
	// maglev: frontends pick by Maglev tables (nil: at random), built by
	// maglevTable (the writer's, which reuses unchanged tables).
	maglev      *MaglevOptions
	maglevTable func(id uint32, list []gen.SluiceBe6Value, start, count uint32, eps []Endpoint) ([]uint32, error)
}

func (p *planner) plan(name ServicePortName, svc *ServicePort, eps []Endpoint) (*plan, error) {
	if slices.Contains(p.node.NodePortIPs, svc.ClusterIP) {
		// Its frontends would take the node's own ports (SSH answered with a
		// reset when the Service has no endpoints).
		return nil, fmt.Errorf("service %s: clusterIP %v is an address of this node", name, svc.ClusterIP)
	}
	pl := &plan{
		svc: svc, eps: eps,
	}
	mainKey := feKey(svc.ClusterIP, svc.Port, svc.Protocol)
	id := p.idFor(idKey{name: name}, mainKey)

	sets := CategorizeEndpoints(eps, svc, p.node)
	list, local, clusterStart, count := backendLayout(sets, p.prev(id))
	pl.sets = append(pl.sets, backendSet{id: id, list: list})
	main := gen.SluiceFeValue{
		SvcId: id, Count: count, LocalCount: local, ClusterStart: clusterStart,
		AffinityTimeout: svc.AffinityTimeout,
	}
	if !svc.UsesClusterEndpoints() {
		// Internal policy Local without external destinations: kube-proxy keeps
		// no cluster set, but "has any endpoint" still decides reject vs drop;
		// the datapath reads that from count, which local-only traffic never
		// indexes by.
		main.Count = boolToCount(sets.HasAny)
	}

	clusterIPEntry := main
	if svc.InternalPolicy == PolicyLocal {
		clusterIPEntry.Flags |= gen.SluiceFeFlagsFE_INT_LOCAL
	}
	var maglevFlag gen.SluiceFeFlags
	if p.maglev != nil && svc.UsesClusterEndpoints() {
		table, err := p.maglevTable(id, list, clusterStart, count, eps)
		if err != nil {
			return nil, fmt.Errorf("service %s: %w", name, err)
		}
		if table != nil {
			pl.maglev = map[uint32][]uint32{id: table}
		}
		maglevFlag = gen.SluiceFeFlagsFE_MAGLEV
		if p.maglev.ClusterIP {
			clusterIPEntry.Flags |= maglevFlag
		}
	}
	pl.setFrontend(mainKey, clusterIPEntry)
	pl.ips = append(pl.ips, svc.ClusterIP)

	external := main
	external.Flags = gen.SluiceFeFlagsFE_EXTERNAL | maglevFlag
	if svc.ExternalPolicy == PolicyLocal {
		external.Flags |= gen.SluiceFeFlagsFE_EXT_LOCAL
	}
	for _, ip := range svc.ExternalIPs {
		pl.setFrontend(feKey(ip, svc.Port, svc.Protocol), external)
		pl.ips = append(pl.ips, ip)
	}
	lb := external
	if len(svc.LoadBalancerSourceRanges) > 0 {
		lb.Flags |= gen.SluiceFeFlagsFE_SRC_RANGES
		pl.srcRanges = sourceRangeKeys(id, svc, p.node)
	}
	for _, ip := range svc.LoadBalancerIPs {
		pl.setFrontend(feKey(ip, svc.Port, svc.Protocol), lb)
		pl.ips = append(pl.ips, ip)
	}
	if svc.NodePort != 0 {
		for _, ip := range p.node.NodePortIPs {
			if ip.Is6() == svc.ClusterIP.Is6() { // each family's on its own addresses
				pl.setFrontend(feKey(ip, svc.NodePort, svc.Protocol), external)
			}
		}
		expand := svc.InternalPolicy == PolicyLocal && p.routes != nil
		if p.node.AllNodePortIPs && !expand {
			pl.setFrontend(feKey(wildcardFor(svc.ClusterIP), svc.NodePort, svc.Protocol), external)
		}
		if expand {
			p.expandRemoteNodePorts(pl, name, svc)
		}
	}
	return pl, nil
}

func boolToCount(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// sourceRangeKeys: one LPM entry per allowed CIDR; when a node IP is inside a
// range, traffic sourced from the load balancer IPs is allowed too (kube-proxy).
func sourceRangeKeys(id uint32, svc *ServicePort, node *Node) []gen.SluiceSrcrange6Key {
	key := func(p netip.Prefix) gen.SluiceSrcrange6Key {
		bits := uint32(p.Bits())
		if p.Addr().Is4() {
			bits += mappedBits
		}
		return gen.SluiceSrcrange6Key{Prefixlen: 32 + bits, SvcId: gen.NetUint32(id), Src: gen.NetAddr6(p.Masked().Addr())}
	}
	var keys []gen.SluiceSrcrange6Key
	nodeInside := false
	for _, r := range svc.LoadBalancerSourceRanges {
		keys = append(keys, key(r))
		for _, ip := range node.NodePortIPs {
			nodeInside = nodeInside || r.Contains(ip)
		}
	}
	if nodeInside {
		for _, ip := range svc.LoadBalancerIPs {
			keys = append(keys, key(netip.PrefixFrom(ip, ip.BitLen())))
		}
	}
	slices.SortFunc(keys, func(a, b gen.SluiceSrcrange6Key) int {
		return cmp.Or(slices.Compare(a.Src[:], b.Src[:]), cmp.Compare(a.Prefixlen, b.Prefixlen))
	})
	return slices.Compact(keys)
}

// expandRemoteNodePorts programs, for internalTrafficPolicy Local, one NodePort
// frontend per remote node IP holding only that node's endpoints, so a pod
// reaching another node's NodePort is balanced to that node's pods directly
// (the wildcard entry is left out). Endpoints whose node the routes do not know
// yet are recorded; the syncer retries them when routes change.
func (p *planner) expandRemoteNodePorts(pl *plan, name ServicePortName, svc *ServicePort) {
	byNode := map[netip.Addr][]Endpoint{}
	for _, e := range pl.eps {
		if e.Local || !(e.Ready || (e.Serving && e.Terminating)) {
			continue
		}
		nodeIP, ok := p.routes(e.Addr.Addr())
		if !ok {
			pl.routeMisses = append(pl.routeMisses, e.Addr.Addr())
			continue
		}
		byNode[nodeIP] = append(byNode[nodeIP], e)
	}
	for nodeIP, eps := range byNode {
		if slices.Contains(p.node.NodePortIPs, nodeIP) {
			continue // one of ours: programmed with the local entries
		}
		if nodeIP.Is6() != svc.ClusterIP.Is6() {
			continue // a NodePort of one family never leads to the other's endpoints
		}
		ready := filter(eps, func(e *Endpoint) bool { return e.Ready })
		if len(ready) == 0 {
			ready = eps
		}
		key := feKey(nodeIP, svc.NodePort, svc.Protocol)
		id := p.idFor(idKey{name: name, node: nodeIP}, key)
		list, _, _, _ := backendLayout(EndpointSets{Cluster: ready}, p.prev(id))
		pl.sets = append(pl.sets, backendSet{node: nodeIP, id: id, list: list})
		pl.setFrontend(key, gen.SluiceFeValue{
			SvcId: id, Count: uint32(len(list)), AffinityTimeout: svc.AffinityTimeout,
			Flags: gen.SluiceFeFlagsFE_EXTERNAL,
		})
	}
}
