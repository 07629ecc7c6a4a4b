package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
)

// NoPolicy is the slot value meaning "no policy program" in the interface
// state (IFSTATE_NO_POLICY in bpf/include/ifstate.h).
const NoPolicy = gen.IfstateNoPolicy

// Runtime loads compiled policies into the program array and hands out their
// slots; the interface manager writes an endpoint's slots into
// sl_ifstate_v1, where the datapath finds them.
type Runtime struct {
	compiler Compiler
	mu       sync.Mutex
	used     map[uint32]uint32 // first slot -> number of slots
	capacity uint32
}

// NewRuntime puts the verdict program (gen: SlPolicyVerdict) in slot 0.
func NewRuntime(m Maps, verdict *ebpf.Program, rulesPerProgram int) (*Runtime, error) {
	if m.Programs == nil {
		return nil, errors.New("policy runtime: no program array")
	}
	if err := m.Programs.Put(uint32(0), verdict); err != nil {
		return nil, fmt.Errorf("policy runtime: install the verdict program: %w", err)
	}
	return &Runtime{compiler: Compiler{Maps: m, RulesPerProgram: rulesPerProgram},
		used: map[uint32]uint32{}, capacity: m.Programs.MaxEntries()}, nil
}

// alloc finds n consecutive free slots (slot 0 is the verdict program's).
func (r *Runtime) alloc(n uint32) (uint32, error) {
	starts := make([]uint32, 0, len(r.used))
	for s := range r.used {
		starts = append(starts, s)
	}
	slices.Sort(starts)
	next := uint32(1)
	for _, s := range starts {
		if s-next >= n {
			break
		}
		next = s + r.used[s]
	}
	if next+n > r.capacity {
		return 0, fmt.Errorf("policy program array is full (%d slots)", r.capacity)
	}
	r.used[next] = n
	return next, nil
}

// Install compiles and loads p and returns its entry slot. The programs are
// placed last to first, so the entry slot only becomes reachable complete.
func (r *Runtime) Install(name string, p *EndpointPolicy) (uint32, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pl, err := r.compiler.plan(name, p)
	if err != nil {
		return 0, err
	}
	first, err := r.alloc(uint32(pl.programs()))
	if err != nil {
		return 0, err
	}
	specs, release, err := r.compiler.build(name, p, pl, first, false)
	if err != nil {
		delete(r.used, first)
		return 0, err
	}
	defer release() // the loaded classifier holds its maps
	for _, spec := range specs {
		if spec.Name, err = programName(spec); err != nil {
			delete(r.used, first)
			return 0, err
		}
	}
	for i := len(specs) - 1; i >= 0; i-- {
		prog, err := ebpf.NewProgram(specs[i])
		if err != nil {
			r.remove(first)
			var ve *ebpf.VerifierError
			if errors.As(err, &ve) {
				return 0, fmt.Errorf("policy %s program %d: %v", name, i, ve)
			}
			return 0, fmt.Errorf("policy %s program %d: %w", name, i, err)
		}
		err = r.compiler.Maps.Programs.Put(first+uint32(i), prog)
		prog.Close() // the array holds it
		if err != nil {
			r.remove(first)
			return 0, fmt.Errorf("policy %s: install in slot %d: %w", name, first+uint32(i), err)
		}
	}
	return first, nil
}

// Remove frees the slots of the policy installed at first.
func (r *Runtime) Remove(first uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.remove(first)
}

func (r *Runtime) remove(first uint32) {
	n := r.used[first]
	for i := range n {
		_ = r.compiler.Maps.Programs.Delete(first + i)
	}
	delete(r.used, first)
}

// Adopt takes over the slots a previous runtime filled: the program array is
// pinned and outlives the agent, and live interfaces still point into it.
// Each slot in firsts (the entry slots the interfaces use) starts a policy
// whose programs run up to the next such slot or the first empty slot; those
// slots stay reserved until Remove, so no Install overwrites a policy an
// interface still uses. Programs outside such runs belong to no interface
// and are deleted; a policy nothing points to right after one in use cannot
// be told from its tail and is freed with it. Call it before the first
// Install.
func (r *Runtime) Adopt(firsts []uint32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	starts := map[uint32]bool{}
	for _, f := range firsts {
		if f > 0 && f < r.capacity {
			starts[f] = true
		}
	}
	var errs []error
	current := uint32(0) // the run being adopted (0: none)
	for slot := uint32(1); slot < r.capacity; slot++ {
		var id uint32
		err := r.compiler.Maps.Programs.Lookup(slot, &id)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			current = 0
			continue
		}
		if err != nil {
			return fmt.Errorf("policy runtime: read slot %d: %w", slot, err)
		}
		switch {
		case starts[slot]:
			current = slot
			r.used[slot] = 1
		case current != 0:
			r.used[current]++
		default:
			errs = append(errs, r.compiler.Maps.Programs.Delete(slot))
		}
	}
	return errors.Join(errs...)
}

// Matches reports whether the policy at first is p compiled for that slot
// (the same instructions, by the names Install gives its programs): a policy
// adopted after a restart is then kept as it is instead of loaded again.
func (r *Runtime) Matches(name string, p *EndpointPolicy, first uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.used[first]
	if !ok {
		return false
	}
	pl, err := r.compiler.plan(name, p)
	if err != nil {
		return false
	}
	specs, _, err := r.compiler.build(name, p, pl, first, true)
	if err != nil || uint32(len(specs)) != n {
		return false
	}
	for i, spec := range specs {
		want, err := programName(spec)
		if err != nil {
			return false
		}
		var id uint32
		if err := r.compiler.Maps.Programs.Lookup(first+uint32(i), &id); err != nil {
			return false
		}
		prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
		if err != nil {
			return false
		}
		info, err := prog.Info()
		prog.Close()
		if err != nil {
			return false
		}
		if strings.HasPrefix(want, classifierPrefix) {
			// The kernel names the classifier after its C function (its
			// BTF); its tables carry the name instead.
			if classifierName(info) != want {
				return false
			}
			continue
		}
		if info.Name != want {
			return false
		}
	}
	return true
}

// programName is the name Install gives a program: a classifier's is named
// after its tables already (index.name), the others after their code.
func programName(spec *ebpf.ProgramSpec) (string, error) {
	if strings.HasPrefix(spec.Name, classifierPrefix) {
		return spec.Name, nil
	}
	return codeName(spec)
}

// codeName names a policy program after its instructions: "slp" and the
// start of their tag as computed here (the kernel's tag of the loaded
// program differs, as the kernel rewrites some instructions first), so that
// Matches can tell the same code without loading it again.
func codeName(spec *ebpf.ProgramSpec) (string, error) {
	tag, err := spec.Tag()
	if err != nil {
		return "", err
	}
	return "slp" + tag[:12], nil
}
