package kubeproxy

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sluice-net/sluice/nat"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Tracker collects Service and EndpointSlice events from any source and
// records which services changed since the proxier last took the changes.
// It keeps what it is given converted (Converter.ServicePorts, SliceEndpoints),
// not the objects.
type Tracker struct {
	mu       sync.Mutex
	conv     *Converter
	services map[types.NamespacedName]*trackedService
	// slices are each service's slices; a short list (one per 100
	// endpoints), cheaper than a map per service.
	slices  map[types.NamespacedName][]trackedSlice
	changed map[types.NamespacedName]bool
	// triggerTimes are the EndpointSlice change-trigger times of the pending
	// changes, for network programming latency. As kube-proxy, times before
	// the tracker started are not counted: the initial list is not a change
	// the proxy was slow to program.
	triggerTimes               []time.Time
	started                    time.Time
	serviceEvents, sliceEvents int
	onChange                   func()
}

// trackedService is a Service's conversion, with what tells a resync of the
// Service from a change: its resource version, and for sources without
// versions (manifests) the object given. It is not changed once made: an
// informer's cache shares it (cachedService).
type trackedService struct {
	version string
	src     *v1.Service // nil from an informer
	ports   []*nat.ServicePort
	err     error
}

// trackedSlice is one slice of a service: its conversion and, as for a
// Service, its version and the object a source without versions gave.
type trackedSlice struct {
	version string
	src     *discovery.EndpointSlice // nil from an informer
	conv    *SliceEndpoints
}

// NewTracker returns an empty tracker; onChange (may be nil) is called after
// every recorded change, to trigger a sync. Its slices are converted for a
// node without a name (no endpoint is local); a Proxier's tracker converts
// for its node.
func NewTracker(onChange func()) *Tracker { return newTracker(onChange, &Converter{}) }

func newTracker(onChange func(), conv *Converter) *Tracker {
	return &Tracker{conv: conv, services: map[types.NamespacedName]*trackedService{},
		slices: map[types.NamespacedName][]trackedSlice{}, changed: map[types.NamespacedName]bool{},
		started: time.Now(), onChange: onChange}
}

// Transform is an informer transform: it converts a Service or an
// EndpointSlice on its way into the informer's cache and puts in its place
// what the cache then keeps of it, the object's namespace, name, resource
// version and conversion: a few dozen bytes where the object took hundreds
// with its metadata, and nothing the tracker does not keep anyway. The
// informer's events then carry these, for OnTransformed. Other objects are
// Slim'd.
//
// An object the tracker has at the same resource version (a relist hands
// back every object, and the informer tells listeners of an unchanged one
// only at their resync) is not converted again: it gets the tracker's
// conversion, and its event changes nothing. Transforming what Transform
// returned returns it.
func (t *Tracker) Transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		key := types.NamespacedName{Namespace: intern(o.Namespace), Name: o.Name}
		t.mu.Lock()
		cur := t.services[key]
		t.mu.Unlock()
		c := &cachedService{cachedKey: cachedKey{key, o.ResourceVersion}, conv: cur}
		if cur == nil || !cur.unchanged(o) {
			c.conv = t.convertService(o)
			c.conv.src = nil // the cache must not keep the object
		}
		return c, nil
	case *discovery.EndpointSlice:
		c := &cachedSlice{cachedKey: cachedKey{types.NamespacedName{Namespace: intern(o.Namespace), Name: o.Name}, o.ResourceVersion},
			service: intern(sliceService(o))}
		t.mu.Lock()
		cur, known := t.trackedSlice(o)
		t.mu.Unlock()
		if known && cur.unchanged(o) {
			c.conv = cur.conv
		} else {
			c.conv = t.conv.Slice(o)
			c.trigger, _ = t.triggerTime(o)
		}
		return c, nil
	}
	return Slim(obj)
}

