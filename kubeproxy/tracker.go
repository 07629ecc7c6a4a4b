package kubeproxy

import (
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Tracker collects Service and EndpointSlice events from any source and
// records which services changed since the proxier last took the changes.
// Objects are kept as the source gave them and treated as immutable.
type Tracker struct {
	mu       sync.Mutex
	services map[types.NamespacedName]*v1.Service
	slices   map[types.NamespacedName]map[string]*discovery.EndpointSlice // by service, by slice name
	changed  map[types.NamespacedName]bool
	// triggerTimes are the EndpointSlice change-trigger times of the pending
	// changes, for network programming latency.
	triggerTimes               []time.Time
	serviceEvents, sliceEvents int
	onChange                   func()
}

// NewTracker returns an empty tracker; onChange (may be nil) is called after
// every recorded change, to trigger a sync.
func NewTracker(onChange func()) *Tracker {
	return &Tracker{services: map[types.NamespacedName]*v1.Service{},
		slices: map[types.NamespacedName]map[string]*discovery.EndpointSlice{}, changed: map[types.NamespacedName]bool{},
		onChange: onChange}
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
	svcName := s.Labels[LabelServiceName]
	if _, headless := s.Labels[LabelHeadless]; svcName == "" || headless { // the label's value is usually empty
		return
	}
	key := types.NamespacedName{Namespace: s.Namespace, Name: svcName}
	t.mu.Lock()
	if deleted {
		delete(t.slices[key], s.Name)
		if len(t.slices[key]) == 0 {
			delete(t.slices, key)
		}
	} else {
		if t.slices[key] == nil {
			t.slices[key] = map[string]*discovery.EndpointSlice{}
		}
		t.slices[key][s.Name] = s
		if ts, err := time.Parse(time.RFC3339Nano, s.Annotations[AnnotationTriggerTime]); err == nil {
			t.triggerTimes = append(t.triggerTimes, ts)
		}
	}
	t.changed[key] = true
	t.sliceEvents++
	t.mu.Unlock()
	t.notify()
}

// ServiceChange is a changed service's current objects; Service is nil when the
// service is gone.
type ServiceChange struct {
	Service *v1.Service
	Slices  []*discovery.EndpointSlice
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
			sc.Slices = append(sc.Slices, s)
		}
		c.Services[key] = sc
	}
	clear(t.changed)
	t.triggerTimes, t.serviceEvents, t.sliceEvents = nil, 0, 0
	return c
}
