package nat

import (
	"errors"
	"fmt"
	"net/netip"
)

// Modes of LocalTraffic: kube-proxy's --detect-local-mode values that apply
// without a CNI of Sluice's own.
const (
	LocalModeClusterCIDR         = "ClusterCIDR"
	LocalModeNodeCIDR            = "NodeCIDR"
	LocalModeInterfaceNamePrefix = "InterfaceNamePrefix"
)

// LocalTraffic tells the cluster's own traffic from the rest, as kube-proxy's
// --detect-local-mode: traffic to a ClusterIP from outside it is masqueraded
// to the node. Mode is LocalModeClusterCIDR (the default: sources in
// ClusterCIDR and ClusterCIDR6), LocalModeNodeCIDR (sources in this Node's
// pod CIDRs, PodCIDRs) or LocalModeInterfaceNamePrefix (traffic entering an
// interface whose name starts with InterfacePrefix).
type LocalTraffic struct {
	Mode                      string
	ClusterCIDR, ClusterCIDR6 netip.Prefix
	InterfacePrefix           string
}

// Check says what is wrong with l, in kube-proxy's flag names.
func (l LocalTraffic) Check() error {
	switch l.Mode {
	case "", LocalModeClusterCIDR:
		if c := l.ClusterCIDR; c.IsValid() && !c.Addr().Is4() {
			return fmt.Errorf("--cluster-cidr %s: not an IPv4 CIDR (ClusterCIDR6 holds the IPv6 one)", c)
		}
		if c := l.ClusterCIDR6; c.IsValid() && !c.Addr().Is6() {
			return fmt.Errorf("--cluster-cidr %s: not an IPv6 CIDR", c)
		}
	case LocalModeNodeCIDR:
	case LocalModeInterfaceNamePrefix:
		if l.InterfacePrefix == "" {
			return errors.New("--detect-local-mode=InterfaceNamePrefix needs --pod-interface-name-prefix")
		}
	case "BridgeInterface":
		return errors.New("--detect-local-mode=BridgeInterface is not supported: use InterfaceNamePrefix with the pods' interface prefix, ClusterCIDR or NodeCIDR")
	default:
		return fmt.Errorf("--detect-local-mode %q: want ClusterCIDR, NodeCIDR or InterfaceNamePrefix", l.Mode)
	}
	return nil
}

// Prefix is the name prefix of the interfaces whose incoming traffic is
// local, in the InterfaceNamePrefix mode only ("" otherwise).
func (l LocalTraffic) Prefix() string {
	if l.Mode == LocalModeInterfaceNamePrefix {
		return l.InterfacePrefix
	}
	return ""
}

// Apply writes l into next, a node configuration being built from prev,
// the one in place: in the NodeCIDR mode the pod CIDRs stay as prev has
// them until the Node tells them (PodCIDRs).
func (l LocalTraffic) Apply(next *NodeConfig, prev NodeConfig) {
	switch l.Mode {
	case LocalModeInterfaceNamePrefix:
		next.LocalByInterface = true
	case LocalModeNodeCIDR:
		next.LocalCIDR, next.LocalCIDR6 = prev.LocalCIDR, prev.LocalCIDR6
	default:
		next.LocalCIDR, next.LocalCIDR6 = l.ClusterCIDR, l.ClusterCIDR6
	}
}

// PodCIDRs writes this Node's pod CIDRs (the first of each family) as the
// local ones in the NodeCIDR mode, and reports whether that changed c; in
// the other modes it changes nothing.
func (l LocalTraffic) PodCIDRs(c *NodeConfig, cidrs []netip.Prefix) (changed bool) {
	if l.Mode != LocalModeNodeCIDR {
		return false
	}
	var v4, v6 netip.Prefix
	for _, p := range cidrs {
		switch {
		case p.Addr().Is4() && !v4.IsValid():
			v4 = p.Masked()
		case p.Addr().Is6() && !v6.IsValid():
			v6 = p.Masked()
		}
	}
	if v4.IsValid() && c.LocalCIDR != v4 {
		c.LocalCIDR, changed = v4, true
	}
	if v6.IsValid() && c.LocalCIDR6 != v6 {
		c.LocalCIDR6, changed = v6, true
	}
	return changed
}
