package nat

// Writing plans into the maps, in an order no packet sees half done.

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// install replaces a service's old plan by p (nil: the service is gone) in the
// desired state, and returns errors for frontends another service owns.
func (s *Syncer) install(name ServicePortName, old, p *plan, stats *Stats) []error {
	var errs []error
	if old == nil {
		old = &plan{}
	}
	newFE := map[gen.SluiceFe6Key]gen.SluiceFeValue{}
	if p != nil {
		for _, f := range p.frontends {
			k, v := f.key, f.val
			if owner, ok := s.feOwner[k]; ok && owner != name {
				if older(p.svc, name, s.services[owner], owner) {
					// This one takes it; the owner is planned again
					// without it, and reports the conflict then.
					s.replan[owner] = true
				} else {
					errs = append(errs, fmt.Errorf("frontend %v/%d claimed by services %s and %s: %s is older and has it",
						netip.AddrPortFrom(gen.AddrFromNet6(k.Addr).Unmap(), gen.PortFromNet(k.Port)), k.Proto, owner, name, owner))
					s.wait(k, name)
					continue
				}
			}
			newFE[k] = v
		}
	}
	for _, f := range old.frontends {
		k := f.key
		if _, keep := newFE[k]; !keep && s.feOwner[k] == name {
			s.fe.DeleteDesired(k)
			delete(s.feOwner, k)
			for w := range s.feWaiting[k] {
				s.replan[w] = true // a service that claimed it may have it now
			}
			delete(s.feWaiting, k)
		}
	}
	for k, v := range newFE {
		s.fe.SetDesired(k, v)
		s.feOwner[k] = name
		if w := s.feWaiting[k]; w != nil {
			delete(w, name)
		}
	}

	udp := old.svc != nil && old.svc.Protocol == UDP
	affinity := (old.svc != nil && old.svc.AffinityTimeout > 0) || (p != nil && p.svc.AffinityTimeout > 0)
	for _, set := range old.sets {
		id, list := set.id, set.list
		nl, kept := p.backends(id)
		for i := len(nl); i < len(list); i++ {
			s.be.DeleteDesired(gen.SluiceBeKey{SvcId: id, Ordinal: uint32(i)})
		}
		if udp {
			for _, b := range list {
				if !slices.ContainsFunc(nl, func(n gen.SluiceBe6Value) bool { return n.Addr == b.Addr && n.Port == b.Port }) {
					stats.StaleUDP = append(stats.StaleUDP, StaleBackend{ServiceID: id, Backend: backendAddr(b)})
				}
			}
		}
		if affinity && !slices.Equal(list, nl) {
			s.affinityDirty[id] = true
		}
		if !kept {
			s.ids.release(idKey{name: name, node: set.node}, id)
			s.names.DeleteDesired(gen.SluiceSvcnameKey{SvcId: id})
		}
	}
	if p != nil {
		for _, set := range p.sets {
			for i, v := range set.list {
				s.be.SetDesired(gen.SluiceBeKey{SvcId: set.id, Ordinal: uint32(i)}, v)
			}
		}
	}
	if s.maglev != nil {
		for id := range old.maglev {
			s.maglev.set(id, nil)
		}
		if p != nil {
			for id, t := range p.maglev {
				s.maglev.set(id, t)
			}
		}
	}
	if p != nil {
		for _, set := range p.sets {
			label := name.String()
			if set.node.IsValid() {
				label += " @" + set.node.String()
			}
			s.names.SetDesired(gen.SluiceSvcnameKey{SvcId: set.id}, svcName(label))
		}
	}

	var newSrc []gen.SluiceSrcrange6Key
	var newIPs []netip.Addr
	if p != nil {
		newSrc, newIPs = p.srcRanges, p.ips
	}
	for _, k := range old.srcRanges {
		if !slices.Contains(newSrc, k) {
			s.src.DeleteDesired(k)
		}
	}
	for _, k := range newSrc {
		s.src.SetDesired(k, gen.SluiceSrcrangeValue{})
	}
	for _, ip := range old.ips {
		s.unrefIP(ip)
	}
	for _, ip := range newIPs {
		s.refIP(ip)
	}
	if old.svc != nil {
		s.unrefClusterIP(old.svc.ClusterIP)
	}
	if p != nil {
		s.refClusterIP(p.svc.ClusterIP)
	}

	if p == nil {
		delete(s.services, name)
	} else {
		// What it has: a frontend another service keeps is not its own.
		p.frontends = slices.DeleteFunc(p.frontends, func(f frontend) bool { _, ok := newFE[f.key]; return !ok })
		s.services[name] = p
	}
	return errs
}

// older tells whether service a (named an) was created before b: the one that
// keeps a frontend both claim. Equal times (or none, as in manifests) fall
// back to namespace, name and port, in that order.
func older(a *ServicePort, an ServicePortName, bp *plan, bn ServicePortName) bool {
	if bp == nil || bp.svc == nil {
		return true
	}
	if !a.Created.Equal(bp.svc.Created) {
		return a.Created.Before(bp.svc.Created)
	}
	return cmp.Or(cmp.Compare(an.Namespace, bn.Namespace), cmp.Compare(an.Name, bn.Name), cmp.Compare(an.Port, bn.Port)) < 0
}

