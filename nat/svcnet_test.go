package nat_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/sluice-net/sluice/gen"
	sluicemaps "github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
)

// serviceNets reads sl_svcnet_v1 back as "prefix kind" lines, sorted.
func (f *fixture) serviceNets() []string {
	f.t.Helper()
	m, err := sluicemaps.ServiceNets.In(f.set)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	err = m.Iterate(func(k gen.SluiceSvcnetKey, v gen.SluiceSvcnetValue) bool {
		kind := map[gen.SluiceSvcnetKind]string{gen.SluiceSvcnetKindSVCNET_CLUSTER_IP: "clusterIP",
			gen.SluiceSvcnetKindSVCNET_RANGE: "range"}[v.Kind]
		out = append(out, fmt.Sprintf("%v %s", k.Prefix(), kind))
		return true
	})
	if err != nil {
		f.t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func TestSyncerServiceNetworks(t *testing.T) {
	f := newFixture(t, nat.Options{})
	f.serviceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:96::/112"),
		netip.MustParsePrefix("10.200.0.7/32")}
	webHTTP := svc("web", "10.96.0.10", 80)
	webHTTPS := svc("web", "10.96.0.10", 443)
	webHTTPS.Name.Port = "https"
	web6 := svc("web", "fd00:96::10", 80)
	pinned := svc("pinned", "10.200.0.7", 53) // a ClusterIP that is a whole ServiceCIDR
	outside := svc("outside", "10.44.0.1", 80)
	all := []*nat.ServicePort{webHTTP, webHTTPS, web6, pinned, outside}
	epsOf := func(svcs ...*nat.ServicePort) map[nat.ServicePortName][]nat.Endpoint {
		m := map[nat.ServicePortName][]nat.Endpoint{}
		for _, s := range svcs {
			if s.ClusterIP.Is6() {
				m[s.Name] = eps("[fd00:2::7]:8080")
			} else {
				m[s.Name] = eps("10.1.0.7:8080")
			}
		}
		return m
	}

	f.apply(all, epsOf(all...))
	want := []string{"10.200.0.7/32 clusterIP", "10.44.0.1/32 clusterIP", "10.96.0.0/12 range", "10.96.0.10/32 clusterIP",
		"fd00:96::/112 range", "fd00:96::10/128 clusterIP"}
	if got := f.serviceNets(); !slices.Equal(got, want) {
		t.Fatalf("service networks:\n got %q\nwant %q", got, want)
	}

	// A ClusterIP stays while any of its ports does; a ClusterIP that is
	// a whole range falls back to the range.
	f.apply([]*nat.ServicePort{webHTTPS, web6}, epsOf(webHTTPS, web6))
	want = []string{"10.200.0.7/32 range", "10.96.0.0/12 range", "10.96.0.10/32 clusterIP",
		"fd00:96::/112 range", "fd00:96::10/128 clusterIP"}
	if got := f.serviceNets(); !slices.Equal(got, want) {
		t.Fatalf("after removing web:p, pinned and outside:\n got %q\nwant %q", got, want)
	}
	f.serviceCIDRs = f.serviceCIDRs[:1]
	f.apply([]*nat.ServicePort{web6}, epsOf(web6))
	want = []string{"10.96.0.0/12 range", "fd00:96::10/128 clusterIP"}
	if got := f.serviceNets(); !slices.Equal(got, want) {
		t.Fatalf("after removing web:https and two ranges:\n got %q\nwant %q", got, want)
	}

	// A restarted syncer keeps what its first State still holds, without
	// a write, and removes the rest.
	f.open(nat.Options{})
	stats := f.apply([]*nat.ServicePort{web6}, epsOf(web6))
	if stats.Writes != 0 || stats.Deletes != 0 {
		t.Errorf("restart with the same state: %d writes, %d deletes, want none", stats.Writes, stats.Deletes)
	}
	// Until a State names the ranges (nil: not listed yet), a restarted
	// syncer keeps those it finds; its ClusterIPs follow the State.
	f.open(nat.Options{})
	f.serviceCIDRs = nil
	stats = f.apply(nil, nil)
	want = []string{"10.96.0.0/12 range"}
	if got := f.serviceNets(); !slices.Equal(got, want) {
		t.Errorf("restart, ranges not known yet:\n got %q\nwant %q", got, want)
	}
	if stats.Writes != 0 {
		t.Errorf("restart, ranges not known yet: %d writes, want none", stats.Writes)
	}
	f.open(nat.Options{})
	f.serviceCIDRs = []netip.Prefix{}
	f.apply(nil, nil)
	if got := f.serviceNets(); len(got) != 0 {
		t.Errorf("restart with no ranges and no services: the map still holds %q", got)
	}
}
