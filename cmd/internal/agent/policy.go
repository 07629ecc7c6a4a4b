package agent

import (
	"log/slog"
	stdmaps "maps"
	"slices"

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
	ifaces *ifacemgr.Manager
	bound  map[string]bool // endpoint ids bound to interfaces
	node   string
	hosts  map[string]string // host endpoint id -> content hash, as last bound
	// defaultHost applies to every data interface no HostEndpoint names
	// when none is for "*" (--default-host-endpoint); nil: none.
	defaultHost *k8s.HostEndpoint
}

func newPolicyFeed(set *maps.Set, objs *gen.SluiceObjects, netnsPath, node string, log *slog.Logger) (*policyFeed, error) {
	b, err := binding.New(binding.Options{Maps: set, Verdict: objs.SlPolicyVerdict, Node: node, Log: log})
	if err != nil {
		return nil, err
	}
	return &policyFeed{log: log, netns: netnsPath, b: b, bound: map[string]bool{}, node: node}, nil
}

// Update translates the cluster's objects and binds each local pod's policy
// to the pod's host-side interface.
func (f *policyFeed) Update(c k8s.Cluster) {
	if f.defaultHost != nil && !slices.ContainsFunc(c.HostEndpoints, func(h *k8s.HostEndpoint) bool {
		return h.Spec.InterfaceName == k8s.AllInterfaces && (h.Spec.Node == "" || h.Spec.Node == f.node)
	}) {
		c.HostEndpoints = append(slices.Clip(c.HostEndpoints), f.defaultHost)
	}
	endpoints, first := f.b.Update(c)
	seen := map[string]bool{}
	hosts := map[string]string{}
	pods, err := ifacemgr.NewPodInterfaces(f.netns)
	if err != nil {
		f.log.Error("cannot read the node's interfaces: pods keep their bindings until the next sync", "err", err)
	} else {
		defer pods.Close()
	}
	for id, ep := range endpoints {
		if ep.Interface != "" {
			hosts[id] = f.b.Hash(&ep.Ingress) + f.b.Hash(&ep.Egress)
			continue
		}
		if pods == nil {
			seen[id] = f.bound[id] // kept as it is, not unbound
			continue
		}
		iface, err := pods.Interface(ep.IP)
		if err != nil {
			f.log.Warn("pod without a host interface yet", "pod", id, "err", err)
			continue
		}
		seen[id] = true
		f.ifaces.SetWorkloadEndpoint(ifacemgr.WorkloadEndpoint{ID: id, Iface: iface,
			Policies: []string{f.b.Hash(&ep.Ingress), f.b.Hash(&ep.Egress)}})
	}
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
	f.ifaces.Apply()
	f.b.Finish()
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
