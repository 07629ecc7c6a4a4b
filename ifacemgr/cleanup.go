package ifacemgr

// Removing Sluice's attachments: those of interfaces that are gone, or all.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

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

// CleanupNode removes everything Sluice put on the node whose pins are in pinDir:
// TC and XDP programs of the namespace netns ("" for the current one), socket
// LB programs, maps and pins. It only ever removes Sluice's own objects (pins
// named sl_* and cgroup_*, the links folder), refuses a pinDir that is not a
// directory on a bpffs, and removes pinDir itself only when it held Sluice's
// pins. A missing pinDir is nothing to clean. Leftovers tells what is left.
func CleanupNode(pinDir, netns string) error {
	if _, err := os.Stat(pinDir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := slmaps.CheckPinDir(pinDir); err != nil {
		return err
	}
	had := len(Leftovers(pinDir)) > 0
	var errs []error
	set, err := slmaps.Open(slmaps.OpenOptions{PinDir: pinDir, NoCreate: true})
	var ifstate *slmaps.Map[gen.SluiceIfstateKey, gen.SluiceIfstateValue]
	if err == nil {
		ifstate, _ = slmaps.IfState.In(set)
	}
	m, merr := New(Options{Netns: netns, PinDir: filepath.Join(pinDir, "links"), IfState: ifstate,
		Classifier: Classifier{DataIfaces: regexp.MustCompile(`^$`)}})
	if merr == nil {
		errs = append(errs, m.Cleanup())
		m.Close()
	} else {
		errs = append(errs, merr)
	}
	errs = append(errs, RemoveSocketLB(pinDir))
	if err == nil {
		errs = append(errs, set.Unpin())
		set.Close()
	}
	// Whatever is still pinned under Sluice's names — pins of another layout,
	// same-named maps of another size the set could not open, links of
	// interfaces that are gone — goes too.
	for _, path := range Leftovers(pinDir) {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if had {
		_ = os.Remove(filepath.Join(pinDir, "links"))
		_ = os.Remove(pinDir) // only when empty: other owners' pins stay
	}
	if left := Leftovers(pinDir); len(left) > 0 {
		errs = append(errs, fmt.Errorf("cleanup of %s left %s", pinDir, strings.Join(left, ", ")))
	}
	return errors.Join(errs...)
}

// Leftovers lists the paths of Sluice's pins under pinDir: maps (sl_*, and
// migrating-sl_* left by a failed migration), socket-LB links (cgroup_*) and
// TC/XDP link pins (links/*).
func Leftovers(pinDir string) []string {
	var left []string
	entries, _ := os.ReadDir(pinDir)
	for _, e := range entries {
		if name := e.Name(); !e.IsDir() && (strings.HasPrefix(name, slmaps.NamePrefix) || strings.HasPrefix(name, "cgroup_") ||
			strings.HasPrefix(name, slmaps.MigratingPrefix)) {
			left = append(left, filepath.Join(pinDir, name))
		}
	}
	links, _ := os.ReadDir(filepath.Join(pinDir, "links"))
	for _, e := range links {
		left = append(left, filepath.Join(pinDir, "links", e.Name()))
	}
	return left
}
