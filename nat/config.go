package nat

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// NodeConfig is the node-wide settings of the service datapath, the one
// entry of sl_config_v1 (bpf/include/config.h) and of sl_config6_v1
// (service6.h). The programs read them per new flow, so a change applies
// without reloading them.
type NodeConfig struct {
	// NodeIP is the source of SNATed flows (NodePort to a remote backend,
	// hairpin, masquerade) and the affinity identity of host sockets. The
	// zero Addr disables SNAT: such flows keep the client's address.
	NodeIP netip.Addr
	// NodeIP6 and LocalCIDR6 are NodeIP and LocalCIDR for IPv6 flows.
	NodeIP6    netip.Addr
	LocalCIDR6 netip.Prefix
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
	// ExternalMode is how external traffic (NodePort, load balancer and
	// external IPs, externalTrafficPolicy Cluster) reaches a backend on
	// another node: SNATed to this node (the zero value, kube-proxy's way)
	// or by direct server return (bpf/include/dsr.h).
	ExternalMode ExternalServiceMode
	// EventsPerSecond is how many flow events (bpf/include/events.h) each
	// CPU may write a second; 0 writes none. FlowEvents adds service
	// flows' starts and ends to the drops.
	EventsPerSecond uint32
	FlowEvents      bool
	// StackRouting leaves a workload's packets to another workload on this
	// node to the node's IP stack (and its netfilter), rather than the
	// datapath handing them over (bpf/include/deliver.h; --stack-routing).
	StackRouting bool
	// Adopting says a takeover from another proxy is under way: datagrams
	// no conntrack entry knows pass to the node's stack, whose netfilter
	// may hold their flows, until the agent has adopted those
	// (conntrack.Adopt) and clears it (CFG_ADOPTING).
	Adopting bool
	// SNATPorts is the range a SNATed flow draws its source port from when
	// it cannot keep the client's (--snat-port-range). The zero value is
	// the datapath's built-in range (DefaultSNATPorts).
	SNATPorts PortRange
}

// PortRange is a range of ports, both ends included.
type PortRange struct{ Min, Max uint16 }

// DefaultSNATPorts is the datapath's built-in SNAT range
// (SNAT_PORT_MIN/MAX_DEFAULT, bpf/include/consts.h): every unprivileged port,
// as netfilter's MASQUERADE. The node's own connections are tracked, so a
// port drawn never takes their tuple.
var DefaultSNATPorts = PortRange{gen.SNATPortMinDefault, gen.SNATPortMaxDefault}

// String is the range as --snat-port-range takes it.
func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Min, r.Max) }

// ParsePortRange reads "MIN-MAX" (or "MIN:MAX", Calico's BPFPSNATPorts
// form), 1 <= MIN <= MAX <= 65535.
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		lo, hi, ok = strings.Cut(s, ":")
	}
	if !ok {
		return PortRange{}, fmt.Errorf("port range %q: want MIN-MAX", s)
	}
	min, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	max, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if err := errors.Join(err1, err2); err != nil {
		return PortRange{}, fmt.Errorf("port range %q: %w", s, err)
	}
	if min == 0 || min > max {
		return PortRange{}, fmt.Errorf("port range %q: want 1 <= MIN <= MAX <= 65535", s)
	}
	return PortRange{uint16(min), uint16(max)}, nil
}

// ExternalServiceMode is --external-service-mode.
type ExternalServiceMode string

const (
	// ExternalSNAT (the zero value) SNATs external traffic to a remote
	// backend to the node's address; the replies come back through this
	// node.
	ExternalSNAT ExternalServiceMode = ""
	// ExternalDSR keeps the client's address on TCP and UDP: the backend
	// sees the client, and its node answers the client directly.
	ExternalDSR ExternalServiceMode = "dsr"
	// ExternalHybrid is DSR for TCP and SNAT for UDP (Cilium's "hybrid"):
	// UDP datagrams carry the DSR option each, which costs their room and,
	// near the MTU, a smaller path MTU.
	ExternalHybrid ExternalServiceMode = "hybrid"
)

