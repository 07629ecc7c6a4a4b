package kubeproxy_test

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/kubeproxy"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// The tracker keeps each service's slices by name, and counts the trigger
// time of a slice's change once, whether the slice came through an informer
// (Transform converts it and puts what the cache keeps in its place) or
// straight from a source; as kube-proxy, a time before the tracker started
// (the initial list's) does not count.
func TestTrackerKeepsSlicesAndCountsTriggerTimesOfChanges(t *testing.T) {
	tr := kubeproxy.NewTracker(nil)
	withTrigger := func(s *discovery.EndpointSlice, at time.Time) *discovery.EndpointSlice {
		s.Annotations = map[string]string{kubeproxy.AnnotationTriggerTime: at.Format(time.RFC3339Nano), "other": "x"}
		return s
	}
	names := func(c kubeproxy.ServiceChange) []string {
		var out []string
		for _, s := range c.Slices {
			out = append(out, s.Name()+"="+s.Endpoints()[0].Addr.String())
		}
		slices.Sort(out)
		return out
	}
	web := types.NamespacedName{Namespace: "default", Name: "web"}

	// The initial list: times before the tracker started.
	tr.OnEndpointSlice(withTrigger(endpointSlice("web", "web-1", "10.2.0.1"), time.Now().Add(-time.Hour)), false)
	old, err := tr.Transform(withTrigger(endpointSlice("web", "web-2", "10.2.0.2"), time.Now().Add(-time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	tr.OnTransformed(old, false)
	c := tr.TakeChanges()
	if got := names(c.Services[web]); !slices.Equal(got, []string{"web-1=10.2.0.1:8080", "web-2=10.2.0.2:8080"}) {
		t.Fatalf("slices %v", got)
	}
	if len(c.TriggerTimes) != 0 {
		t.Fatalf("trigger times before the tracker started were counted: %v", c.TriggerTimes)
	}

	// Changes: one through the informer's transform, one straight.
	at := time.Now().Add(time.Second).Truncate(time.Microsecond)
	obj, err := tr.Transform(withTrigger(endpointSlice("web", "web-2", "10.2.0.3"), at))
	if err != nil {
		t.Fatal(err)
	}
	checkCached(t, obj, "default/web-2")
	if again, err := tr.Transform(obj); err != nil || again != obj { // idempotent
		t.Fatalf("transform again: %v %v", again, err)
	}
	tr.OnTransformed(obj, false)
	tr.OnEndpointSlice(withTrigger(endpointSlice("web", "web-3", "10.2.0.4"), at.Add(time.Second)), false)
	c = tr.TakeChanges()
	if got := names(c.Services[web]); !slices.Equal(got, []string{"web-1=10.2.0.1:8080", "web-2=10.2.0.3:8080", "web-3=10.2.0.4:8080"}) {
		t.Fatalf("slices after the changes %v", got)
	}
	if !slices.EqualFunc(c.TriggerTimes, []time.Time{at, at.Add(time.Second)}, time.Time.Equal) {
		t.Fatalf("trigger times %v, want %v and a second later", c.TriggerTimes, at)
	}
	// An informer's resync hands back what its cache keeps: not a change,
	// and the endpoints stay.
	tr.OnTransformed(obj, false)
	if c := tr.TakeChanges(); len(c.Services) != 0 {
		t.Fatalf("a resync changed %v", c.Services)
	}

	// Deletions leave the other slices; the last one takes the service's.
	tr.OnEndpointSlice(endpointSlice("web", "web-1"), true)
	tr.OnEndpointSlice(endpointSlice("web", "web-3"), true)
	if got := names(tr.TakeChanges().Services[web]); !slices.Equal(got, []string{"web-2=10.2.0.3:8080"}) {
		t.Fatalf("slices after deletions %v", got)
	}
	tr.OnEndpointSlice(endpointSlice("web", "web-2"), true)
	if c := tr.TakeChanges(); len(c.Services[web].Slices) != 0 || len(c.TriggerTimes) != 0 {
		t.Fatalf("after the last deletion: %+v", c)
	}
}

// A Service is kept converted too: through an informer the transform
// converts it and the cache keeps only its key, version and conversion; a
// resync of what the cache keeps is no change; a malformed Service reports
// its error and has no ports; a deleted one has none either.
func TestTrackerKeepsServicesConverted(t *testing.T) {
	tr := kubeproxy.NewTracker(nil)
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	ports := func(c kubeproxy.ServiceChange) []string {
		var out []string
		for _, p := range c.Ports {
			out = append(out, fmt.Sprintf("%s %v:%d", p.Name.Port, p.ClusterIP, p.Port))
		}
		return out
	}

	obj, err := tr.Transform(svc("web", "10.96.0.10"))
	if err != nil {
		t.Fatal(err)
	}
	checkCached(t, obj, "default/web")
	tr.OnTransformed(obj, false)
	c := tr.TakeChanges().Services[web]
	if got := ports(c); !slices.Equal(got, []string{"http 10.96.0.10:80"}) || c.Err != nil {
		t.Fatalf("ports %v, error %v", got, c.Err)
	}
	tr.OnTransformed(obj, false) // resync
	if c := tr.TakeChanges(); len(c.Services) != 0 {
		t.Fatalf("a resync changed %v", c.Services)
	}

	// Straight from a source, malformed.
	tr.OnService(svc("web", "10.96.0.300"), false)
	c = tr.TakeChanges().Services[web]
	if c.Ports != nil || c.Err == nil || !strings.Contains(c.Err.Error(), "default/web") {
		t.Fatalf("malformed: ports %v, error %v", ports(c), c.Err)
	}
	tr.OnService(svc("web", "10.96.0.11"), false)
	if got := ports(tr.TakeChanges().Services[web]); !slices.Equal(got, []string{"http 10.96.0.11:80"}) {
		t.Fatalf("fixed: ports %v", got)
	}
	tr.OnTransformed(obj, true)
	if c, ok := tr.TakeChanges().Services[web]; !ok || c.Ports != nil || c.Err != nil {
		t.Fatalf("deleted: %v %+v", ok, c)
	}
}

// A relist hands every object to the transform again, and the informer
// tells the tracker of an unchanged one (same resource version) only at
// its next resync, with what its cache keeps: the tracker keeps what it
// converted, and an object at a new version is converted again.
func TestTrackerKeepsConversionsAcrossARelist(t *testing.T) {
	tr := kubeproxy.NewTracker(nil)
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	arrive := func(obj any) {
		t.Helper()
		out, err := tr.Transform(obj)
		if err != nil {
			t.Fatal(err)
		}
		tr.OnTransformed(out, false)
	}
	at := func(rv string, o interface{ SetResourceVersion(string) }) { o.SetResourceVersion(rv) }
	s5, sl5 := svc("web", "10.96.0.10"), endpointSlice("web", "web-1", "10.2.0.1")
	at("5", s5)
	at("5", sl5)
	arrive(s5)
	arrive(sl5)
	tr.TakeChanges()

	// The relist: fresh copies at the same versions. Their events (a
	// resync) change nothing, and the conversions stay.
	s5again, sl5again := svc("web", "10.96.0.10"), endpointSlice("web", "web-1", "10.2.0.1")
	at("5", s5again)
	at("5", sl5again)
	arrive(s5again)
	arrive(sl5again)
	if c := tr.TakeChanges(); len(c.Services) != 0 {
		t.Fatalf("an unchanged relist changed %+v", c.Services)
	}
	tr.OnEndpointSlice(endpointSlice("web", "web-2", "10.2.0.2"), false)
	c := tr.TakeChanges().Services[web]
	if len(c.Ports) != 1 || len(c.Slices) != 2 || len(c.Slices[0].Endpoints()) != 1 {
		t.Fatalf("after the relist: %d ports, %d slices", len(c.Ports), len(c.Slices))
	}

	// A new version is a change.
	sl6 := endpointSlice("web", "web-1", "10.2.0.3")
	at("6", sl6)
	arrive(sl6)
	c = tr.TakeChanges().Services[web]
	if got := c.Slices[0].Endpoints(); c.Slices[0].Name() != "web-1" || len(got) != 1 || got[0].Addr.String() != "10.2.0.3:8080" {
		t.Fatalf("version 6: %v", got)
	}
}

// checkCached checks what Transform put in an object's place: not the
// object, a few dozen bytes, and still an object the informer can key,
// version and tell the kind of.
func checkCached(t *testing.T, obj any, key string) {
	t.Helper()
	switch obj.(type) {
	case *v1.Service, *discovery.EndpointSlice:
		t.Fatalf("the cache keeps the whole object")
	}
	if size := reflect.TypeOf(obj).Elem().Size(); size > 96 {
		t.Errorf("the cache keeps %d bytes per object", size)
	}
	ro, ok := obj.(runtime.Object)
	if !ok {
		t.Fatalf("%T is not a runtime.Object", obj)
	}
	if got, err := cache.MetaNamespaceKeyFunc(ro); err != nil || got != key {
		t.Fatalf("key %q (%v), want %q", got, err, key)
	}
	if m, err := meta.Accessor(ro.DeepCopyObject()); err != nil || m.GetNamespace()+"/"+m.GetName() != key {
		t.Fatalf("a copy's metadata: %v %v", m, err)
	}
	if ro.GetObjectKind() == nil {
		t.Fatal("no object kind")
	}
}
