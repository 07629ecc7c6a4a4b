package nat_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
)

var nodeIP6 = netip.MustParseAddr("fd00::1")

// frontendList is ReadFrontends as "service address proto -> backends".
func (f *fixture) frontendList() map[string]string {
	f.t.Helper()
	fes, err := nat.ReadFrontends(f.set)
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]string{}
	for _, fe := range fes {
		var bs []string
		for _, b := range fe.Backends {
			bs = append(bs, b.Address.String())
		}
		out[fe.Service+" "+fe.Shown().String()+" "+fe.Protocol] = strings.Join(bs, ",")
	}
	return out
}

func count[K comparable, V any](t *testing.T, m *maps.Map[K, V], err error) int {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := m.Iterate(func(K, V) bool { n++; return true }); err != nil {
		t.Fatal(err)
	}
	return n
}

// A dual-stack Service is two service ports, one per family: each family's
// frontends, backends, markers and NodePorts go to that family's maps, and
// neither touches the other's.
func TestSyncerDualStackServiceProgramsEachFamily(t *testing.T) {
	f := newFixture(t, nat.Options{})
	f.node.NodePortIPs = []netip.Addr{nodeIP, nodeIP6}
	v4 := svc("web", "10.96.0.10", 80, func(s *nat.ServicePort) {
		s.NodePort = 30080
		s.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.10")}
	})
	v6 := svc("web", "fd00:96::10", 80, func(s *nat.ServicePort) {
		s.NodePort = 30080
		s.ExternalIPs = []netip.Addr{netip.MustParseAddr("2001:db8::10")}
		s.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("2001:db8::20")}
		s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48")}
	})
	endpoints := map[nat.ServicePortName][]nat.Endpoint{
		v4.Name: eps("10.2.0.7:8080"),
		v6.Name: eps("[fd00:2::7]:8080", "[fd00:2::8]:8080@local"),
	}
	stats := f.apply([]*nat.ServicePort{v4, v6}, endpoints)
	if len(stats.Errors) != 0 || stats.Services != 2 {
		t.Fatalf("stats %+v", stats)
	}
	got := f.frontendList()
	want := map[string]string{
		"default/web:p 10.96.0.10:80 TCP":            "10.2.0.7:8080",
		"default/web:p 192.0.2.10:80 TCP":            "10.2.0.7:8080",
		"default/web:p 10.0.0.1:30080 TCP":           "10.2.0.7:8080",
		"default/web:p 0.0.0.0:30080 TCP":            "10.2.0.7:8080",
		"default/web:p (IPv6) [fd00:96::10]:80 TCP":  "[fd00:2::7]:8080,[fd00:2::8]:8080",
		"default/web:p (IPv6) [2001:db8::10]:80 TCP": "[fd00:2::7]:8080,[fd00:2::8]:8080",
		"default/web:p (IPv6) [2001:db8::20]:80 TCP": "[fd00:2::7]:8080,[fd00:2::8]:8080",
		"default/web:p (IPv6) [fd00::1]:30080 TCP":   "[fd00:2::7]:8080,[fd00:2::8]:8080",
		"default/web:p (IPv6) [::]:30080 TCP":        "[fd00:2::7]:8080,[fd00:2::8]:8080",
	}
	if len(got) != len(want) {
		t.Errorf("%d frontends, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("frontend %q: backends %q, want %q", k, got[k], v)
		}
	}
	if t.Failed() {
		t.Fatalf("frontends: %v", got)
	}
	id4, _ := f.s.ServiceID(v4.Name)
	id6, _ := f.s.ServiceID(v6.Name)
	if id4 == id6 {
		t.Fatalf("both families have service id %d", id4)
	}

	// The raw maps: each family in its own.
	fe6, err := maps.Frontends6.In(f.set)
	n6 := count(t, fe6, err)
	fe4, err := maps.Frontends.In(f.set)
	n4 := count(t, fe4, err)
	// IPv4: 4 frontends and 2 echo markers; IPv6: 5 and 3 markers.
	if n4 != 6 || n6 != 8 {
		t.Fatalf("frontend entries: %d IPv4, %d IPv6; want 6 and 8", n4, n6)
	}
	marker, err := fe6.Get(gen.SluiceFe6Key{Addr: gen.NetAddr6(v6.ClusterIP), Proto: 58})
	if err != nil || marker.SvcId != 0 {
		t.Fatalf("IPv6 echo marker: %+v %v", marker, err)
	}
	src6, err := maps.SrcRanges6.In(f.set)
	if n := count(t, src6, err); n != 1 {
		t.Fatalf("%d IPv6 source ranges, want 1", n)
	}
	if n := f.srcRangeCount(); n != 0 {
		t.Fatalf("%d IPv4 source ranges, want 0", n)
	}
	hip6, err := maps.HostIPs6.In(f.set)
	if _, gerr := hip6.Get(gen.SluiceHostip6Key{Addr: gen.NetAddr6(nodeIP6)}); err != nil || gerr != nil {
		t.Fatalf("node IPv6 address not in sl_hostip6_v1: %v %v", err, gerr)
	}

	// A restarted agent adopts both families and writes nothing.
	f.open(nat.Options{})
	stats = f.apply([]*nat.ServicePort{v4, v6}, endpoints)
	if stats.Writes != 0 || stats.Deletes != 0 {
		t.Fatalf("restart wrote %d and deleted %d", stats.Writes, stats.Deletes)
	}
	if id, _ := f.s.ServiceID(v6.Name); id != id6 {
		t.Fatalf("IPv6 service id %d after restart, was %d", id, id6)
	}

	// The IPv6 half goes (the Service became single-stack): the IPv4 half stays whole.
	f.apply([]*nat.ServicePort{v4}, endpoints)
	if n := count(t, fe6, nil); n != 0 {
		t.Fatalf("%d IPv6 frontends left", n)
	}
	be6, err := maps.Backends6.In(f.set)
	if n := count(t, be6, err); n != 0 {
		t.Fatalf("%d IPv6 backends left", n)
	}
	if n := count(t, fe4, nil); n != 6 {
		t.Fatalf("%d IPv4 frontends, want 6", n)
	}
}