// OnTransformed records an informer's event (added or updated, or deleted)
// for an object Transform returned. A Service or an EndpointSlice that was
// not transformed is recorded as by OnService and OnEndpointSlice.
func (t *Tracker) OnTransformed(obj any, deleted bool) {
	switch o := obj.(type) {
	case *cachedService:
		t.recordService(o.key, o.conv, deleted)
	case *cachedSlice:
		t.recordSlice(o.service, o.key, trackedSlice{version: o.version, conv: o.conv}, o.trigger, deleted)
	case *v1.Service:
		t.OnService(o, deleted)
	case *discovery.EndpointSlice:
		t.OnEndpointSlice(o, deleted)
	default:
		panic(fmt.Sprintf("informer delivered %T", obj))
	}
}

// OnTransformedUpdate records an informer's update of an object Transform
// returned, from the object before (old) and after. A slice relabelled to
// another service, or to none, leaves the service it was filed under: the
// EndpointSlice controller never does that (it replaces a slice), but
// another controller, or a person, may.
func (t *Tracker) OnTransformedUpdate(old, obj any) {
	switch o := old.(type) {
	case *cachedSlice:
		if n, ok := obj.(*cachedSlice); ok && n.service != o.service {
			t.recordSlice(o.service, o.key, trackedSlice{version: o.version, conv: o.conv}, time.Time{}, true)
		}
	case *discovery.EndpointSlice:
		if n, ok := obj.(*discovery.EndpointSlice); ok && sliceService(n) != sliceService(o) {
			t.OnEndpointSlice(o, true)
		}
	}
	t.OnTransformed(obj, false)
}

// unchanged tells whether got is what the tracker converted: the same
// object, or one at the same resource version (sources without versions,
// as manifests, give none: then only the same object is).
func (s *trackedService) unchanged(got *v1.Service) bool {
	return s.src == got || got.ResourceVersion != "" && got.ResourceVersion == s.version
}

func (s trackedSlice) unchanged(got *discovery.EndpointSlice) bool {
	return s.src == got || got.ResourceVersion != "" && got.ResourceVersion == s.version
}

// trackedSlice finds s's service and the tracker's record of s in it.
func (t *Tracker) trackedSlice(s *discovery.EndpointSlice) (trackedSlice, bool) {
	list := t.slices[types.NamespacedName{Namespace: s.Namespace, Name: sliceService(s)}]
	if i := slices.IndexFunc(list, func(o trackedSlice) bool { return o.conv.name == s.Name }); i >= 0 {
		return list[i], true
	}
	return trackedSlice{}, false
}

// triggerTime is s's change-trigger time, when it has one that counts.
func (t *Tracker) triggerTime(s *discovery.EndpointSlice) (time.Time, bool) {
	ts, err := time.Parse(time.RFC3339Nano, s.Annotations[AnnotationTriggerTime])
	if err != nil || ts.Before(t.started) {
		return time.Time{}, false
	}
	return ts, true
}

func (t *Tracker) notify() {
	if t.onChange != nil {
		t.onChange()
	}
}

func (t *Tracker) convertService(svc *v1.Service) *trackedService {
	ports, err := t.conv.ServicePorts(svc)
	return &trackedService{version: svc.ResourceVersion, src: svc, ports: ports, err: err}
}

// OnService records a Service added or updated (svc) or deleted (svc with
// deleted true).
func (t *Tracker) OnService(svc *v1.Service, deleted bool) {
	key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	var conv *trackedService
	if !deleted {
		t.mu.Lock()
		cur := t.services[key]
		t.mu.Unlock()
		if cur != nil && cur.unchanged(svc) {
			return // a resync of what the tracker has
		}
		conv = t.convertService(svc)
	}
	t.recordService(key, conv, deleted)
}

// recordService records key's conversion (none when deleted); the
// conversion the tracker has is no change.
func (t *Tracker) recordService(key types.NamespacedName, conv *trackedService, deleted bool) {
	t.mu.Lock()
	switch cur := t.services[key]; {
	case deleted:
		delete(t.services, key)
	case cur == conv:
		t.mu.Unlock()
		return
	default:
		t.services[key] = conv
	}
	t.changed[key] = true
	t.serviceEvents++
	t.mu.Unlock()
	t.notify()
}

