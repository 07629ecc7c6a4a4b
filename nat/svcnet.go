package nat

// Service networks: the ServiceCIDRs and the allocated ClusterIPs in
// sl_svcnet_v1, so that a new flow to a service address that serves nothing
// is refused as kube-proxy nftables refuses it (bpf/include/svcnet.h).

import (
	"net/netip"

	"github.com/sluice-net/sluice/gen"
)

// setServiceCIDRs makes cidrs the service ranges the datapath knows; nil
// (not known yet) keeps the ranges it has. Invalid prefixes (a zero value)
// are skipped.
func (s *Syncer) setServiceCIDRs(cidrs []netip.Prefix) {
	if cidrs == nil {
		return
	}
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
	k := gen.SvcnetKeyOf(pfx)
	switch {
	case pfx.IsSingleIP() && s.clusterIPRefs[pfx.Addr()] > 0:
		s.svcnet.SetDesired(k, gen.SluiceSvcnetValue{Kind: gen.SluiceSvcnetKindSVCNET_CLUSTER_IP})
	case s.serviceCIDRs[pfx]:
		s.svcnet.SetDesired(k, gen.SluiceSvcnetValue{Kind: gen.SluiceSvcnetKindSVCNET_RANGE})
	default:
		s.svcnet.DeleteDesired(k)
	}
}

// loadSvcnet reads the map back. Its ranges are wanted until a State names
// the ServiceCIDRs (State.ServiceCIDRs not nil); its ClusterIPs are not: the
// first Apply wants again those its State holds, and the rest is deleted
// (what the map holds is not wanted until set again).
func (s *Syncer) loadSvcnet() error {
	if err := s.svcnet.LoadDataplaneState(); err != nil {
		return err
	}
	var ranges []gen.SluiceSvcnetKey
	s.svcnet.IterDataplane(func(k gen.SluiceSvcnetKey, v gen.SluiceSvcnetValue) bool {
		if v.Kind == gen.SluiceSvcnetKindSVCNET_RANGE {
			ranges = append(ranges, k)
		}
		return true
	})
	for _, k := range ranges {
		s.serviceCIDRs[k.Prefix()] = true
		s.svcnet.SetDesired(k, gen.SluiceSvcnetValue{Kind: gen.SluiceSvcnetKindSVCNET_RANGE})
	}
	return nil
}
