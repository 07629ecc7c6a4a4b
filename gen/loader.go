package gen

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// LoadOptions configures Load. The zero value loads every program with private,
// unpinned maps, which is what a unit test of one program usually wants.
type LoadOptions struct {
	// Maps replaces maps of the object by name. The agent passes the pinned maps
	// opened by package maps, so that programs and userspace share one set and
	// state survives a restart. Maps not named here are created unpinned.
	Maps map[string]*ebpf.Map
}

// Spec returns a fresh copy of the collection spec of every Sluice program and map.
func Spec() (*ebpf.CollectionSpec, error) {
	return LoadSluice()
}

// Load loads every Sluice program into the kernel.
func Load(opts LoadOptions) (*SluiceObjects, error) {
	spec, err := LoadSluice()
	if err != nil {
		return nil, err
	}
	// A replacement may have another capacity than the object's default
	// (maps.OpenOptions.Capacity): the programs take it as it is.
	for name, m := range opts.Maps {
		if ms, ok := spec.Maps[name]; ok {
			ms.MaxEntries = m.MaxEntries()
		}
	}
	var objs SluiceObjects
	err = spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: opts.Maps})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			// The last lines of the log say why; the whole log is kept for %+v.
			return nil, fmt.Errorf("load sluice programs: %w", ve)
		}
		return nil, fmt.Errorf("load sluice programs: %w", err)
	}
	return &objs, nil
}
