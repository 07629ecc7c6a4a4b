package ifacemgr

import (
	"net/netip"
	"testing"
)

func TestHostEndpointResolution(t *testing.T) {
	ip := netip.MustParseAddr
	e := endpoints{workloads: map[string]WorkloadEndpoint{}, hosts: map[string]HostEndpoint{
		"hep-b-name": {ID: "hep-b-name", Iface: "eth1"},
		"hep-c-ip":   {ID: "hep-c-ip", ExpectedIPs: []netip.Addr{ip("192.0.2.10")}},
		"hep-z-all":  {ID: "hep-z-all", Iface: WildcardIface},
	}}
	cases := []struct {
		iface string
		addrs []netip.Addr
		class Class
		want  string
	}{
		{"eth1", nil, Data, "hep-b-name"},                             // by name (beats the wildcard: lower id)
		{"eth2", []netip.Addr{ip("192.0.2.10")}, Data, "hep-c-ip"},    // by expected IP
		{"eth3", []netip.Addr{ip("198.51.100.1")}, Data, "hep-z-all"}, // wildcard: every data interface
		{"tunl0", nil, L3, ""},                                        // the wildcard is for data interfaces only
		{"eth1", []netip.Addr{ip("192.0.2.10")}, Data, "hep-b-name"},  // name and IP match: lowest id wins
	}
	for _, c := range cases {
		ep, ok := e.endpointFor(c.iface, c.addrs, c.class)
		if got := map[bool]string{true: ep.ID}[ok]; got != c.want || (ok && !ep.Host) {
			t.Errorf("%s %v: endpoint %q, want %q", c.iface, c.addrs, got, c.want)
		}
	}
	// A lower id takes over a conflict.
	e.hosts["hep-a-all"] = HostEndpoint{ID: "hep-a-all", Iface: WildcardIface}
	if ep, _ := e.endpointFor("eth1", nil, Data); ep.ID != "hep-a-all" {
		t.Errorf("conflict: %q, want the lowest id", ep.ID)
	}
}

func TestShadowedWorkloadEndpointIsPromoted(t *testing.T) {
	e := endpoints{workloads: map[string]WorkloadEndpoint{
		"ns/pod-b": {ID: "ns/pod-b", Iface: "cali1"},
		"ns/pod-a": {ID: "ns/pod-a", Iface: "cali1"}, // e.g. the pod's replacement, same interface name
	}, hosts: map[string]HostEndpoint{}}
	if ep, _ := e.endpointFor("cali1", nil, Workload); ep.ID != "ns/pod-a" {
		t.Fatalf("winner %q", ep.ID)
	}
	delete(e.workloads, "ns/pod-a")
	if ep, ok := e.endpointFor("cali1", nil, Workload); !ok || ep.ID != "ns/pod-b" {
		t.Fatalf("shadowed endpoint not promoted: %q %v", ep.ID, ok)
	}
	if _, ok := e.endpointFor("cali2", nil, Workload); ok {
		t.Fatal("endpoint bound to the wrong interface")
	}
}
