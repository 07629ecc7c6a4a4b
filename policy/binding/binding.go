package binding

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/policy"
	"github.com/sluice-net/sluice/policy/k8s"
)

// Options configures a Binder.
type Options struct {
	// Maps holds the program array, IP sets, rule counters and interface
	// state (maps.Open).
	Maps *maps.Set
	// Verdict is the datapath's verdict program (gen: SlPolicyVerdict).
	Verdict *ebpf.Program
	// Node is this node's name: only its pods' policies are compiled.
	Node string
	Log  *slog.Logger
}

// Stats count what the Binder did with policies since it started.
type Stats struct {
	Compiled int // policies compiled and loaded
	Kept     int // policies taken over from the programs of a previous process
	// Errors counts what the latest Update could not translate as written
	// (each error names its object; see k8s.Result.Errors).
	Errors int
}

// Binder keeps the policies of a node's pods installed. It is safe for
// concurrent use: Update runs on the policy source's goroutine, Slots and
// Release on the interface manager's.
type Binder struct {
	log     *slog.Logger
	node    string
	rt      *policy.Runtime
	ipsets  *maps.CachingMap[gen.SluiceIpsetKey, gen.SluiceIpsetValue]
	ipsets6 *maps.CachingMap[gen.SluiceIpset6Key, gen.SluiceIpsetValue]
	// translating: one Update translates at a time, with what the last
	// one kept (k8s.Translator).
	translating sync.Mutex
	translator  *k8s.Translator

	// hashes are the policies' Hashes by their tiers; an entry not asked
	// for since the Update before the last is forgotten.
	hashMu  sync.Mutex
	hashes  map[tiersKey]tiersHash
	updates uint64

	mu      sync.Mutex
	result  *k8s.Result
	slots   map[int][2]uint32 // ifindex -> ingress, egress slot in use
	cache   map[string]uint32 // endpoint/direction@content -> slot
	retired []uint32          // slots to free at the next Update
	adopted map[uint32]bool   // slots taken over, not yet matched
	synced  bool              // Update ran once
	logged  map[string]bool   // translation errors already logged
	stats   Stats
}

