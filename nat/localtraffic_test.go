package nat

import (
	"net/netip"
	"strings"
	"testing"
)

func TestLocalTrafficCheck(t *testing.T) {
	for _, c := range []struct {
		l    LocalTraffic
		want string // "" for valid
	}{
		{LocalTraffic{}, ""},
		{LocalTraffic{Mode: "ClusterCIDR", ClusterCIDR: netip.MustParsePrefix("10.0.0.0/8")}, ""},
		{LocalTraffic{Mode: "ClusterCIDR", ClusterCIDR: netip.MustParsePrefix("fd00::/64")}, "not an IPv4 CIDR"},
		{LocalTraffic{Mode: "ClusterCIDR", ClusterCIDR6: netip.MustParsePrefix("10.0.0.0/8")}, "not an IPv6 CIDR"},
		{LocalTraffic{Mode: "ClusterCIDR", ClusterCIDR: netip.MustParsePrefix("10.0.0.0/8"), ClusterCIDR6: netip.MustParsePrefix("fd00::/56")}, ""},
		{LocalTraffic{Mode: "NodeCIDR"}, ""},
		{LocalTraffic{Mode: "InterfaceNamePrefix"}, "--pod-interface-name-prefix"},
		{LocalTraffic{Mode: "InterfaceNamePrefix", InterfacePrefix: "cali"}, ""},
		{LocalTraffic{Mode: "BridgeInterface"}, "not supported"},
		{LocalTraffic{Mode: "clustercidr"}, `"clustercidr"`},
	} {
		err := c.l.Check()
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s %v: %v, want %q", c.l.Mode, c.l.ClusterCIDR, err, c.want)
		}
	}
}

// Each mode writes its own part of the node configuration: the cluster's
// CIDRs, the interface flag, or (NodeCIDR) the Node's pod CIDRs once told,
// kept across a rewrite of the rest.
func TestLocalTrafficApplyAndPodCIDRs(t *testing.T) {
	cluster, cluster6 := netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")
	pod, pod6 := netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:244:0:3::/64")
	var next NodeConfig
	LocalTraffic{ClusterCIDR: cluster, ClusterCIDR6: cluster6}.Apply(&next, NodeConfig{})
	if next.LocalCIDR != cluster || next.LocalCIDR6 != cluster6 || next.LocalByInterface {
		t.Errorf("ClusterCIDR: %+v", next)
	}
	next = NodeConfig{}
	LocalTraffic{Mode: LocalModeInterfaceNamePrefix, InterfacePrefix: "cali"}.Apply(&next, NodeConfig{LocalCIDR: pod})
	if !next.LocalByInterface || next.LocalCIDR.IsValid() {
		t.Errorf("InterfaceNamePrefix: %+v", next)
	}
	node := LocalTraffic{Mode: LocalModeNodeCIDR, ClusterCIDR: cluster}
	var c NodeConfig
	if !node.PodCIDRs(&c, []netip.Prefix{netip.MustParsePrefix("10.244.3.7/24"), pod6}) || c.LocalCIDR != pod || c.LocalCIDR6 != pod6 {
		t.Errorf("NodeCIDR pod CIDRs: %+v", c)
	}
	if node.PodCIDRs(&c, []netip.Prefix{pod, pod6}) {
		t.Error("the same pod CIDRs again: reported a change")
	}
	next = NodeConfig{}
	node.Apply(&next, c)
	if next.LocalCIDR != pod || next.LocalCIDR6 != pod6 {
		t.Errorf("NodeCIDR: a rewrite lost the pod CIDRs: %+v", next)
	}
	if (LocalTraffic{ClusterCIDR: cluster}).PodCIDRs(&c, []netip.Prefix{netip.MustParsePrefix("10.9.0.0/24")}) {
		t.Error("ClusterCIDR mode took a Node's pod CIDRs")
	}
}
