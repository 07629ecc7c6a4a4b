package ifacemgr

import (
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/sluice-net/sluice/gen"
	slmaps "github.com/sluice-net/sluice/maps"
)

// Interface is a managed interface as the pins and the interface-state map
// record it (readable while the agent runs or after it stopped).
type Interface struct {
	Index int    `json:"ifindex"`
	Name  string `json:"name"`
	Class string `json:"class"`
	Ready bool   `json:"ready"`
	Hooks []Hook `json:"hooks"`
	// XDPMode is how its XDP program runs: driver, generic, or "" for none;
	// XDPProgram is that program's name (sl_xdp_prefilter, sl_xdp_accel).
	XDPMode       XDPMode `json:"xdpMode,omitempty"`
	XDPProgram    string  `json:"xdpProgram,omitempty"`
	IngressPolicy uint32  `json:"ingressPolicy"`
	EgressPolicy  uint32  `json:"egressPolicy"`
}

// ReadInterfaces lists the interfaces in the interface-state map with the
// hooks pinned for them under pinDir (the links directory).
func ReadInterfaces(pinDir string, ifstate *slmaps.Map[gen.SluiceIfstateKey, gen.SluiceIfstateValue]) ([]Interface, error) {
	a := &attacher{dir: pinDir}
	pins, err := a.listPins()
	if err != nil {
		return nil, err
	}
	var out []Interface
	err = ifstate.Iterate(func(k gen.SluiceIfstateKey, v gen.SluiceIfstateValue) bool {
		i := Interface{Index: int(k.Ifindex), Ready: v.Flags&gen.SluiceIfstateFlagsIFS_READY != 0,
			IngressPolicy: v.IngressPolicy, EgressPolicy: v.EgressPolicy}
		i.Name = gen.CString(v.Name[:])
		switch {
		case v.Flags&gen.SluiceIfstateFlagsIFS_WORKLOAD != 0:
			i.Class = Workload.String()
		case v.Flags&gen.SluiceIfstateFlagsIFS_DATA != 0:
			i.Class = Data.String()
		case v.Flags&gen.SluiceIfstateFlagsIFS_L3 != 0:
			i.Class = L3.String()
		}
		switch {
		case v.Flags&gen.SluiceIfstateFlagsIFS_XDP_DRIVER != 0:
			i.XDPMode = XDPDriver
		case v.Flags&gen.SluiceIfstateFlagsIFS_XDP_GENERIC != 0:
			i.XDPMode = XDPGeneric
		}
		for _, p := range pins {
			if p.ifindex == i.Index {
				i.Hooks = append(i.Hooks, p.hook)
				if p.hook == XDP {
					i.XDPProgram = linkedProgramName(p.path)
				}
			}
		}
		slices.Sort(i.Hooks)
		out = append(out, i)
		return true
	})
	slices.SortFunc(out, func(a, b Interface) int { return a.Index - b.Index })
	return out, err
}

// linkedProgramName is the name of the program a pinned link runs ("" when it
// cannot be read).
func linkedProgramName(pin string) string {
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		return ""
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return ""
	}
	p, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		return ""
	}
	defer p.Close()
	pi, err := p.Info()
	if err != nil {
		return ""
	}
	return pi.Name
}
