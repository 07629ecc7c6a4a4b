package kubeproxy

import (
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// Slim drops from an informer's object what the proxier never reads, before
// the informer's cache keeps it: managed fields (on a small object often
// most of its bytes), owner references, every annotation but an
// EndpointSlice's trigger time, each endpoint's target reference (the Pod
// it names) and deprecated topology, and a Node's image list. (The
// proxier's own Service and EndpointSlice informers keep less still: a
// record of each conversion, Tracker.Transform.)
func Slim(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		o.ManagedFields, o.Annotations, o.OwnerReferences = nil, nil, nil
	case *discovery.EndpointSlice:
		o.ManagedFields, o.OwnerReferences = nil, nil
		for i := range o.Endpoints {
			o.Endpoints[i].TargetRef, o.Endpoints[i].DeprecatedTopology = nil, nil
		}
		if t, ok := o.Annotations[AnnotationTriggerTime]; ok {
			o.Annotations = map[string]string{AnnotationTriggerTime: t}
		} else {
			o.Annotations = nil
		}
	case *v1.Node:
		o.ManagedFields, o.Annotations, o.Status.Images = nil, nil, nil
	}
	return obj, nil
}