func TestSyncerRefusesMixedFamiliesByName(t *testing.T) {
	f := newFixture(t, nat.Options{})
	for _, tc := range []struct {
		svc  *nat.ServicePort
		eps  []nat.Endpoint
		want string
	}{
		{svc("a", "fd00:96::1", 80, func(s *nat.ServicePort) { s.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.1")} }), nil,
			"externalIPs: 192.0.2.1 is not an IPv6 address"},
		{svc("b", "fd00:96::2", 80, func(s *nat.ServicePort) {
			s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
		}), nil, "loadBalancerSourceRanges: 10.0.0.0/8 is not an IPv6 CIDR"},
		{svc("c", "fd00:96::3", 80), eps("10.2.0.1:80"), "endpoint 10.2.0.1:80: not an IPv6 address"},
		{svc("d", "10.96.0.4", 80, func(s *nat.ServicePort) { s.Name.IPv6 = true }), nil,
			"clusterIP 10.96.0.4: not of the service port's family (IPv6)"},
		{svc("e", "ff02::1", 80), nil, "clusterIP ff02::1: a multicast address"},
	} {
		stats := f.apply([]*nat.ServicePort{tc.svc}, map[nat.ServicePortName][]nat.Endpoint{tc.svc.Name: tc.eps})
		if len(stats.Errors) != 1 || !strings.Contains(stats.Errors[0].Error(), tc.want) ||
			!strings.Contains(stats.Errors[0].Error(), tc.svc.Name.String()) {
			t.Errorf("%s: errors %v, want one naming the service and %q", tc.svc.Name, stats.Errors, tc.want)
		}
	}
}
