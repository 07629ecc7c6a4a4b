package maps

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
)

// Migration moves the entries of a pinned map that the running programs
// still use into the map this build wants, so that an upgrade or a resize
// keeps every connection: a same-named pin of another capacity (a conntrack
// table sized anew), or the pin of an older layout this build can convert
// (see Upgrades).
//
// Open (with OpenOptions.Migrate) copies the entries into a new map and pins
// it in place of the old one, atomically (a rename on bpffs). The old map
// stays open: the programs attached before keep writing to it until the new
// ones replace them. Set.FinishMigrations then copies what they added
// meanwhile and lets the old map go. Until then, the new programs find the
// flows only the old conntrack table holds through a bridge
// (previousTables): the hooks change programs one at a time, and a packet of
// a flow the old programs started after Open would otherwise meet a program
// that knows nothing of it.
type Migration struct {
	From, To                 string // map names; equal for a new capacity
	FromCapacity, ToCapacity uint32
	Copied                   int // entries copied at Open
	Added                    int // entries added by FinishMigrations

	old, new *ebpf.Map
	convert  Convert
}

// MigratingPrefix names a new map's pin while a migration moves it into place
// (bpffs names may not hold a dot). One is left only by a start that failed
// there; cleanup removes it.
const MigratingPrefix = "migrating-"

// Convert returns the entry of the new layout for one of the old, or false
// to leave it out. Nil keeps the bytes as they are.
type Convert func(key, value []byte) (newKey, newValue []byte, keep bool)

// Upgrade is an older layout of a catalogue map that Open can migrate.
type Upgrade struct {
	// From is the older map as it was pinned: name, type, key and value
	// sizes (its capacity may be any).
	From ebpf.MapSpec
	// To is the catalogue map it becomes.
	To      string
	Convert Convert
}

// Upgrades are the older layouts Open migrates instead of refusing them.
var Upgrades = []Upgrade{
	// v1 was an LRU hash with the same entries; v2 is a plain hash, so that
	// a full table refuses new flows rather than evict established ones.
	{From: ebpf.MapSpec{Name: "sl_ct_v1", Type: ebpf.LRUHash, KeySize: 16, ValueSize: 56}, To: gen.SluiceMapSlCtV2},
}

// CanUpgrade tells whether a stale pin (StalePins) is an older layout Open
// migrates when asked to (OpenOptions.Migrate).
func CanUpgrade(name string) bool {
	return slices.ContainsFunc(Upgrades, func(u Upgrade) bool { return u.From.Name == name })
}

// migratable tells whether a map's entries can be copied into another of
// another capacity: hash maps and LPM tries (arrays are sized by their
// index, program arrays hold programs).
func migratable(t ebpf.MapType) bool {
	switch t {
	case ebpf.Hash, ebpf.LRUHash, ebpf.LPMTrie:
		return true
	}
	return false
}

// openMigrating opens the map of spec like OpenPinned, but migrates a pin of
// another capacity, or of an older layout listed in Upgrades, instead of
// refusing it. It returns the migration, or nil when there was none.
func openMigrating(dir string, spec *ebpf.MapSpec) (*ebpf.Map, *Migration, error) {
	path := filepath.Join(dir, spec.Name)
	pinned, err := ebpf.LoadPinnedMap(path, nil)
	switch {
	case err == nil:
		if checkPinned(pinned, spec, path) == nil {
			return pinned, nil, nil
		}
		if !migratable(spec.Type) || pinned.Type() != spec.Type || pinned.KeySize() != spec.KeySize ||
			pinned.ValueSize() != spec.ValueSize || ownFlags(pinned) != spec.Flags {
			pinned.Close()
			m, err := OpenPinned(dir, spec) // the layout error, named
			return m, nil, err
		}
		mig := &Migration{From: spec.Name, To: spec.Name, old: pinned}
		return migrate(dir, spec, mig, path)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, nil, fmt.Errorf("map %s: open pin %s: %w", spec.Name, path, err)
	}
	for _, up := range Upgrades {
		if up.To != spec.Name {
			continue
		}
		oldPath := filepath.Join(dir, up.From.Name)
		old, err := ebpf.LoadPinnedMap(oldPath, nil)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("map %s: open pin %s: %w", up.From.Name, oldPath, err)
		}
		if old.Type() != up.From.Type || old.KeySize() != up.From.KeySize || old.ValueSize() != up.From.ValueSize {
			old.Close()
			return nil, nil, fmt.Errorf("map %s pinned at %s is not the layout this build can upgrade (%v, key %d, value %d bytes); remove it with sluice cleanup",
				up.From.Name, oldPath, old.Type(), old.KeySize(), old.ValueSize())
		}
		mig := &Migration{From: up.From.Name, To: spec.Name, old: old, convert: up.Convert}
		return migrate(dir, spec, mig, oldPath)
	}
	m, err := OpenPinned(dir, spec)
	return m, nil, err
}

