package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/ifacemgr"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/policy"
	"github.com/sluice-net/sluice/policy/k8s"
)

// policyFeed keeps the local pods' NetworkPolicies compiled and bound to their
// interfaces: it is the interface manager's PolicyProvider.
type policyFeed struct {
	mu      sync.Mutex
	log     *slog.Logger
	netns   string
	node    string
	rt      *policy.Runtime
	ifaces  *ifacemgr.Manager
	ipsets  *maps.CachingMap[gen.SluiceIpsetKey, gen.SluiceIpsetValue]
	result  *k8s.Result
	bound   map[string]bool   // endpoint ids bound to interfaces
	slots   map[int][2]uint32 // ifindex -> ingress, egress slot in use
	cache   map[string]uint32 // endpoint/direction/content -> slot
	retired []uint32          // slots to free at the next update
	adopted map[uint32]bool   // slots taken over from the previous agent, not yet matched
	// synced: the policies have been translated once. Until then an
	// interface keeps the slots it has (a restart must not leave pods
	// unprotected, or judged by another pod's policy, meanwhile).
	synced bool
	logged map[string]bool // translation errors already logged
}

func newPolicyFeed(set *maps.Set, verdict *gen.SluiceObjects, netnsPath, node string, log *slog.Logger) (*policyFeed, error) {
	ipsets, err := maps.IPSets.In(set)
	if err != nil {
		return nil, err
	}
	rt, err := policy.NewRuntime(policy.Maps{Programs: set.Map(maps.PolicyPrograms), IPSets: set.Map(maps.IPSets.Name),
		RuleCounters: set.Map(maps.RuleCtrs.Name)}, verdict.SlPolicyVerdict, 0)
	if err != nil {
		return nil, err
	}
	f := &policyFeed{log: log, netns: netnsPath, node: node, rt: rt, ipsets: maps.NewCachingMap(ipsets),
		bound: map[string]bool{}, slots: map[int][2]uint32{}, cache: map[string]uint32{},
		result: &k8s.Result{Endpoints: map[string]k8s.Endpoint{}}}
	if err := f.ipsets.LoadDataplaneState(); err != nil {
		return nil, err
	}
	if err := f.adopt(set); err != nil {
		return nil, err
	}
	return f, nil
}

// adopt takes over the policy slots the interfaces already point to (the
// program array and sl_ifstate_v1 outlive an agent): no new policy is
// installed over them, and an interface whose policy did not change keeps
// its slot without its programs being loaded again.
func (f *policyFeed) adopt(set *maps.Set) error {
	ifstate, err := maps.IfState.In(set)
	if err != nil {
		return err
	}
	var firsts []uint32
	err = ifstate.Iterate(func(k gen.SluiceIfstateKey, v gen.SluiceIfstateValue) bool {
		f.slots[int(k.Ifindex)] = [2]uint32{v.IngressPolicy, v.EgressPolicy}
		for _, s := range []uint32{v.IngressPolicy, v.EgressPolicy} {
			if s != ifacemgr.NoPolicy {
				firsts = append(firsts, s)
			}
		}
		return true
	})
	if err != nil {
		return err
	}
	f.adopted = map[uint32]bool{}
	for _, s := range firsts {
		f.adopted[s] = true
	}
	return f.rt.Adopt(firsts)
}

