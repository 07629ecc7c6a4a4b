package agent

import (
	"log/slog"
	stdmaps "maps"
	"net/netip"
	"slices"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/ifacemgr"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/policy/binding"
	"github.com/sluice-net/sluice/policy/k8s"
)

// policyFeed wires the policy binder to the interface manager: it binds each
// local pod to its host-side interface (ifacemgr.PodInterfaces), and answers the
// manager's questions (ifacemgr.PolicyProvider) from the binder.
type policyFeed struct {
	log    *slog.Logger
	netns  string
	b      *binding.Binder
	ifaces workloadBinder
	// openPods reads the node's interfaces (ifacemgr.NewPodInterfaces).
	openPods func(netns string) (podFinder, error)
	bound    map[string]bool // endpoint ids bound to interfaces
	node     string
	hosts    map[string]string // host endpoint id -> content hash, as last bound
	// defaultHost applies to every data interface no HostEndpoint names
	// when none is for "*" (--default-host-endpoint); nil: none.
	defaultHost *k8s.HostEndpoint
	// found is the interface each bound pod's address was found routed
	// through, at which routing generation (ifacemgr.RoutingGeneration):
	// asking the kernel for every local pod's route at every policy change
	// took two netlink round trips a pod (3.8 ms for 100 pods).
	found map[string]foundIface
}

// workloadBinder is what the feed asks of the interface manager
// (ifacemgr.Manager).
type workloadBinder interface {
	RoutingGeneration() uint64
	SetWorkloadEndpoint(ifacemgr.WorkloadEndpoint)
	RemoveWorkloadEndpoint(id string)
	PoliciesChanged()
	Apply() ifacemgr.ApplyResult
}

// podFinder finds pods' host-side interfaces (ifacemgr.PodInterfaces).
type podFinder interface {
	Interface(ip netip.Addr) (string, error)
	Close()
}

type foundIface struct {
	ip      netip.Addr
	iface   string
	routing uint64
}

func newPolicyFeed(set *maps.Set, objs *gen.SluiceObjects, netnsPath, node string, log *slog.Logger) (*policyFeed, error) {
	b, err := binding.New(binding.Options{Maps: set, Verdict: objs.SlPolicyVerdict, Node: node, Log: log})
	if err != nil {
		return nil, err
	}
	open := func(netns string) (podFinder, error) { return ifacemgr.NewPodInterfaces(netns) }
	return &policyFeed{log: log, netns: netnsPath, b: b, bound: map[string]bool{}, node: node, openPods: open}, nil
}

// Update translates the cluster's objects and binds each local pod's policy
// to the pod's host-side interface.
func (f *policyFeed) Update(c k8s.Cluster) {
	if f.defaultHost != nil && !slices.ContainsFunc(c.HostEndpoints, func(h *k8s.HostEndpoint) bool {
		return h.Spec.InterfaceName == k8s.AllInterfaces && (h.Spec.Node == "" || h.Spec.Node == f.node)
	}) {
		c.HostEndpoints = append(slices.Clip(c.HostEndpoints), f.defaultHost)
	}
	start := time.Now()
	endpoints, first := f.b.Update(c)
	translated := time.Now()
	seen := map[string]bool{}
	hosts := map[string]string{}
	// The routes are read only for pods whose address is new, or when the
	// routing may have changed since their interface was found.
	routing := f.ifaces.RoutingGeneration()
	found := map[string]foundIface{}
	var pods podFinder
	var podsErr error
	defer func() {
		if pods != nil {
			pods.Close()
		}
	}()
	for id, ep := range endpoints {
		if ep.Interface != "" {
			hosts[id] = f.b.Hash(&ep.Ingress) + f.b.Hash(&ep.Egress)
			continue
		}
		known, ok := f.found[id]
		if !ok || routing == 0 || known.routing != routing || known.ip != ep.IP {
			if pods == nil && podsErr == nil {
				if pods, podsErr = f.openPods(f.netns); podsErr != nil {
					pods = nil
					f.log.Error("cannot read the node's interfaces: pods keep their bindings until the next sync", "err", podsErr)
				}
			}
			if podsErr != nil {
				seen[id] = f.bound[id] // kept as it is, not unbound
				continue
			}
			iface, err := pods.Interface(ep.IP)
			if err != nil {
				f.log.Warn("pod without a host interface yet", "pod", id, "err", err)
				continue
			}
			known = foundIface{ip: ep.IP, iface: iface, routing: routing}
		}
		found[id] = known
		seen[id] = true
		f.ifaces.SetWorkloadEndpoint(ifacemgr.WorkloadEndpoint{ID: id, Iface: known.iface,
			Policies: []string{f.b.Hash(&ep.Ingress), f.b.Hash(&ep.Egress)}})
	}
	f.found = found
	for id := range f.bound {
		if !seen[id] {
			f.ifaces.RemoveWorkloadEndpoint(id)
		}
	}
	f.bound = seen
	if first || !stdmaps.Equal(hosts, f.hosts) {
		// Every interface, with or without a pod: the first time, or when a
		// host endpoint changed (interfaces find theirs by name).
		f.ifaces.PoliciesChanged()
	}
	f.hosts = hosts
	bound := time.Now()
	f.ifaces.Apply()
	f.b.Finish()
	f.log.Debug("policy update", "pods", len(c.Pods), "endpoints", len(endpoints),
		"translate", translated.Sub(start), "bind", bound.Sub(translated), "apply", time.Since(bound))
}

// Install implements ifacemgr.PolicyProvider. A data or tunnel interface
// takes the HostEndpoint that names it, else the one for every interface.
func (f *policyFeed) Install(ifname string, ifindex int, ep *ifacemgr.Endpoint) (uint32, uint32, error) {
	id := ""
	switch {
	case ep == nil:
	case ep.Host:
		if id = k8s.HostEndpointID(ifname); !f.b.Has(id) {
			id = k8s.HostEndpointID(k8s.AllInterfaces)
		}
	default:
		id = ep.ID
	}
	return f.b.Slots(ifindex, id)
}

// Remove implements ifacemgr.PolicyProvider.
func (f *policyFeed) Remove(ifindex int) error {
	f.b.Release(ifindex)
	return nil
}