// String is the mode's flag value.
func (m ExternalServiceMode) String() string {
	if m == ExternalSNAT {
		return "snat"
	}
	return string(m)
}

// ParseExternalServiceMode reads snat, dsr or hybrid ("" is snat).
func ParseExternalServiceMode(s string) (ExternalServiceMode, error) {
	switch m := ExternalServiceMode(s); m {
	case "", "snat":
		return ExternalSNAT, nil
	case ExternalDSR, ExternalHybrid:
		return m, nil
	}
	return "", fmt.Errorf("external service mode %q: want snat, dsr or hybrid", s)
}

// ReadNodeConfig reads the datapath's node settings.
func ReadNodeConfig(set *maps.Set) (NodeConfig, error) {
	m, m6, err := configMaps(set)
	if err != nil {
		return NodeConfig{}, err
	}
	raw, err := m.Get(0)
	if err != nil {
		return NodeConfig{}, fmt.Errorf("node config: %w", err)
	}
	raw6, err := m6.Get(0)
	if err != nil {
		return NodeConfig{}, fmt.Errorf("node config: %w", err)
	}
	c := decodeNodeConfig(raw)
	decodeNodeConfig6(raw6, &c)
	return c, nil
}

func configMaps(set *maps.Set) (*maps.Map[uint32, gen.SluiceConfig], *maps.Map[uint32, gen.SluiceConfig6], error) {
	m, err := maps.Config.In(set)
	if err != nil {
		return nil, nil, err
	}
	m6, err := maps.Config6.In(set)
	if err != nil {
		return nil, nil, err
	}
	return m, m6, nil
}

// UpdateNodeConfig changes the datapath's node settings with fn, keeping
// what fn leaves alone.
func UpdateNodeConfig(set *maps.Set, fn func(*NodeConfig)) error {
	m, m6, err := configMaps(set)
	if err != nil {
		return err
	}
	raw, err := m.Get(0)
	if err != nil {
		return fmt.Errorf("node config: %w", err)
	}
	raw6, err := m6.Get(0)
	if err != nil {
		return fmt.Errorf("node config: %w", err)
	}
	c := decodeNodeConfig(raw)
	decodeNodeConfig6(raw6, &c)
	fn(&c)
	for _, f := range []struct {
		what  string
		value fmt.Stringer
		addr  netip.Addr
		ipv6  bool
	}{
		{"local CIDR", c.LocalCIDR, c.LocalCIDR.Addr(), false},
		{"node IP", c.NodeIP, c.NodeIP, false},
		{"IPv6 local CIDR", c.LocalCIDR6, c.LocalCIDR6.Addr(), true},
		{"IPv6 node IP", c.NodeIP6, c.NodeIP6, true},
	} {
		if f.addr.IsValid() && (f.addr.Is6() != f.ipv6 || f.addr.Is4In6()) {
			return fmt.Errorf("node config: %s %s: not an %s address", f.what, f.value, familyName(f.ipv6))
		}
	}
	if next := encodeNodeConfig(c, raw); next != raw {
		if err := m.Put(0, next, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("node config: %w", err)
		}
	}
	if next := encodeNodeConfig6(c); next != raw6 {
		if err := m6.Put(0, next, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("node config: %w", err)
		}
	}
	return nil
}

func decodeNodeConfig6(raw gen.SluiceConfig6, c *NodeConfig) {
	if ip := gen.AddrFromNet6(raw.NodeIp); !ip.IsUnspecified() {
		c.NodeIP6 = ip
	}
	if mask := gen.AddrFromNet6(raw.ClusterMask); !mask.IsUnspecified() {
		c.LocalCIDR6 = netip.PrefixFrom(gen.AddrFromNet6(raw.ClusterNet), maskBits(mask))
	}
}

func encodeNodeConfig6(c NodeConfig) gen.SluiceConfig6 {
	var raw gen.SluiceConfig6
	if c.NodeIP6.IsValid() {
		raw.NodeIp = gen.NetAddr6(c.NodeIP6)
	}
	if p := c.LocalCIDR6.Masked(); p.IsValid() && p.Bits() > 0 {
		raw.ClusterNet, raw.ClusterMask = gen.NetAddr6(p.Addr()), gen.NetAddr6(prefixMask6(p.Bits()))
	}
	return raw
}