// sliceService is the name of the service a slice is filed under: its
// service name label, or "" for a headless service's slice (the label's
// value is usually empty).
func sliceService(s *discovery.EndpointSlice) string {
	if _, headless := s.Labels[LabelHeadless]; headless {
		return ""
	}
	return s.Labels[LabelServiceName]
}

// OnEndpointSlice records a slice added, updated or deleted. Headless slices
// and slices without a service name are ignored. An update of a slice
// relabelled to another service is its deletion (the slice before) and its
// addition (after): OnTransformedUpdate.
func (t *Tracker) OnEndpointSlice(s *discovery.EndpointSlice, deleted bool) {
	svcName := sliceService(s)
	tracked := trackedSlice{version: s.ResourceVersion, src: s}
	var trigger time.Time
	if !deleted && svcName != "" {
		t.mu.Lock()
		cur, known := t.trackedSlice(s)
		t.mu.Unlock()
		if known && cur.unchanged(s) {
			return // a resync of what the tracker has
		}
		tracked.conv = t.conv.Slice(s)
		trigger, _ = t.triggerTime(s)
	}
	t.recordSlice(svcName, types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, tracked, trigger, deleted)
}

// recordSlice records the slice key (its name in key.Name) of service
// svcName (none: ignored): its conversion, or its deletion. The conversion
// the tracker has is no change.
func (t *Tracker) recordSlice(svcName string, key types.NamespacedName, tracked trackedSlice, trigger time.Time, deleted bool) {
	if svcName == "" {
		return
	}
	svc := types.NamespacedName{Namespace: key.Namespace, Name: svcName}
	t.mu.Lock()
	list := t.slices[svc]
	i := slices.IndexFunc(list, func(o trackedSlice) bool { return o.conv.name == key.Name })
	switch {
	case deleted:
		if i >= 0 {
			list = slices.Delete(list, i, i+1)
		}
		if len(list) == 0 {
			delete(t.slices, svc)
		} else {
			t.slices[svc] = list
		}
	case i >= 0 && list[i].conv == tracked.conv:
		t.mu.Unlock()
		return
	default:
		if i >= 0 {
			list[i] = tracked
		} else {
			t.slices[svc] = append(list, tracked)
		}
		if !trigger.IsZero() {
			t.triggerTimes = append(t.triggerTimes, trigger)
		}
	}
	t.changed[svc] = true
	t.sliceEvents++
	t.mu.Unlock()
	t.notify()
}

// ServiceChange is a changed service's converted Service and slices.
type ServiceChange struct {
	// Ports are the Service's ports (Converter.ServicePorts): none when the
	// Service is gone, is not for this proxy, or is malformed (Err).
	Ports  []*nat.ServicePort
	Err    error
	Slices []*SliceEndpoints
}

// Changes is what TakeChanges hands over.
type Changes struct {
	Services     map[types.NamespacedName]ServiceChange
	TriggerTimes []time.Time
	// ServiceEvents and SliceEvents count the events since the last take.
	ServiceEvents, SliceEvents int
}

// TakeChanges returns the services that changed since the last call, with their
// current objects, and forgets them.
func (t *Tracker) TakeChanges() Changes {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := Changes{Services: make(map[types.NamespacedName]ServiceChange, len(t.changed)),
		TriggerTimes: t.triggerTimes, ServiceEvents: t.serviceEvents, SliceEvents: t.sliceEvents}
	for key := range t.changed {
		var sc ServiceChange
		if svc := t.services[key]; svc != nil {
			sc.Ports, sc.Err = svc.ports, svc.err
		}
		for _, s := range t.slices[key] {
			sc.Slices = append(sc.Slices, s.conv)
		}
		c.Services[key] = sc
	}
	t.changed = map[types.NamespacedName]bool{} // not clear: a map keeps its largest size
	t.triggerTimes, t.serviceEvents, t.sliceEvents = nil, 0, 0
	return c
}
