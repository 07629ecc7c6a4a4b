package ifacemgr

import "testing"

func TestShadowedWorkloadEndpointIsPromoted(t *testing.T) {
	e := endpoints{workloads: map[string]WorkloadEndpoint{
		"ns/pod-b": {ID: "ns/pod-b", Iface: "cali1"},
		"ns/pod-a": {ID: "ns/pod-a", Iface: "cali1"}, // e.g. the pod's replacement, same interface name
	}}
	if ep, _ := e.endpointFor("cali1", Workload); ep.ID != "ns/pod-a" {
		t.Fatalf("winner %q", ep.ID)
	}
	delete(e.workloads, "ns/pod-a")
	if ep, ok := e.endpointFor("cali1", Workload); !ok || ep.ID != "ns/pod-b" {
		t.Fatalf("shadowed endpoint not promoted: %q %v", ep.ID, ok)
	}
	if _, ok := e.endpointFor("cali2", Workload); ok {
		t.Fatal("endpoint bound to the wrong interface")
	}
}
