package maps_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

func ctEntry(i int) (gen.SluiceCtKey, gen.SluiceCtValue) {
	return gen.SluiceCtKey{Saddr: uint32(i + 1), Proto: 6}, gen.SluiceCtValue{Created: uint64(i), SvcId: 7, Type: gen.SluiceCtTypeCT_FORWARD}
}

func ctOf(t *testing.T, s *maps.Set) *maps.Map[gen.SluiceCtKey, gen.SluiceCtValue] {
	t.Helper()
	ct, err := maps.Conntrack.In(s)
	if err != nil {
		t.Fatal(err)
	}
	return ct
}

// A conntrack table sized anew keeps its flows: the entries move into the new
// map, which takes the pin's place; what the old programs add until the new
// ones replace them is copied when the migration finishes.
func TestOpenMigratesANewCapacity(t *testing.T) {
	dir := bpftest.PinDir(t)
	size := func(n uint32) map[string]uint32 { return map[string]uint32{maps.Conntrack.Name: n} }
	running, err := maps.Open(maps.OpenOptions{PinDir: dir, Capacity: size(64)})
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	for i := range 40 {
		k, v := ctEntry(i)
		if err := ctOf(t, running).Put(k, v, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}

	// Smaller than what it holds: refused, and the pin is left as it was.
	if _, err := maps.Open(maps.OpenOptions{PinDir: dir, Capacity: size(16), Migrate: true}); err == nil ||
		!strings.Contains(err.Error(), maps.Conntrack.Name) || !strings.Contains(err.Error(), "do not fit") {
		t.Fatalf("shrinking below the entries held: %v", err)
	}
	pinned := func() uint32 {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, maps.Conntrack.Name), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		return m.MaxEntries()
	}
	if c := pinned(); c != 64 {
		t.Fatalf("the pin holds a map of %d entries after a refused migration, want the old 64", c)
	}

	next, err := maps.Open(maps.OpenOptions{PinDir: dir, Capacity: size(128), Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	migs := next.Migrations()
	if len(migs) != 1 || migs[0].To != maps.Conntrack.Name || migs[0].FromCapacity != 64 || migs[0].ToCapacity != 128 || migs[0].Copied != 40 {
		t.Fatalf("migrations %+v", migs)
	}
	if ctOf(t, next).MaxEntries() != 128 {
		t.Fatal("the new map has the old capacity")
	}
	// The old programs still write to the old map.
	k, v := ctEntry(40)
	if err := ctOf(t, running).Put(k, v, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	// Until the finish, the datapath reaches the old table through the
	// bridge (previousTables).
	bridge := next.Map(gen.SluiceMapSlCtprevV1)
	oldInfo, err := running.Map(maps.Conntrack.Name).Info()
	if err != nil {
		t.Fatal(err)
	}
	oldID, _ := oldInfo.ID()
	var held uint32
	if err := bridge.Lookup(uint32(0), &held); err != nil || ebpf.MapID(held) != oldID {
		t.Fatalf("bridge slot 0 holds map %d (%v), want the old table %d", held, err, oldID)
	}
	if err := next.FinishMigrations(); err != nil {
		t.Fatal(err)
	}
	if err := bridge.Lookup(uint32(0), &held); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("bridge slot 0 after the finish: map %d, %v; want it empty", held, err)
	}
	// A bridge left full by an agent that stopped mid-migration is emptied
	// by the next one's Open.
	if err := bridge.Put(uint32(0), running.Map(maps.Conntrack.Name)); err != nil {
		t.Fatal(err)
	}
	again, err := maps.Open(maps.OpenOptions{PinDir: dir, Capacity: size(128), Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if len(again.Migrations()) != 0 {
		t.Fatalf("migrations %+v on an Open of the same sizes", again.Migrations())
	}
	if err := bridge.Lookup(uint32(0), &held); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("a stale bridge after Open: map %d, %v; want it empty", held, err)
	}
	if migs[0].Added != 1 {
		t.Fatalf("added %d entries at the finish, want 1", migs[0].Added)
	}
	for i := range 41 {
		k, want := ctEntry(i)
		if got, err := ctOf(t, next).Get(k); err != nil || got != want {
			t.Fatalf("entry %d after the migration: %+v %v", i, got, err)
		}
	}
	// The pin is the new map, and unpinning removes it.
	if c := pinned(); c != 128 {
		t.Fatalf("the pin holds a map of %d entries, want the new 128", c)
	}
	if _, err := os.Stat(filepath.Join(dir, "migrating-"+maps.Conntrack.Name)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary pin left: %v", err)
	}
	if err := next.Unpin(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, maps.Conntrack.Name)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("unpin left the migrated map's pin: %v", err)
	}
}

// A conntrack table of the older layout (sl_ct_v1, an LRU hash) is upgraded:
// its flows move into sl_ct_v2 and its pin goes, so no cleanup is needed.
func TestOpenUpgradesConntrackV1(t *testing.T) {
	dir := bpftest.PinDir(t)
	v1, err := ebpf.NewMap(&ebpf.MapSpec{Name: "sl_ct_v1", Type: ebpf.LRUHash, KeySize: 16, ValueSize: 56, MaxEntries: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer v1.Close()
	if err := v1.Pin(filepath.Join(dir, "sl_ct_v1")); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		k, v := ctEntry(i)
		if err := v1.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if stale, _ := maps.StalePins(dir); len(stale) != 1 {
		t.Fatalf("stale pins before: %v", stale)
	}
	set, err := maps.Open(maps.OpenOptions{PinDir: dir, Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	if migs := set.Migrations(); len(migs) != 1 || migs[0].From != "sl_ct_v1" || migs[0].Copied != 10 {
		t.Fatalf("migrations %+v", migs)
	}
	for i := range 10 {
		k, want := ctEntry(i)
		if got, err := ctOf(t, set).Get(k); err != nil || got != want {
			t.Fatalf("entry %d after the upgrade: %+v %v", i, got, err)
		}
	}
	if stale, _ := maps.StalePins(dir); len(stale) != 0 {
		t.Fatalf("stale pins after the upgrade: %v", stale)
	}
	if err := set.FinishMigrations(); err != nil {
		t.Fatal(err)
	}
}

// A node that gains IPv6 gets full-size IPv6 tables at the agent's next
// start, their entries migrated: every map IPv6MinimalCapacity shrank is
// sized anew, and a flow its conntrack table held is still there.
func TestMinimalIPv6TablesGrowWithTheirEntries(t *testing.T) {
	dir := bpftest.PinDir(t)
	minimal, err := maps.Open(maps.OpenOptions{PinDir: dir, Capacity: maps.IPv6MinimalCapacity()})
	if err != nil {
		t.Fatal(err)
	}
	defer minimal.Close()
	ct6, err := maps.Conntrack6.In(minimal)
	if err != nil {
		t.Fatal(err)
	}
	k := gen.SluiceCt6Key{Saddr: [16]uint8{0: 0xfe, 1: 0x80, 15: 1}, Proto: 58}
	v := gen.SluiceCt6Value{Created: 1, Type: gen.SluiceCtTypeCT_FORWARD}
	if err := ct6.Put(k, v, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}

	full, err := maps.Open(maps.OpenOptions{PinDir: dir, Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	migrated := map[string]bool{}
	for _, m := range full.Migrations() {
		migrated[m.To] = m.ToCapacity > m.FromCapacity
	}
	for name, small := range maps.IPv6MinimalCapacity() {
		if !migrated[name] || full.Map(name).MaxEntries() <= small {
			t.Errorf("%s: migrated %v, capacity %d (minimal %d)", name, migrated[name], full.Map(name).MaxEntries(), small)
		}
	}
	if err := full.FinishMigrations(); err != nil {
		t.Fatal(err)
	}
	grown, err := maps.Conntrack6.In(full)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := grown.Get(k); err != nil || got != v {
		t.Fatalf("the flow after the IPv6 table grew: %+v %v", got, err)
	}
}
