package agent

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/ifacemgr"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/policy/k8s"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeInterfaces records the bindings the feed makes, at a routing
// generation the test sets.
type fakeInterfaces struct {
	routing uint64
	bound   map[string]string // endpoint id -> interface
}

func (f *fakeInterfaces) RoutingGeneration() uint64 { return f.routing }
func (f *fakeInterfaces) SetWorkloadEndpoint(ep ifacemgr.WorkloadEndpoint) {
	f.bound[ep.ID] = ep.Iface
}
func (f *fakeInterfaces) RemoveWorkloadEndpoint(id string) { delete(f.bound, id) }
func (f *fakeInterfaces) PoliciesChanged()                 {}
func (f *fakeInterfaces) Apply() ifacemgr.ApplyResult      { return ifacemgr.ApplyResult{} }

// countingFinder finds pod 10.1.0.N behind caliN, and counts the lookups.
type countingFinder struct{ lookups *int }

func (c countingFinder) Interface(ip netip.Addr) (string, error) {
	*c.lookups++
	return fmt.Sprintf("cali%d", ip.As4()[3]), nil
}
func (countingFinder) Close() {}

// A pod's interface is looked up when its address is new or the routing
// may have changed since (the interface manager's routing generation, 0
// while it follows nothing); otherwise the one found is kept, and a policy
// change costs no route lookups.
func TestPolicyFeedLooksUpInterfacesOnlyWhenRoutingMayHaveChanged(t *testing.T) {
	bpftest.Require(t)
	set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	objs, err := gen.Load(gen.LoadOptions{Maps: set.All()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	feed, err := newPolicyFeed(set, objs, "", "node-a", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ifaces := &fakeInterfaces{routing: 1, bound: map[string]string{}}
	lookups := 0
	feed.ifaces = ifaces
	feed.openPods = func(string) (podFinder, error) { return countingFinder{&lookups}, nil }
	pod := func(name, ip string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: name}, Spec: v1.PodSpec{NodeName: "node-a"}, Status: v1.PodStatus{PodIP: ip}}
	}
	c := k8s.Cluster{Pods: []*v1.Pod{pod("a", "10.1.0.2"), pod("b", "10.1.0.3")}}
	step := func(what string, wantLookups int) {
		t.Helper()
		lookups = 0
		feed.Update(c)
		if lookups != wantLookups {
			t.Fatalf("%s: %d lookups, want %d", what, lookups, wantLookups)
		}
		for _, p := range c.Pods {
			want := fmt.Sprintf("cali%d", netip.MustParseAddr(p.Status.PodIP).As4()[3])
			if got := ifaces.bound["demo/"+p.Name]; got != want {
				t.Fatalf("%s: pod %s bound to %q, want %s", what, p.Name, got, want)
			}
		}
	}
	step("first update", 2)
	step("nothing moved", 0)
	c.Pods = append(c.Pods, pod("c", "10.1.0.4"))
	step("a pod added", 1)
	c.Pods[0] = pod("a", "10.1.0.9")
	step("a pod readdressed", 1)
	ifaces.routing++
	step("the routing moved", 3)
	ifaces.routing = 0
	step("routing not followed", 3)
	step("routing still not followed", 3)
}
