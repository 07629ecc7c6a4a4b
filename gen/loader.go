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
	// MaglevTableSize is the number of slots of every Maglev table
	// (sl_maglev_v1's inner maps); 0 keeps the object's default. The NAT
	// syncer must build its tables with the same size (nat/maglev checks
	// that it is a prime).
	MaglevTableSize uint32
	// DryRun loads the programs `sluice trace` runs: their policy hand-offs
	// mark the packet so that the verdict program (the agent's, reached
	// through the live policy programs) writes nothing (POLICY_DRY_RUN in
	// bpf/include/policy.h).
	DryRun bool
}

// Constants of the C headers (bpf/include) the Go side needs; each is the
// #define named beside it, and TestConstantsMatchTheC checks they agree, so
// the rest of the repository takes them from here and restates none.
const (
	// MaglevDefaultTableSize is the object's own Maglev table size
	// (MAGLEV_DEFAULT_SIZE).
	MaglevDefaultTableSize = 16381
	// MaglevMaxTableSize is the largest table the programs index
	// (MAGLEV_MAX_SIZE).
	MaglevMaxTableSize = 131071
	// SNATPortMinDefault and SNATPortMaxDefault are the range a SNATed flow
	// draws its port from when sl_config_v1 names none
	// (SNAT_PORT_MIN_DEFAULT, SNAT_PORT_MAX_DEFAULT).
	SNATPortMinDefault = 1024
	SNATPortMaxDefault = 65535
	// ConntrackEntries is each conntrack table's built-in size, two entries
	// a flow (SL_CT_MAX).
	ConntrackEntries = 524288
	// IfstateNoPolicy is the policy slot of an interface without a policy
	// program (IFSTATE_NO_POLICY).
	IfstateNoPolicy = 0xffffffff
)

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
	if err := sizeMaglev(spec, opts.MaglevTableSize); err != nil {
		return nil, err
	}
	if opts.DryRun {
		if err := spec.Variables[SluiceVarDryRun].Set(uint32(1)); err != nil {
			return nil, fmt.Errorf("dry run: %w", err)
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
	// The established packets' writer (bpf/sluice.c): this load's, also for
	// programs of an earlier load still attached on the same maps.
	if err := objs.SlSpanwriterV1.Put(uint32(0), objs.SlWriteSpan); err != nil {
		objs.Close()
		return nil, fmt.Errorf("load sluice programs: put sl_write_span in %s: %w", SluiceMapSlSpanwriterV1, err)
	}
	return &objs, nil
}

// sizeMaglev sets the Maglev table size: the constant the programs take a
// flow's slot modulo, and the inner maps' value (one 32-bit ordinal a slot).
func sizeMaglev(spec *ebpf.CollectionSpec, size uint32) error {
	if size == 0 {
		return nil
	}
	if size > MaglevMaxTableSize {
		return fmt.Errorf("maglev table size %d: over the datapath's %d", size, MaglevMaxTableSize)
	}
	if err := spec.Variables[SluiceVarMaglevSize].Set(size); err != nil {
		return fmt.Errorf("maglev table size: %w", err)
	}
	spec.Maps[SluiceMapSlMaglevV1].InnerMap.ValueSize = size * 4
	return nil
}