// wait records that a service claims a frontend another one has.
func (s *Syncer) wait(k gen.SluiceFe6Key, name ServicePortName) {
	if s.feWaiting[k] == nil {
		s.feWaiting[k] = map[ServicePortName]bool{}
	}
	s.feWaiting[k][name] = true
}

func noMaglev() (maps.ApplyStats, error) { return maps.ApplyStats{}, nil }

func svcName(s string) gen.SluiceSvcnameValue {
	var v gen.SluiceSvcnameValue
	gen.PutCString(v.Name[:], s)
	return v
}

// Service IPs are marked with an ICMP (ICMPv6) frontend so the datapath
// answers echo requests to them; several service ports share one IP.
func markerKey(ip netip.Addr) gen.SluiceFe6Key {
	proto := uint8(protoICMP)
	if ip.Is6() {
		proto = protoICMPv6
	}
	return gen.SluiceFe6Key{Addr: gen.NetAddr6(ip), Proto: proto}
}

func (s *Syncer) refIP(ip netip.Addr) {
	s.ipRefs[ip]++
	if s.ipRefs[ip] == 1 {
		s.fe.SetDesired(markerKey(ip), gen.SluiceFeValue{})
	}
}

func (s *Syncer) unrefIP(ip netip.Addr) {
	s.ipRefs[ip]--
	if s.ipRefs[ip] <= 0 {
		delete(s.ipRefs, ip)
		s.fe.DeleteDesired(markerKey(ip))
	}
}

func (s *Syncer) setHostIPs(ips []netip.Addr) {
	want := map[gen.SluiceHostip6Key]bool{}
	for _, ip := range ips {
		k := gen.SluiceHostip6Key{Addr: gen.NetAddr6(ip)}
		want[k] = true
		s.hostIPs.SetDesired(k, gen.SluiceHostipValue{})
	}
	var gone []gen.SluiceHostip6Key
	s.hostIPs.IterDataplane(func(k gen.SluiceHostip6Key, _ gen.SluiceHostipValue) bool {
		if !want[k] {
			gone = append(gone, k)
		}
		return true
	})
	for _, k := range gone {
		s.hostIPs.DeleteDesired(k)
	}
}

// write applies the desired state in the order that never exposes a half
// state: frontend deletions, backend (source range, Maglev table) updates,
// frontend updates, backend (source range) deletions. Maglev tables go
// early, as their comments say.
func (s *Syncer) write(stats *Stats) error {
	maglevUpdates, maglevDeletions := noMaglev, noMaglev
	if s.maglev != nil {
		maglevUpdates = func() (maps.ApplyStats, error) {
			n, err := s.maglev.applyUpdates()
			return maps.ApplyStats{Writes: n}, err
		}
		maglevDeletions = func() (maps.ApplyStats, error) {
			n, err := s.maglev.applyDeletions()
			return maps.ApplyStats{Deletes: n}, err
		}
	}
	// A step that cannot hurt a packet when it fails (soft) is reported in
	// stats.Degraded and the rest goes on: a Maglev table missing or old
	// only makes its service pick at random.
	steps := []struct {
		what  string
		apply func() (maps.ApplyStats, error)
		soft  bool
	}{
		{"frontend deletions", s.fe.ApplyDeletionsOnly, false},
		// Before any is written, so a table gone makes room for another:
		// a service id with no table wanted has no frontend left, or none
		// that picks by it.
		{"maglev table deletions", maglevDeletions, true},
		{"source range updates", s.src.ApplyUpdatesOnly, false},
		{"backend updates", s.be.ApplyUpdatesOnly, false},
		// After its backends, so a table's ordinals are written: a table
		// is only a moment older than its backends, never newer.
		{"maglev table updates", maglevUpdates, true},
		{"service name updates", s.names.ApplyUpdatesOnly, false},
		{"frontend updates", s.fe.ApplyUpdatesOnly, false},
		// After the frontends: a new ClusterIP is refused on its
		// undefined ports only once its defined ones are served.
		{"service network updates", s.svcnet.ApplyUpdatesOnly, false},
		{"backend deletions", s.be.ApplyDeletionsOnly, false},
		{"source range deletions", s.src.ApplyDeletionsOnly, false},
		{"service name deletions", s.names.ApplyDeletionsOnly, false},
		{"service network deletions", s.svcnet.ApplyDeletionsOnly, false},
		{"host IPs", s.hostIPs.ApplyAll, false},
	}
	for _, step := range steps {
		st, err := step.apply()
		stats.Writes += st.Writes
		stats.Deletes += st.Deletes
		if err != nil {
			var full *maps.FullError
			if errors.As(err, &full) {
				stats.FullMaps = append(stats.FullMaps, full.Map)
			}
			if step.soft {
				stats.Degraded = append(stats.Degraded, fmt.Errorf("nat syncer: %s: %w", step.what, err))
				continue
			}
			// Stop here: later steps would point frontends at backends that
			// were not written. The pending entries are retried next Apply.
			return fmt.Errorf("nat syncer: %s: %w", step.what, err)
		}
	}
	return nil
}
