package nat

// Session affinity entries: sweeping those expired or pointing at what is gone.

import (
	"errors"
	"net/netip"
	"slices"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// CleanAffinity removes affinity entries that are expired or whose service or
// backend is gone. Apply calls it after changes to services with affinity; call
// it periodically too, so expired entries do not linger.
func (s *Syncer) CleanAffinity() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cleanAffinity(true)
}

func (s *Syncer) cleanAffinity(all bool) (int, error) {
	type svcInfo struct {
		timeout  time.Duration
		backends []gen.SluiceBe6Value
	}
	live := map[uint32]svcInfo{}
	for _, p := range s.services {
		for _, set := range p.sets {
			live[set.id] = svcInfo{time.Duration(p.svc.AffinityTimeout) * time.Second, set.list}
		}
	}
	now := s.opts.Clock()
	everything := all || s.affinityDirty[0]
	// stale tells whether an entry of service id, chosen at ts for backend,
	// is to go.
	stale := func(id uint32, ts uint64, backend netip.AddrPort) bool {
		if !everything && !s.affinityDirty[id] {
			return false
		}
		info, ok := live[id]
		return !ok || info.timeout == 0 || now-time.Duration(ts) >= info.timeout ||
			!slices.ContainsFunc(info.backends, func(b gen.SluiceBe6Value) bool { return backendAddr(b) == backend })
	}
	n4, err := sweep(s.aff, func(k gen.SluiceAffKey, v gen.SluiceAffValue) bool {
		return stale(k.SvcId, v.Ts, netip.AddrPortFrom(gen.AddrFromNet(v.Addr), gen.PortFromNet(v.Port)))
	})
	if err != nil {
		return n4, err
	}
	n6, err := sweep(s.aff6, func(k gen.SluiceAff6Key, v gen.SluiceAff6Value) bool {
		return stale(k.SvcId, v.Ts, netip.AddrPortFrom(gen.AddrFromNet6(v.Addr), gen.PortFromNet(v.Port)))
	})
	if err != nil {
		return n4 + n6, err
	}
	clear(s.affinityDirty)
	return n4 + n6, nil
}

// sweep deletes the entries of m that stale picks, and counts them.
func sweep[K comparable, V any](m *maps.Map[K, V], stale func(K, V) bool) (int, error) {
	var gone []K
	err := m.Iterate(func(k K, v V) bool {
		if stale(k, v) {
			gone = append(gone, k)
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, k := range gone {
		if err := m.Delete(k); err != nil && !errors.Is(err, maps.ErrKeyNotExist) {
			return n, err
		}
		n++
	}
	return n, nil
}