// New opens a Binder on the maps and takes over the slots the interfaces
// already point to.
func New(opts Options) (*Binder, error) {
	ipsets, err := maps.IPSets.In(opts.Maps)
	if err != nil {
		return nil, err
	}
	ipsets6, err := maps.IPSets6.In(opts.Maps)
	if err != nil {
		return nil, err
	}
	ifstate, err := maps.IfState.In(opts.Maps)
	if err != nil {
		return nil, err
	}
	rt, err := policy.NewRuntime(policy.Maps{Programs: opts.Maps.Map(maps.PolicyPrograms), IPSets: opts.Maps.Map(maps.IPSets.Name),
		RuleCounters: opts.Maps.Map(maps.RuleCtrs.Name), IPSets6: opts.Maps.Map(maps.IPSets6.Name),
		Scratch6: opts.Maps.Map(gen.SluiceMapSlScratch6V1)}, opts.Verdict, 0)
	if err != nil {
		return nil, err
	}
	b := &Binder{log: opts.Log, node: opts.Node, rt: rt, translator: k8s.NewTranslator(opts.Node), ipsets: maps.NewCachingMap(ipsets), ipsets6: maps.NewCachingMap(ipsets6),
		result: &k8s.Result{Endpoints: map[string]k8s.Endpoint{}}, slots: map[int][2]uint32{}, hashes: map[tiersKey]tiersHash{},
		cache: map[string]uint32{}, adopted: map[uint32]bool{}}
	if b.log == nil {
		b.log = slog.Default()
	}
	if err := b.ipsets.LoadDataplaneState(); err != nil {
		return nil, err
	}
	if err := b.ipsets6.LoadDataplaneState(); err != nil {
		return nil, err
	}
	var firsts []uint32
	err = ifstate.Iterate(func(k gen.SluiceIfstateKey, v gen.SluiceIfstateValue) bool {
		b.slots[int(k.Ifindex)] = [2]uint32{v.IngressPolicy, v.EgressPolicy}
		for _, s := range []uint32{v.IngressPolicy, v.EgressPolicy} {
			if s != policy.NoPolicy {
				firsts = append(firsts, s)
				b.adopted[s] = true
			}
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	if err := rt.Adopt(firsts); err != nil {
		return nil, err
	}
	return b, nil
}

// Hash is the package's Hash, kept for a policy's tiers while the
// translations hand over the same ones (k8s.Translator keeps an endpoint's
// translation while its inputs stand): hashing every local endpoint's
// policies at every change was a fourth of what a change cost. The tiers
// must not be changed afterwards (a translation's never are).
func (b *Binder) Hash(p *policy.EndpointPolicy) string {
	if len(p.Tiers) == 0 {
		return Hash(p)
	}
	key := tiersKey{&p.Tiers[0], len(p.Tiers)}
	b.hashMu.Lock()
	defer b.hashMu.Unlock()
	h, ok := b.hashes[key]
	if !ok {
		h.hash = Hash(p)
	}
	h.update = b.updates
	b.hashes[key] = h
	return h.hash
}

// tiersKey names a policy's tiers by where they are.
type tiersKey struct {
	first *policy.Tier
	n     int
}

type tiersHash struct {
	hash   string
	update uint64 // the last Update it was asked for after
}

// Hash identifies a policy by its content: identical policies hash alike
// (JSON spells out what pointers point to).
func Hash(p *policy.EndpointPolicy) string {
	data, err := json.Marshal(p)
	if err != nil {
		panic(fmt.Sprintf("policy content: %v", err)) // plain data: cannot fail
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:12])
}

// Update translates the cluster's objects for this node (objects given are
// not to be changed afterwards: see k8s.Translator), frees the slots
// retired since the last Update and writes the IP sets the policies use. It
// returns the local endpoints (by namespace/name), whose interfaces the
// caller binds, and whether this was the first Update: the caller then asks
// again for every interface's slots, since until now each kept its own.
// Call Finish once the interfaces point to their new slots.
func (b *Binder) Update(c k8s.Cluster) (endpoints map[string]k8s.Endpoint, first bool) {
	b.translating.Lock()
	res := b.translator.Translate(c)
	b.translating.Unlock()
	b.hashMu.Lock()
	b.updates++
	for k, h := range b.hashes {
		if h.update+1 < b.updates {
			delete(b.hashes, k)
		}
	}
	b.hashMu.Unlock()
	// Each error is logged once while it lasts, not at every update.
	errs := map[string]bool{}
	for _, err := range res.Errors {
		errs[err.Error()] = true
		if !b.logged[err.Error()] {
			b.log.Error("NetworkPolicy not translated as written", "err", err)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.logged = errs
	b.stats.Errors = len(errs)
	for _, s := range b.retired {
		b.rt.Remove(s)
	}
	b.retired = nil
	// IP sets go in before any program refers to them.
	b.ipsets.ClearDesired()
	b.ipsets6.ClearDesired()
	for id, members := range res.IPSets {
		for _, m := range members {
			if m.Addr().Is6() {
				b.ipsets6.SetDesired(gen.SluiceIpset6Key{Prefixlen: 32 + uint32(m.Bits()), SetId: gen.NetUint32(id), Addr: gen.NetAddr6(m.Addr())}, gen.SluiceIpsetValue{})
				continue
			}
			b.ipsets.SetDesired(gen.SluiceIpsetKey{Prefixlen: 32 + uint32(m.Bits()), SetId: gen.NetUint32(id), Addr: gen.NetAddr(m.Addr())}, gen.SluiceIpsetValue{})
		}
	}
	if _, err := b.ipsets.ApplyUpdatesOnly(); err != nil {
		b.log.Error("writing policy IP sets", "err", err)
	}
	if _, err := b.ipsets6.ApplyUpdatesOnly(); err != nil {
		b.log.Error("writing policy IPv6 IP sets", "err", err)
	}
	b.result = res
	first = !b.synced
	b.synced = true
	return res.Endpoints, first
}

// Finish removes the IP set members no policy uses any more; call it after
// the interfaces were given their slots following an Update.
func (b *Binder) Finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := b.ipsets.ApplyDeletionsOnly(); err != nil {
		b.log.Error("removing policy IP sets", "err", err)
	}
	if _, err := b.ipsets6.ApplyDeletionsOnly(); err != nil {
		b.log.Error("removing policy IPv6 IP sets", "err", err)
	}
}

// Has tells whether the last Update translated an endpoint id (a pod's
// "namespace/name", or k8s.HostEndpointID).
func (b *Binder) Has(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.result.Endpoints[id]
	return ok
}

// Slots returns the slots for the interface ifindex serving the endpoint id
// ("" for none: an interface without a pod or host endpoint), in the order of
// its sl_ifstate_v1 entry, compiling a policy whose content is new: for a
// pod its ingress and egress policy; for a host endpoint its egress and
// ingress (ifstate.h names slots from a workload's side: the first is judged
// where traffic leaves through the interface, the second where it enters).
// Before the first Update it returns what the interface already has.
func (b *Binder) Slots(ifindex int, id string) (in, out uint32, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	in, out = policy.NoPolicy, policy.NoPolicy
	if !b.synced {
		if prev, ok := b.slots[ifindex]; ok {
			return prev[0], prev[1], nil
		}
		return in, out, nil
	}
	if e, ok := b.result.Endpoints[id]; ok && id != "" {
		prev := b.slots[ifindex]
		if e.Interface != "" { // a host endpoint: by hook, egress first
			prev[0], prev[1] = prev[1], prev[0]
		}
		if in, err = b.slotFor(id+"/in", &e.Ingress, prev[0]); err != nil {
			return 0, 0, err
		}
		if out, err = b.slotFor(id+"/out", &e.Egress, prev[1]); err != nil {
			return 0, 0, err
		}
		if e.Interface != "" {
			in, out = out, in
		}
	}
	b.release(ifindex, in, out)
	b.slots[ifindex] = [2]uint32{in, out}
	return in, out, nil
}

// Release forgets an interface that is gone; its slots are freed at the next
// Update.
func (b *Binder) Release(ifindex int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.release(ifindex, policy.NoPolicy, policy.NoPolicy)
	delete(b.slots, ifindex)
}

// Rule names a rule id of the last Update's translation for people; false
// for an id it does not know (a rule of a policy since removed).
func (b *Binder) Rule(id uint32) (k8s.RuleInfo, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.result.Rules[id]
	return r, ok
}

// Stats reports what the Binder did so far.
func (b *Binder) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

// slotFor returns the slot of an endpoint direction's policy, compiling it
// when its content is new. prev is the slot the interface used: one taken
// over from a previous process is kept if it holds the same code.
func (b *Binder) slotFor(name string, p *policy.EndpointPolicy, prev uint32) (uint32, error) {
	if len(p.Tiers) == 0 {
		return policy.NoPolicy, nil
	}
	key := name + "@" + b.Hash(p)
	if s, ok := b.cache[key]; ok {
		return s, nil
	}
	if b.adopted[prev] {
		delete(b.adopted, prev)
		if b.rt.Matches(name, p, prev) {
			b.log.Info("policy kept from the running programs", "endpoint", name, "slot", prev)
			b.cache[key] = prev
			b.stats.Kept++
			return prev, nil
		}
	}
	b.log.Info("policy compiled", "endpoint", name)
	s, err := b.rt.Install(name, p)
	if err != nil {
		return 0, err
	}
	b.cache[key] = s
	b.stats.Compiled++
	return s, nil
}

// release retires the slots an interface used before, unless kept; they are
// freed at the next Update, once the interface points elsewhere.
func (b *Binder) release(ifindex int, keepIn, keepOut uint32) {
	for _, old := range b.slots[ifindex] {
		if old == policy.NoPolicy || old == keepIn || old == keepOut {
			continue
		}
		for k, s := range b.cache {
			if s == old {
				delete(b.cache, k)
			}
		}
		b.retired = append(b.retired, old)
	}
}
