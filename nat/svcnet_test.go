package nat_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
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

// A ClusterIP enters sl_svcnet_v1 only once its frontends are written: until
// then, a new flow to one of its defined ports must not be refused as one to
// an undefined port. Another writer fills the frontend map behind the
// syncer's back, so the syncer's own count lets the Service in and the
// kernel refuses its frontend.
func TestClusterIPIsAServiceNetworkOnlyAfterItsFrontends(t *testing.T) {
	set, s := syncerWithCapacity(t, sluicemaps.Frontends.Name, 16)
	f := &fixture{t: t, set: set, s: s, node: nat.Node{NodePortIPs: []netip.Addr{nodeIP}}}
	a := svc("a", "10.96.0.50", 80)
	b := svc("b", "10.96.0.51", 80)
	e := map[nat.ServicePortName][]nat.Endpoint{a.Name: eps("10.2.0.1:80"), b.Name: eps("10.2.0.2:80")}
	f.apply([]*nat.ServicePort{a}, e)

	fm, err := sluicemaps.Frontends.In(set)
	if err != nil {
		t.Fatal(err)
	}
	var foreign []gen.SluiceFeKey
	for i := range 16 {
		k := gen.SluiceFeKey{Addr: gen.NetAddr(netip.AddrFrom4([4]byte{10, 97, 0, byte(i)})), Port: gen.NetPort(80), Proto: 6}
		if err := fm.Put(k, gen.SluiceFeValue{SvcId: 999_000 + uint32(i)}, ebpf.UpdateNoExist); err != nil {
			break
		}
		foreign = append(foreign, k)
	}
	if len(foreign) == 16 {
		t.Fatal("the frontend map took 16 more entries: its capacity was not set")
	}

	st := nat.State{Node: f.node, Services: map[nat.ServicePortName]*nat.ServicePort{a.Name: a, b.Name: b}, Endpoints: e}
	if _, err := s.Apply(st); err == nil || !strings.Contains(err.Error(), "frontend updates") {
		t.Fatalf("apply into a frontend map filled behind the syncer: %v, want the frontend step's error", err)
	}
	want := []string{"10.96.0.50/32 clusterIP"}
	if got := f.serviceNets(); !slices.Equal(got, want) {
		t.Fatalf("b's frontend refused: service networks %q, want only a's ClusterIP %q", got, want)
	}

	for _, k := range foreign {
		if err := fm.Delete(k); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Apply(st); err != nil {
		t.Fatalf("apply once the map has room: %v", err)
	}
	want = []string{"10.96.0.50/32 clusterIP", "10.96.0.51/32 clusterIP"}
	if got := f.serviceNets(); !slices.Equal(got, want) {
		t.Fatalf("after the retry: service networks %q, want %q", got, want)
	}
	if _, err := fm.Get(gen.SluiceFeKey{Addr: gen.NetAddr(b.ClusterIP), Port: gen.NetPort(80), Proto: 6}); err != nil {
		t.Fatalf("b's frontend after the retry: %v", err)
	}
}