// migrate creates the map of spec, copies mig.old's entries into it and pins
// it at spec's path; a migration of an older layout then removes oldPath.
// On error the old pin is left as it was.
func migrate(dir string, spec *ebpf.MapSpec, mig *Migration, oldPath string) (*ebpf.Map, *Migration, error) {
	fail := func(err error) (*ebpf.Map, *Migration, error) {
		mig.old.Close()
		if mig.new != nil {
			mig.new.Close()
		}
		return nil, nil, fmt.Errorf("map %s: migrate from %s: %w", spec.Name, mig.From, err)
	}
	fresh := spec.Copy()
	fresh.Pinning = ebpf.PinNone
	var err error
	if mig.new, err = ebpf.NewMap(fresh); err != nil {
		return fail(err)
	}
	mig.FromCapacity, mig.ToCapacity = mig.old.MaxEntries(), spec.MaxEntries
	if mig.Copied, err = copyEntries(mig, ebpf.UpdateAny); err != nil {
		return fail(err)
	}
	path := filepath.Join(dir, spec.Name)
	tmp := filepath.Join(dir, MigratingPrefix+spec.Name)
	_ = os.Remove(tmp) // left by a start that failed here
	if err := mig.new.Pin(tmp); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fail(err)
	}
	// The handle remembers the temporary path: take the map again from its
	// pin, so that Unpin and RepairPins see where it is.
	reopened, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return fail(err)
	}
	mig.new.Close()
	mig.new = reopened
	if oldPath != path {
		if err := os.Remove(oldPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fail(err)
		}
	}
	return mig.new, mig, nil
}

// copyEntries copies (converting) every entry of mig.old into mig.new with
// the given update flag; with UpdateNoExist, entries already there are kept.
func copyEntries(mig *Migration, flag ebpf.MapUpdateFlags) (int, error) {
	key := make([]byte, mig.old.KeySize())
	value := make([]byte, mig.old.ValueSize())
	n := 0
	it := mig.old.Iterate()
	for it.Next(&key, &value) {
		k, v, keep := key, value, true
		if mig.convert != nil {
			k, v, keep = mig.convert(key, value)
		}
		if !keep {
			continue
		}
		err := mig.new.Update(k, v, flag)
		if errors.Is(err, ebpf.ErrKeyExist) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("%d entries do not fit in %d: %w", mig.old.MaxEntries(), mig.new.MaxEntries(), err)
		}
		n++
	}
	return n, it.Err()
}

// previousTables names, for a map whose resize the datapath bridges, the
// map-in-map whose slot 0 holds the old table while the migration runs
// (sl_ctprev_v1 in bpf/include/conntrack.h): the new programs look a flow up
// there when their own table misses it, so that a flow the old programs
// started after Open copied the table keeps its translation from the first
// packet the new programs see. A bridge needs the old table's layout to be
// the new one's: an Upgrade of layout has none.
var previousTables = map[string]string{
	gen.SluiceMapSlCtV2:  gen.SluiceMapSlCtprevV1,
	gen.SluiceMapSlCt6V1: gen.SluiceMapSlCtprev6V1,
}

// servePrevious puts the old table of each migration that has a bridge into
// the bridge's slot 0, and empties the other bridges: one left by an agent
// that stopped before FinishMigrations would keep its table alive, and its
// entries would come back.
func (s *Set) servePrevious() error {
	for name, bridge := range previousTables {
		b := s.maps[bridge]
		if b == nil {
			continue
		}
		i := slices.IndexFunc(s.migrations, func(m *Migration) bool { return m.To == name && m.From == name && m.old != nil })
		if i < 0 {
			if err := b.Delete(uint32(0)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("map %s: empty slot 0: %w", bridge, err)
			}
			continue
		}
		if err := b.Put(uint32(0), s.migrations[i].old); err != nil {
			return fmt.Errorf("map %s: put the %s being migrated in slot 0: %w", bridge, name, err)
		}
	}
	return nil
}

// Migrations are the migrations Open made.
func (s *Set) Migrations() []*Migration { return s.migrations }

// FinishMigrations copies the entries the old programs added to the old maps
// since Open (call it once the new programs are attached; entries already in
// the new maps are kept), takes the old conntrack tables out of the
// datapath's reach (previousTables) and closes the old maps.
func (s *Set) FinishMigrations() error {
	var errs []error
	for _, mig := range s.migrations {
		if mig.old == nil {
			continue
		}
		n, err := copyEntries(mig, ebpf.UpdateNoExist)
		mig.Added = n
		if err != nil {
			errs = append(errs, fmt.Errorf("map %s: finish migration from %s: %w", mig.To, mig.From, err))
		}
		// Only now: until the copy ends, the new programs may still meet
		// a flow that only the old table holds.
		if bridge := s.maps[previousTables[mig.To]]; bridge != nil && mig.From == mig.To {
			if err := bridge.Delete(uint32(0)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("map %s: empty slot 0: %w", previousTables[mig.To], err))
			}
		}
		mig.old.Close()
		mig.old = nil
	}
	return errors.Join(errs...)
}
