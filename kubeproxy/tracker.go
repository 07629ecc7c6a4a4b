package kubeproxy

import (
	"slices"
	"sync"
	"time"

	"github.com/sluice-net/sluice/nat"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Tracker collects Service and EndpointSlice events from any source and
// records which services changed since the proxier last took the changes.
// It keeps what it is given converted (Converter.ServicePorts, SliceEndpoints),
// not the objects.
type Tracker struct {
	mu       sync.Mutex
	conv     *Converter
	services map[types.NamespacedName]trackedService
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
	// arriving and arrivingServices hold what Transform took off objects on
	// their way into an informer's cache, until the object's event arrives.
	arriving                   map[*discovery.EndpointSlice]arrival
	arrivingServices           map[*v1.Service]trackedService
	serviceEvents, sliceEvents int
	onChange                   func()
}

// trackedService is a Service: the object the source gave (for telling a
// resync of it from a change) and its conversion.
type trackedService struct {
	src   *v1.Service
	ports []*nat.ServicePort
	err   error
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
	return &Tracker{conv: conv, services: map[types.NamespacedName]trackedService{}, arrivingServices: map[*v1.Service]trackedService{},
		slices: map[types.NamespacedName][]trackedSlice{}, changed: map[types.NamespacedName]bool{},
		arriving: map[*discovery.EndpointSlice]arrival{}, started: time.Now(), onChange: onChange}
}

// Transform is an informer transform: Slim, after converting a Service or
// an EndpointSlice and taking what was converted off it, for the object's
// event to find: a Service's spec and status, a slice's endpoints and
// annotations (its trigger time kept aside). The informer's cache then
// keeps each object's metadata (and a slice's ports), and nothing else of
// it is kept but its conversion. An object is transformed once on its way
// in (client-go does not transform what it resyncs from its cache);
// transforming it again before its event changes nothing. An object the
// tracker has at the same resource version (a relist hands back every
// object, and the informer tells listeners of an unchanged one only at
// their resync) is not converted again: its event, if any, changes nothing.
func (t *Tracker) Transform(obj any) (any, error) {
	if svc, ok := obj.(*v1.Service); ok {
		t.mu.Lock()
		_, again := t.arrivingServices[svc]
		cur, known := t.services[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}]
		t.mu.Unlock()
		if again {
			return obj, nil
		}
		if known && unchanged(cur.src, svc) {
			svc.Spec, svc.Status = v1.ServiceSpec{}, v1.ServiceStatus{}
			return Slim(obj)
		}
		conv := t.convertService(svc)
		t.mu.Lock()
		t.arrivingServices[svc] = conv
		t.mu.Unlock()
		svc.Spec, svc.Status = v1.ServiceSpec{}, v1.ServiceStatus{}
	}
	if s, ok := obj.(*discovery.EndpointSlice); ok {
		t.mu.Lock()
		_, again := t.arriving[s]
		cur, known := t.trackedSlice(s)
		t.mu.Unlock()
		if again {
			return obj, nil
		}
		if known && unchanged(cur.src, s) {
			s.Annotations, s.Endpoints = nil, nil
			return Slim(obj)
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

// unchanged tells whether got is the object the tracker has (have): the
// same one, or one at the same resource version (sources without versions,
// as manifests, give none: then only the same object is).
func unchanged(have, got metav1.Object) bool {
	return have == got || got.GetResourceVersion() != "" && got.GetResourceVersion() == have.GetResourceVersion()
}

// trackedSlice finds s's service and the tracker's record of s in it.
func (t *Tracker) trackedSlice(s *discovery.EndpointSlice) (trackedSlice, bool) {
	list := t.slices[types.NamespacedName{Namespace: s.Namespace, Name: s.Labels[LabelServiceName]}]
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

func (t *Tracker) convertService(svc *v1.Service) trackedService {
	ports, err := t.conv.ServicePorts(svc)
	return trackedService{src: svc, ports: ports, err: err}
}

// OnService records a Service added or updated (svc) or deleted (svc with
// deleted true).
func (t *Tracker) OnService(svc *v1.Service, deleted bool) {
	key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	t.mu.Lock()
	arrived, transformed := t.arrivingServices[svc]
	delete(t.arrivingServices, svc)
	switch cur, known := t.services[key]; {
	case deleted:
		delete(t.services, key)
	case !transformed && known && unchanged(cur.src, svc):
		// A resync of what the tracker has (see OnEndpointSlice).
		t.mu.Unlock()
		return
	case transformed:
		t.services[key] = arrived
	default:
		t.services[key] = t.convertService(svc)
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
	case !transformed && i >= 0 && unchanged(list[i].src, s):
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
		svc := t.services[key]
		sc := ServiceChange{Ports: svc.ports, Err: svc.err}
		for _, s := range t.slices[key] {
			sc.Slices = append(sc.Slices, s.conv)
		}
		c.Services[key] = sc
	}
	t.changed = map[types.NamespacedName]bool{} // not clear: a map keeps its largest size
	t.triggerTimes, t.serviceEvents, t.sliceEvents = nil, 0, 0
	return c
}