func decodeNodeConfig(raw gen.SluiceConfig) NodeConfig {
	c := NodeConfig{
		MasqueradeAll:    raw.Flags&gen.SluiceConfigFlagsCFG_MASQUERADE_ALL != 0,
		LocalByInterface: raw.Flags&gen.SluiceConfigFlagsCFG_LOCAL_BY_IFACE != 0,
		EventsPerSecond:  raw.EventsPerSec,
		FlowEvents:       raw.Flags&gen.SluiceConfigFlagsCFG_FLOW_EVENTS != 0,
		StackRouting:     raw.Flags&gen.SluiceConfigFlagsCFG_STACK_ROUTING != 0,
		Adopting:         raw.Flags&gen.SluiceConfigFlagsCFG_ADOPTING != 0,
	}
	switch raw.Flags & (gen.SluiceConfigFlagsCFG_DSR_TCP | gen.SluiceConfigFlagsCFG_DSR_UDP) {
	case gen.SluiceConfigFlagsCFG_DSR_TCP | gen.SluiceConfigFlagsCFG_DSR_UDP:
		c.ExternalMode = ExternalDSR
	case gen.SluiceConfigFlagsCFG_DSR_TCP:
		c.ExternalMode = ExternalHybrid
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
	if raw.SnatPortMin != 0 && raw.SnatPortMax != 0 {
		c.SNATPorts = PortRange{raw.SnatPortMin, raw.SnatPortMax}
	}
	return c
}

// encodeNodeConfig writes c over raw, keeping raw's other fields.
func encodeNodeConfig(c NodeConfig, raw gen.SluiceConfig) gen.SluiceConfig {
	const ours = gen.SluiceConfigFlagsCFG_MASQUERADE_ALL | gen.SluiceConfigFlagsCFG_LOCAL_BY_IFACE | gen.SluiceConfigFlagsCFG_SOCKLB_HOST_ONLY |
		gen.SluiceConfigFlagsCFG_DSR_TCP | gen.SluiceConfigFlagsCFG_DSR_UDP | gen.SluiceConfigFlagsCFG_FLOW_EVENTS |
		gen.SluiceConfigFlagsCFG_STACK_ROUTING | gen.SluiceConfigFlagsCFG_ADOPTING
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
	raw.EventsPerSec = c.EventsPerSecond
	if c.FlowEvents {
		raw.Flags |= gen.SluiceConfigFlagsCFG_FLOW_EVENTS
	}
	if c.StackRouting {
		raw.Flags |= gen.SluiceConfigFlagsCFG_STACK_ROUTING
	}
	if c.Adopting {
		raw.Flags |= gen.SluiceConfigFlagsCFG_ADOPTING
	}
	switch c.ExternalMode {
	case ExternalDSR:
		raw.Flags |= gen.SluiceConfigFlagsCFG_DSR_TCP | gen.SluiceConfigFlagsCFG_DSR_UDP
	case ExternalHybrid:
		raw.Flags |= gen.SluiceConfigFlagsCFG_DSR_TCP
	}
	if c.SocketLBNetnsCookie != 0 {
		raw.Flags |= gen.SluiceConfigFlagsCFG_SOCKLB_HOST_ONLY
		raw.HostNetnsCookie = c.SocketLBNetnsCookie
	}
	if p := c.LocalCIDR.Masked(); p.IsValid() && p.Bits() > 0 {
		raw.ClusterNet, raw.ClusterMask = gen.NetAddr(p.Addr()), gen.NetAddr(prefixMask(p.Bits()))
	}
	raw.SnatPortMin, raw.SnatPortMax = c.SNATPorts.Min, c.SNATPorts.Max
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

// prefixMask6 is the IPv6 netmask of a prefix length.
func prefixMask6(bits int) netip.Addr {
	var m [16]byte
	for i := range bits {
		m[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom16(m)
}

// maskBits is the prefix length of a netmask (its leading ones).
func maskBits(mask netip.Addr) int {
	m := mask.AsSlice()
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
