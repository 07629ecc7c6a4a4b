package ifacemgr

import (
	"slices"

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
	// XDPMode is how its XDP program runs: driver, generic, or "" for none.
	XDPMode       XDPMode `json:"xdpMode,omitempty"`
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
			}
		}
		slices.Sort(i.Hooks)
		out = append(out, i)
		return true
	})
	slices.SortFunc(out, func(a, b Interface) int { return a.Index - b.Index })
	return out, err
}
