package nat

// Session affinity entries: sweeping those expired or pointing at what is gone.

import (
	"errors"
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
		backends []gen.SluiceBeValue
	}
	live := map[uint32]svcInfo{}
	for _, p := range s.services {
		for _, id := range p.ids {
			live[id] = svcInfo{time.Duration(p.svc.AffinityTimeout) * time.Second, p.backends[id]}
		}
	}
	now := s.opts.Clock()
	everything := all || s.affinityDirty[0]
	var stale []gen.SluiceAffKey
	err := s.aff.Iterate(func(k gen.SluiceAffKey, v gen.SluiceAffValue) bool {
		if !everything && !s.affinityDirty[k.SvcId] {
			return true
		}
		info, ok := live[k.SvcId]
		switch {
		case !ok || info.timeout == 0,
			now-time.Duration(v.Ts) >= info.timeout,
			!slices.ContainsFunc(info.backends, func(b gen.SluiceBeValue) bool { return b.Addr == v.Addr && b.Port == v.Port }):
			stale = append(stale, k)
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, k := range stale {
		if err := s.aff.Delete(k); err != nil && !errors.Is(err, maps.ErrKeyNotExist) {
			return n, err
		}
		n++
	}
	clear(s.affinityDirty)
	return n, nil
}
