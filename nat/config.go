package nat

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// NodeConfig is the node-wide settings of the service datapath, the one
// entry of sl_config_v1 (bpf/include/config.h). The programs read it per new
// flow, so a change applies without reloading them.
type NodeConfig struct {
	// NodeIP is the source of SNATed flows (NodePort to a remote backend,
	// hairpin, masquerade) and the affinity identity of host sockets. The
	// zero Addr disables SNAT: such flows keep the client's address.
	NodeIP netip.Addr
	// MasqueradeAll SNATs every balanced flow (--masquerade-all).
	MasqueradeAll bool
	// LocalCIDR is the pod CIDR (the cluster's, or with
	// --detect-local-mode=NodeCIDR the node's) inside which traffic is the
	// cluster's own; ClusterIP traffic from outside it is SNATed. The zero
	// Prefix: every source is local, as kube-proxy without --cluster-cidr.
	LocalCIDR netip.Prefix
	// LocalByInterface tells the cluster's own traffic by the interface it
	// entered (marked by ifacemgr, --detect-local-mode=InterfaceNamePrefix)
	// instead of LocalCIDR.
	LocalByInterface bool
	// SocketLBNetnsCookie limits socket load balancing to the sockets of
	// one network namespace (the host's: ifacemgr.NetnsCookie); 0 serves
	// every namespace the cgroup programs see.
	SocketLBNetnsCookie uint64
}

// ReadNodeConfig reads the datapath's node settings.
func ReadNodeConfig(set *maps.Set) (NodeConfig, error) {
	m, err := maps.Config.In(set)
	if err != nil {
		return NodeConfig{}, err
	}
	raw, err := m.Get(0)
	if err != nil {
		return NodeConfig{}, fmt.Errorf("node config: %w", err)
	}
	return decodeNodeConfig(raw), nil
}

// UpdateNodeConfig changes the datapath's node settings with fn, keeping
// what fn leaves alone (the SNAT port range, which has no setting here).
func UpdateNodeConfig(set *maps.Set, fn func(*NodeConfig)) error {
	m, err := maps.Config.In(set)
	if err != nil {
		return err
	}
	raw, err := m.Get(0)
	if err != nil {
		return fmt.Errorf("node config: %w", err)
	}
	c := decodeNodeConfig(raw)
	fn(&c)
	if c.LocalCIDR.IsValid() && !c.LocalCIDR.Addr().Is4() {
		return fmt.Errorf("node config: local CIDR %s: the datapath is IPv4 only", c.LocalCIDR)
	}
	if c.NodeIP.IsValid() && !c.NodeIP.Is4() {
		return fmt.Errorf("node config: node IP %s: the datapath is IPv4 only", c.NodeIP)
	}
	next := encodeNodeConfig(c, raw)
	if next == raw {
		return nil
	}
	if err := m.Put(0, next, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("node config: %w", err)
	}
	return nil
}

func decodeNodeConfig(raw gen.SluiceConfig) NodeConfig {
	c := NodeConfig{
		MasqueradeAll:    raw.Flags&gen.SluiceConfigFlagsCFG_MASQUERADE_ALL != 0,
		LocalByInterface: raw.Flags&gen.SluiceConfigFlagsCFG_LOCAL_BY_IFACE != 0,
	}
	if raw.NodeIp != 0 {
		c.NodeIP = gen.AddrFromNet(raw.NodeIp)
	}
	if raw.Flags&gen.SluiceConfigFlagsCFG_SOCKLB_HOST_ONLY != 0 {
		c.SocketLBNetnsCookie = raw.HostNetnsCookie
	}
	if raw.ClusterMask != 0 {
		c.LocalCIDR = netip.PrefixFrom(gen.AddrFromNet(raw.ClusterNet), maskBits(gen.AddrFromNet(raw.ClusterMask)))
	}
	return c
}

// encodeNodeConfig writes c over raw, keeping raw's other fields.
func encodeNodeConfig(c NodeConfig, raw gen.SluiceConfig) gen.SluiceConfig {
	const ours = gen.SluiceConfigFlagsCFG_MASQUERADE_ALL | gen.SluiceConfigFlagsCFG_LOCAL_BY_IFACE | gen.SluiceConfigFlagsCFG_SOCKLB_HOST_ONLY
	raw.Flags &^= ours
	raw.NodeIp, raw.HostNetnsCookie, raw.ClusterNet, raw.ClusterMask = 0, 0, 0, 0
	if c.NodeIP.IsValid() {
		raw.NodeIp = gen.NetAddr(c.NodeIP)
	}
	if c.MasqueradeAll {
		raw.Flags |= gen.SluiceConfigFlagsCFG_MASQUERADE_ALL
	}
	if c.LocalByInterface {
		raw.Flags |= gen.SluiceConfigFlagsCFG_LOCAL_BY_IFACE
	}
	if c.SocketLBNetnsCookie != 0 {
		raw.Flags |= gen.SluiceConfigFlagsCFG_SOCKLB_HOST_ONLY
		raw.HostNetnsCookie = c.SocketLBNetnsCookie
	}
	if p := c.LocalCIDR.Masked(); p.IsValid() && p.Bits() > 0 {
		raw.ClusterNet, raw.ClusterMask = gen.NetAddr(p.Addr()), gen.NetAddr(prefixMask(p.Bits()))
	}
	return raw
}

// prefixMask is the IPv4 netmask of a prefix length.
func prefixMask(bits int) netip.Addr {
	var m [4]byte
	for i := range bits {
		m[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom4(m)
}

// maskBits is the prefix length of an IPv4 netmask (its leading ones).
func maskBits(mask netip.Addr) int {
	m := mask.As4()
	bits := 0
	for _, b := range m {
		for i := 7; i >= 0 && b&(1<<i) != 0; i-- {
			bits++
		}
		if b != 0xff {
			break
		}
	}
	return bits
}
