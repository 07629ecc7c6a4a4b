package nat

// Service networks: the ServiceCIDRs and the allocated ClusterIPs in
// sl_svcnet_v1, so that a new flow to a service address that serves nothing
// is refused as kube-proxy nftables refuses it (bpf/include/svcnet.h).

import (
	"net/netip"

	"github.com/sluice-net/sluice/gen"
)

// svcnetKey is a prefix as sl_svcnet_v1 keys it: both families in one trie,
// IPv4 as ::ffff:a.b.c.d with 96 more bits of prefix.
func svcnetKey(pfx netip.Prefix) gen.SluiceSvcnetKey {
	bits := pfx.Bits()
	if pfx.Addr().Is4() {
		bits += 96
	}
	return gen.SluiceSvcnetKey{Prefixlen: uint32(bits), Addr: gen.NetAddr6(pfx.Masked().Addr())}
}

// setServiceCIDRs makes cidrs the service ranges the datapath knows.
// Invalid prefixes (a zero value) are skipped.
func (s *Syncer) setServiceCIDRs(cidrs []netip.Prefix) {
	want := make(map[netip.Prefix]bool, len(cidrs))
	for _, c := range cidrs {
		if c.IsValid() {
			want[c.Masked()] = true
		}
	}
	old := s.serviceCIDRs
	s.serviceCIDRs = want
	for c := range old {
		if !want[c] {
			s.settleSvcnet(c)
		}
	}
	for c := range want {
		if !old[c] {
			s.settleSvcnet(c)
		}
	}
}

// refClusterIP and unrefClusterIP count the service ports of each ClusterIP.
func (s *Syncer) refClusterIP(ip netip.Addr) {
	if !ip.IsValid() {
		return
	}
	s.clusterIPRefs[ip]++
	if s.clusterIPRefs[ip] == 1 {
		s.settleSvcnet(netip.PrefixFrom(ip, ip.BitLen()))
	}
}

func (s *Syncer) unrefClusterIP(ip netip.Addr) {
	if !ip.IsValid() {
		return
	}
	s.clusterIPRefs[ip]--
	if s.clusterIPRefs[ip] <= 0 {
		delete(s.clusterIPRefs, ip)
		s.settleSvcnet(netip.PrefixFrom(ip, ip.BitLen()))
	}
}

// settleSvcnet sets the desired entry of pfx: an allocated ClusterIP (a
// single address some service port has) outranks a ServiceCIDR of the same
// prefix, a /32 range say.
func (s *Syncer) settleSvcnet(pfx netip.Prefix) {
	k := svcnetKey(pfx)
	switch {
	case pfx.IsSingleIP() && s.clusterIPRefs[pfx.Addr()] > 0:
		s.svcnet.SetDesired(k, gen.SluiceSvcnetValue{Kind: gen.SluiceSvcnetKindSVCNET_CLUSTER_IP})
	case s.serviceCIDRs[pfx]:
		s.svcnet.SetDesired(k, gen.SluiceSvcnetValue{Kind: gen.SluiceSvcnetKindSVCNET_RANGE})
	default:
		s.svcnet.DeleteDesired(k)
	}
}

// loadSvcnet reads the map back and wants none of it: the first Apply wants
// again what its State holds, and the rest is deleted.
func (s *Syncer) loadSvcnet() error {
	if err := s.svcnet.LoadDataplaneState(); err != nil {
		return err
	}
	var keys []gen.SluiceSvcnetKey
	s.svcnet.IterDataplane(func(k gen.SluiceSvcnetKey, _ gen.SluiceSvcnetValue) bool {
		keys = append(keys, k)
		return true
	})
	for _, k := range keys {
		s.svcnet.DeleteDesired(k)
	}
	return nil
}
