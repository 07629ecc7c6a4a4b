package ifacemgr

// Removing Sluice's attachments: those of interfaces that are gone, or all.

import (
	"errors"

	slmaps "github.com/sluice-net/sluice/maps"

	"github.com/sluice-net/sluice/gen"
)

// CleanupStale removes what belongs to interfaces that no longer exist:
// pins whose interface (by index and name) is gone, and interface-state
// entries of vanished ifindexes. It runs at start and periodically.
func (m *Manager) CleanupStale() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	pins, err := m.att.listPins()
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, p := range pins {
		st, ok := m.ifaces[p.ifindex]
		if ok && !st.gone && st.name == p.ifname {
			continue
		}
		if err := unpinLink(p.path); err != nil {
			return removed, err
		}
		removed++
	}
	if m.opts.IfState != nil {
		var stale []gen.SluiceIfstateKey
		err := m.opts.IfState.Iterate(func(k gen.SluiceIfstateKey, _ gen.SluiceIfstateValue) bool {
			if st, ok := m.ifaces[int(k.Ifindex)]; !ok || st.gone {
				stale = append(stale, k)
			}
			return true
		})
		if err != nil {
			return removed, err
		}
		for _, k := range stale {
			if err := m.opts.IfState.Delete(k); err != nil && !errors.Is(err, slmaps.ErrKeyNotExist) {
				return removed, err
			}
			removed++
		}
	}
	return removed, nil
}

// Cleanup removes everything the manager put on the machine: every attached
// program (its own only), every pin, every interface-state entry.
func (m *Manager) Cleanup() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	res := &ApplyResult{}
	for _, st := range m.ifaces {
		errs = append(errs, m.detachAll(st, st.name, res))
		if st.class != Ignored {
			errs = append(errs, m.forget(st))
		}
		st.ready = false
	}
	pins, err := m.att.listPins()
	errs = append(errs, err)
	for _, p := range pins {
		errs = append(errs, unpinLink(p.path))
	}
	if m.opts.IfState != nil {
		// Entries a previous run wrote, whatever this manager knows.
		var keys []gen.SluiceIfstateKey
		errs = append(errs, m.opts.IfState.Iterate(func(k gen.SluiceIfstateKey, _ gen.SluiceIfstateValue) bool {
			keys = append(keys, k)
			return true
		}))
		for _, k := range keys {
			if err := m.opts.IfState.Delete(k); err != nil && !errors.Is(err, slmaps.ErrKeyNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
