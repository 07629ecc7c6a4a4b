package ifacemgr

import (
	"regexp"
	"strings"
)

// Class is what an interface is to Sluice.
type Class int

// Interface classes.
const (
	Ignored  Class = iota // left alone
	Workload              // a pod's host-side veth: sl_from_wl / sl_to_wl
	Data                  // a node data interface: sl_from_host / sl_to_host, XDP prefilter
	L3                    // an L3 or tunnel device: sl_from_host / sl_to_host, no XDP
)

func (c Class) String() string {
	return [...]string{"ignored", "workload", "data", "l3"}[c]
}

// Classifier decides the class of an interface by its name.
type Classifier struct {
	// WorkloadPrefixes name pods' host-side veths.
	WorkloadPrefixes []string
	// DataIfaces matches node data interfaces; nil means "the interfaces
	// holding the node's default routes" (DefaultRouteIfaces).
	DataIfaces *regexp.Regexp
	// L3Prefixes name L3 and tunnel devices.
	L3Prefixes []string
	// DefaultRouteIfaces is consulted when DataIfaces is nil.
	DefaultRouteIfaces func() map[string]bool
}

// DefaultWorkloadPrefixes are the prefixes CNIs give pods' host-side veths.
var DefaultWorkloadPrefixes = []string{"cali", "lxc", "veth", "sl"}

// DefaultL3Prefixes are common tunnel and L3 device prefixes.
var DefaultL3Prefixes = []string{"tunl", "vxlan", "wg", "geneve", "ipip"}

// Classify returns the class of the named interface.
func (c *Classifier) Classify(name string) Class {
	if name == "lo" {
		return Ignored
	}
	for _, p := range c.WorkloadPrefixes {
		if strings.HasPrefix(name, p) {
			return Workload
		}
	}
	for _, p := range c.L3Prefixes {
		if strings.HasPrefix(name, p) {
			return L3
		}
	}
	if c.DataIfaces != nil {
		if c.DataIfaces.MatchString(name) {
			return Data
		}
	} else if c.DefaultRouteIfaces != nil && c.DefaultRouteIfaces()[name] {
		return Data
	}
	return Ignored
}