// contentHash identifies a policy by its content: JSON spells out what
// pointers point to (%+v would print their addresses, so identical policies
// looked different and were compiled again).
func contentHash(p *policy.EndpointPolicy) string {
	b, err := json.Marshal(p)
	if err != nil {
		panic(fmt.Sprintf("policy content: %v", err)) // plain data: cannot fail
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// Update translates the cluster's objects and binds each local pod's policy
// to the interface the node routes the pod's IP through.
func (f *policyFeed) Update(c k8s.Cluster) {
	res := k8s.Translate(c, f.node)
	// Each error is logged once while it lasts, not at every update.
	errs := map[string]bool{}
	for _, err := range res.Errors {
		errs[err.Error()] = true
		if !f.logged[err.Error()] {
			f.log.Error("NetworkPolicy not translated as written", "err", err)
		}
	}
	f.logged = errs
	f.mu.Lock()
	for _, s := range f.retired {
		f.rt.Remove(s)
	}
	f.retired = nil
	// IP sets go in before any program refers to them.
	f.ipsets.ClearDesired()
	for id, members := range res.IPSets {
		for _, m := range members {
			f.ipsets.SetDesired(gen.SluiceIpsetKey{Prefixlen: 32 + uint32(m.Bits()), SetId: gen.NetUint32(id), Addr: gen.NetAddr(m.Addr())}, gen.SluiceIpsetValue{})
		}
	}
	if _, err := f.ipsets.ApplyUpdatesOnly(); err != nil {
		f.log.Error("writing policy IP sets", "err", err)
	}
	f.result = res
	f.mu.Unlock()

	seen := map[string]bool{}
	for id, ep := range res.Endpoints {
		iface, err := ifacemgr.InterfaceForIP(f.netns, ep.IP)
		if err != nil {
			f.log.Warn("pod without a host interface yet", "pod", id, "err", err)
			continue
		}
		seen[id] = true
		f.ifaces.SetWorkloadEndpoint(ifacemgr.WorkloadEndpoint{ID: id, Iface: iface, IPs: nil,
			Policies: []string{contentHash(&ep.Ingress), contentHash(&ep.Egress)}})
	}
	for id := range f.bound {
		if !seen[id] {
			f.ifaces.RemoveWorkloadEndpoint(id)
		}
	}
	f.bound = seen
	f.mu.Lock()
	first := !f.synced
	f.synced = true
	f.mu.Unlock()
	if first {
		f.ifaces.PoliciesChanged() // every interface, with or without a pod
	}
	f.ifaces.Apply()
	f.mu.Lock()
	if _, err := f.ipsets.ApplyDeletionsOnly(); err != nil {
		f.log.Error("removing policy IP sets", "err", err)
	}
	f.mu.Unlock()
}

// Install implements ifacemgr.PolicyProvider.
func (f *policyFeed) Install(ifname string, ifindex int, ep *ifacemgr.Endpoint) (uint32, uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	in, out := uint32(ifacemgr.NoPolicy), uint32(ifacemgr.NoPolicy)
	if !f.synced {
		if prev, ok := f.slots[ifindex]; ok {
			return prev[0], prev[1], nil
		}
		return in, out, nil
	}
	if ep != nil && !ep.Host {
		e, ok := f.result.Endpoints[ep.ID]
		if ok {
			var err error
			prev := f.slots[ifindex]
			if in, err = f.slotFor(ep.ID+"/in", &e.Ingress, prev[0]); err != nil {
				return 0, 0, err
			}
			if out, err = f.slotFor(ep.ID+"/out", &e.Egress, prev[1]); err != nil {
				return 0, 0, err
			}
		}
	}
	f.release(ifindex, in, out)
	f.slots[ifindex] = [2]uint32{in, out}
	return in, out, nil
}

// slotFor returns the slot of an endpoint direction's compiled policy,
// compiling it when its content changed. prev is the slot the interface
// used: one adopted from the previous agent is kept if it holds the same
// code.
func (f *policyFeed) slotFor(name string, p *policy.EndpointPolicy, prev uint32) (uint32, error) {
	if len(p.Tiers) == 0 {
		return ifacemgr.NoPolicy, nil
	}
	key := name + "@" + contentHash(p)
	if s, ok := f.cache[key]; ok {
		return s, nil
	}
	if f.adopted[prev] {
		delete(f.adopted, prev)
		if f.rt.Matches(name, p, prev) {
			f.log.Info("policy kept from the running programs", "endpoint", name, "slot", prev)
			f.cache[key] = prev
			return prev, nil
		}
	}
	f.log.Info("policy compiled", "endpoint", name)
	s, err := f.rt.Install(name, p)
	if err != nil {
		return 0, err
	}
	f.cache[key] = s
	return s, nil
}

// release retires the slots an interface used before, unless still in use;
// they are freed at the next update, once the interface points elsewhere.
func (f *policyFeed) release(ifindex int, keep ...uint32) {
	for _, old := range f.slots[ifindex] {
		if old == ifacemgr.NoPolicy || old == keep[0] || old == keep[1] {
			continue
		}
		for k, s := range f.cache {
			if s == old {
				delete(f.cache, k)
			}
		}
		f.retired = append(f.retired, old)
	}
}

// Remove implements ifacemgr.PolicyProvider.
func (f *policyFeed) Remove(ifindex int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.release(ifindex, ifacemgr.NoPolicy, ifacemgr.NoPolicy)
	delete(f.slots, ifindex)
	return nil
}
