package kubeproxy

import (
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Tracker collects Service and EndpointSlice events from any source and
// records which services changed since the proxier last took the changes.
// Services are kept as the source gave them and treated as immutable;
// EndpointSlices are kept converted (SliceEndpoints).
type Tracker struct {
	mu       sync.Mutex
	conv     *Converter
	services map[types.NamespacedName]*v1.Service
	// slices are each service's slices; a short list (one per 100
	// endpoints), cheaper than a map per service.
	slices  map[types.NamespacedName][]trackedSlice
	changed map[types.NamespacedName]bool
	// triggerTimes are the EndpointSlice change-trigger times of the pending
	// changes, for network programming latency. As kube-proxy, times before
	// the tracker started are not counted: the initial list is not a change
	// the proxy was slow to program.
	triggerTimes []time.Time
	started      time.Time
	// arriving holds what Transform took off slices on their way into an
	// informer's cache, until the slice's event arrives.
	arriving                   map[*discovery.EndpointSlice]arrival
	serviceEvents, sliceEvents int
	onChange                   func()
}

// trackedSlice is one slice of a service: the object the source gave (for
// telling a resync of it from a change) and its conversion.
type trackedSlice struct {
	src  *discovery.EndpointSlice
	conv *SliceEndpoints
}

// arrival is what Transform took off a slice.
type arrival struct {
	conv    *SliceEndpoints
	trigger time.Time // zero: none that counts
}

// NewTracker returns an empty tracker; onChange (may be nil) is called after
// every recorded change, to trigger a sync. Its slices are converted for a
// node without a name (no endpoint is local); a Proxier's tracker converts
// for its node.
func NewTracker(onChange func()) *Tracker { return newTracker(onChange, &Converter{}) }

func newTracker(onChange func(), conv *Converter) *Tracker {
	return &Tracker{conv: conv, services: map[types.NamespacedName]*v1.Service{},
		slices: map[types.NamespacedName][]trackedSlice{}, changed: map[types.NamespacedName]bool{},
		arriving: map[*discovery.EndpointSlice]arrival{}, started: time.Now(), onChange: onChange}
}

// Transform is an informer transform: Slim, after converting an
// EndpointSlice and taking its endpoints and trigger time off it, for the
// slice's event to find. The informer's cache then keeps each slice's name,
// labels and ports, and nothing else of it is kept but its conversion. A
// slice is transformed once on its way in (client-go does not transform
// what it resyncs from its cache); transforming it again before its event
// changes nothing.
func (t *Tracker) Transform(obj any) (any, error) {
	if s, ok := obj.(*discovery.EndpointSlice); ok {
		t.mu.Lock()
		_, again := t.arriving[s]
		t.mu.Unlock()
		if again {
			return obj, nil
		}
		a := arrival{conv: t.conv.Slice(s)}
		a.trigger, _ = t.triggerTime(s)
		t.mu.Lock()
		t.arriving[s] = a
		t.mu.Unlock()
		s.Annotations, s.Endpoints = nil, nil
	}
	return Slim(obj)
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

// OnService records a Service added or updated (svc) or deleted (svc with
// deleted true).
func (t *Tracker) OnService(svc *v1.Service, deleted bool) {
	key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	t.mu.Lock()
	if deleted {
		delete(t.services, key)
	} else {
		t.services[key] = svc
	}
	t.changed[key] = true
	t.serviceEvents++
	t.mu.Unlock()
	t.notify()
}

// OnEndpointSlice records a slice added, updated or deleted. Headless slices
// and slices without a service name are ignored.
func (t *Tracker) OnEndpointSlice(s *discovery.EndpointSlice, deleted bool) {
	t.mu.Lock()
	arrived, transformed := t.arriving[s]
	delete(t.arriving, s)
	svcName := s.Labels[LabelServiceName]
	if _, headless := s.Labels[LabelHeadless]; svcName == "" || headless { // the label's value is usually empty
		t.mu.Unlock()
		return
	}
	key := types.NamespacedName{Namespace: s.Namespace, Name: svcName}
	list := t.slices[key]
	i := slices.IndexFunc(list, func(o trackedSlice) bool { return o.conv.name == s.Name })
	switch {
	case deleted:
		if i >= 0 {
			list = slices.Delete(list, i, i+1)
		}
		if len(list) == 0 {
			delete(t.slices, key)
		} else {
			t.slices[key] = list
		}
	case !transformed && i >= 0 && list[i].src == s:
		// A resync of what the tracker has: nothing changed (and the
		// cache's copy has no endpoints left to convert).
		t.mu.Unlock()
		return
	default:
		if !transformed {
			arrived.conv = t.conv.Slice(s)
			arrived.trigger, _ = t.triggerTime(s)
		}
		tracked := trackedSlice{src: s, conv: arrived.conv}
		if i >= 0 {
			list[i] = tracked
		} else {
			t.slices[key] = append(list, tracked)
		}
		if !arrived.trigger.IsZero() {
			t.triggerTimes = append(t.triggerTimes, arrived.trigger)
		}
	}
	t.changed[key] = true
	t.sliceEvents++
	t.mu.Unlock()
	t.notify()
}

// ServiceChange is a changed service's current Service and converted
// slices; Service is nil when the service is gone.
type ServiceChange struct {
	Service *v1.Service
	Slices  []*SliceEndpoints
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
		sc := ServiceChange{Service: t.services[key]}
		for _, s := range t.slices[key] {
			sc.Slices = append(sc.Slices, s.conv)
		}
		c.Services[key] = sc
	}
	t.changed = map[types.NamespacedName]bool{} // not clear: a map keeps its largest size
	t.triggerTimes, t.serviceEvents, t.sliceEvents = nil, 0, 0
	return c
}
