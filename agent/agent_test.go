package agent

import (
	"net/netip"
	"strings"
	"testing"
)

func TestConntrackEntries(t *testing.T) {
	for _, c := range []struct {
		perCore, min, cpus int
		want               uint32
	}{
		{0, 131072, 64, 0},                  // per-core 0: the built-in size
		{32768, 131072, 2, 2 * 131072},      // the minimum wins on a small node
		{32768, 131072, 64, 2 * 32768 * 64}, // per core on a large one
		{1 << 30, 0, 64, 1 << 30},           // capped
	} {
		if got := ConntrackEntries(c.perCore, c.min, c.cpus); got != c.want {
			t.Errorf("ConntrackEntries(%d, %d, %d) = %d, want %d", c.perCore, c.min, c.cpus, got, c.want)
		}
	}
}

func TestCheckDetectLocal(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string // "" for valid
	}{
		{Config{}, ""},
		{Config{DetectLocalMode: "ClusterCIDR", ClusterCIDR: netip.MustParsePrefix("10.0.0.0/8")}, ""},
		{Config{DetectLocalMode: "ClusterCIDR", ClusterCIDR: netip.MustParsePrefix("fd00::/64")}, "not an IPv4 CIDR"},
		{Config{DetectLocalMode: "ClusterCIDR", ClusterCIDR6: netip.MustParsePrefix("10.0.0.0/8")}, "not an IPv6 CIDR"},
		{Config{DetectLocalMode: "ClusterCIDR", ClusterCIDR: netip.MustParsePrefix("10.0.0.0/8"), ClusterCIDR6: netip.MustParsePrefix("fd00::/56")}, ""},
		{Config{DetectLocalMode: "NodeCIDR"}, ""},
		{Config{DetectLocalMode: "InterfaceNamePrefix"}, "--pod-interface-name-prefix"},
		{Config{DetectLocalMode: "InterfaceNamePrefix", PodInterfaceNamePrefix: "cali"}, ""},
		{Config{DetectLocalMode: "BridgeInterface"}, "not supported"},
		{Config{DetectLocalMode: "clustercidr"}, `"clustercidr"`},
	} {
		err := checkDetectLocal(c.cfg)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s %v: %v, want %q", c.cfg.DetectLocalMode, c.cfg.ClusterCIDR, err, c.want)
		}
	}
}
