package nat_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
)

// The node settings reach sl_config_v1 in the layout config.h documents,
// read back as written, and an update keeps what it does not name.
func TestNodeConfigRoundTripsThroughTheMap(t *testing.T) {
	set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	raw, err := maps.Config.In(set)
	if err != nil {
		t.Fatal(err)
	}
	// A SNAT port range written before is read back as the setting.
	if err := raw.Put(0, gen.SluiceConfig{SnatPortMin: 40000, SnatPortMax: 40999}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if got, err := nat.ReadNodeConfig(set); err != nil || got.SNATPorts != (nat.PortRange{Min: 40000, Max: 40999}) {
		t.Fatalf("SNAT ports read back as %v (%v)", got.SNATPorts, err)
	}
	want := nat.NodeConfig{NodeIP: netip.MustParseAddr("10.0.0.5"), MasqueradeAll: true,
		LocalCIDR: netip.MustParsePrefix("10.244.0.0/16"), SocketLBNetnsCookie: 4097,
		SNATPorts: nat.PortRange{Min: 40000, Max: 40999}}
	if err := nat.UpdateNodeConfig(set, func(c *nat.NodeConfig) { *c = want }); err != nil {
		t.Fatal(err)
	}
	got, err := nat.ReadNodeConfig(set)
	if err != nil || got != want {
		t.Fatalf("read back %+v (%v), want %+v", got, err, want)
	}
	r, err := raw.Get(0)
	if err != nil {
		t.Fatal(err)
	}
	if r.SnatPortMin != 40000 || r.SnatPortMax != 40999 ||
		gen.AddrFromNet(r.NodeIp) != want.NodeIP ||
		gen.AddrFromNet(r.ClusterNet) != netip.MustParseAddr("10.244.0.0") ||
		gen.AddrFromNet(r.ClusterMask) != netip.MustParseAddr("255.255.0.0") ||
		r.Flags != gen.SluiceConfigFlagsCFG_MASQUERADE_ALL|gen.SluiceConfigFlagsCFG_SOCKLB_HOST_ONLY ||
		r.HostNetnsCookie != 4097 {
		t.Fatalf("raw entry %+v", r)
	}

	// One field changed; the others stay. A CIDR is stored masked.
	if err := nat.UpdateNodeConfig(set, func(c *nat.NodeConfig) {
		c.MasqueradeAll = false
		c.LocalCIDR = netip.MustParsePrefix("10.1.2.3/24")
	}); err != nil {
		t.Fatal(err)
	}
	want.MasqueradeAll, want.LocalCIDR = false, netip.MustParsePrefix("10.1.2.0/24")
	if got, _ := nat.ReadNodeConfig(set); got != want {
		t.Fatalf("after a partial update %+v, want %+v", got, want)
	}

	// Interface-based local detection, no CIDR, no socket-LB restriction.
	want = nat.NodeConfig{NodeIP: want.NodeIP, LocalByInterface: true}
	if err := nat.UpdateNodeConfig(set, func(c *nat.NodeConfig) { *c = want }); err != nil {
		t.Fatal(err)
	}
	if got, _ := nat.ReadNodeConfig(set); got != want {
		t.Fatalf("%+v, want %+v", got, want)
	}

	// Flow events: the budget and the flag.
	want = nat.NodeConfig{NodeIP: want.NodeIP, EventsPerSecond: 250, FlowEvents: true}
	if err := nat.UpdateNodeConfig(set, func(c *nat.NodeConfig) { *c = want }); err != nil {
		t.Fatal(err)
	}
	if got, _ := nat.ReadNodeConfig(set); got != want {
		t.Fatalf("%+v, want %+v", got, want)
	}
	if r, err := raw.Get(0); err != nil || r.EventsPerSec != 250 || r.Flags&gen.SluiceConfigFlagsCFG_FLOW_EVENTS == 0 {
		t.Fatalf("raw entry %+v (%v)", r, err)
	}

	// Stack routing: the flag alone, and gone again when unset.
	want = nat.NodeConfig{NodeIP: want.NodeIP, StackRouting: true}
	if err := nat.UpdateNodeConfig(set, func(c *nat.NodeConfig) { *c = want }); err != nil {
		t.Fatal(err)
	}
	if got, _ := nat.ReadNodeConfig(set); got != want {
		t.Fatalf("%+v, want %+v", got, want)
	}
	if r, err := raw.Get(0); err != nil || r.Flags != gen.SluiceConfigFlagsCFG_STACK_ROUTING {
		t.Fatalf("raw entry %+v (%v)", r, err)
	}
	if err := nat.UpdateNodeConfig(set, func(c *nat.NodeConfig) { c.StackRouting = false }); err != nil {
		t.Fatal(err)
	}
	if r, err := raw.Get(0); err != nil || r.Flags&gen.SluiceConfigFlagsCFG_STACK_ROUTING != 0 {
		t.Fatalf("raw entry after unset %+v (%v)", r, err)
	}

	// Each external service mode, and its flags.
	for mode, flags := range map[nat.ExternalServiceMode]gen.SluiceConfigFlags{
		nat.ExternalDSR:    gen.SluiceConfigFlagsCFG_DSR_TCP | gen.SluiceConfigFlagsCFG_DSR_UDP,
		nat.ExternalHybrid: gen.SluiceConfigFlagsCFG_DSR_TCP,
		nat.ExternalSNAT:   0,
	} {
		want.ExternalMode = mode
		if err := nat.UpdateNodeConfig(set, func(c *nat.NodeConfig) { *c = want }); err != nil {
			t.Fatal(err)
		}
		if got, _ := nat.ReadNodeConfig(set); got != want {
			t.Fatalf("mode %s: %+v, want %+v", mode, got, want)
		}
		r, err := raw.Get(0)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Flags & (gen.SluiceConfigFlagsCFG_DSR_TCP | gen.SluiceConfigFlagsCFG_DSR_UDP); got != flags {
			t.Fatalf("mode %s: flags %#x, want %#x", mode, got, flags)
		}
	}
}

func TestParseExternalServiceMode(t *testing.T) {
	for in, want := range map[string]nat.ExternalServiceMode{"": nat.ExternalSNAT, "snat": nat.ExternalSNAT, "dsr": nat.ExternalDSR, "hybrid": nat.ExternalHybrid} {
		if got, err := nat.ParseExternalServiceMode(in); err != nil || got != want {
			t.Errorf("%q: %v (%v), want %v", in, got, err, want)
		}
	}
	if _, err := nat.ParseExternalServiceMode("geneve"); err == nil || !strings.Contains(err.Error(), `"geneve"`) {
		t.Errorf("geneve: %v, want an error naming it", err)
	}
	if s := nat.ExternalSNAT.String(); s != "snat" {
		t.Errorf("the zero mode prints %q", s)
	}
}

func TestNodeConfigIPv6Settings(t *testing.T) {
	set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	want := nat.NodeConfig{NodeIP: netip.MustParseAddr("10.0.0.1"), NodeIP6: netip.MustParseAddr("fd00::1"),
		LocalCIDR6: netip.MustParsePrefix("fd00:10::/56")}
	if err := nat.UpdateNodeConfig(set, func(c *nat.NodeConfig) { *c = want }); err != nil {
		t.Fatal(err)
	}
	if got, err := nat.ReadNodeConfig(set); err != nil || got != want {
		t.Fatalf("%+v (%v), want %+v", got, err, want)
	}
	m, err := maps.Config6.In(set)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := m.Get(0)
	if err != nil {
		t.Fatal(err)
	}
	if gen.AddrFromNet6(raw.ClusterMask) != netip.MustParseAddr("ffff:ffff:ffff:ff00::") ||
		gen.AddrFromNet6(raw.NodeIp) != want.NodeIP6 {
		t.Fatalf("sl_config6_v1 holds %+v", raw)
	}
	// Each family in its own field.
	err = nat.UpdateNodeConfig(set, func(c *nat.NodeConfig) { c.NodeIP6 = netip.MustParseAddr("10.0.0.2") })
	if err == nil || !strings.Contains(err.Error(), "10.0.0.2") {
		t.Fatalf("an IPv4 address as the IPv6 node IP: %v", err)
	}
}

func TestNodeConfigRefusesIPv6ByName(t *testing.T) {
	set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	err = nat.UpdateNodeConfig(set, func(c *nat.NodeConfig) { c.LocalCIDR = netip.MustParsePrefix("fd00::/64") })
	if err == nil || !strings.Contains(err.Error(), "fd00::/64") {
		t.Fatalf("an IPv6 CIDR: %v", err)
	}
	err = nat.UpdateNodeConfig(set, func(c *nat.NodeConfig) { c.NodeIP = netip.MustParseAddr("fd00::1") })
	if err == nil || !strings.Contains(err.Error(), "fd00::1") {
		t.Fatalf("an IPv6 node IP: %v", err)
	}
	if got, err := nat.ReadNodeConfig(set); err != nil || got != (nat.NodeConfig{}) {
		t.Fatalf("a refused update wrote %+v (%v)", got, err)
	}
}

func TestParsePortRange(t *testing.T) {
	for in, want := range map[string]nat.PortRange{"1024-32767": {1024, 32767}, "20000:29999": {20000, 29999}, "7-7": {7, 7}} {
		if got, err := nat.ParsePortRange(in); err != nil || got != want {
			t.Errorf("%q: %v (%v), want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "1024", "0-10", "10-5", "1-65536", "a-b"} {
		if _, err := nat.ParsePortRange(in); err == nil {
			t.Errorf("%q: accepted", in)
		}
	}
}
