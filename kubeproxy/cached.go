package kubeproxy

import (
	"time"
	interning "unique"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// cachedKey is what an informer needs of an object it caches: its key
// (namespace and name) and version.
type cachedKey struct {
	key     types.NamespacedName
	version string
}

// GetObjectMeta gives the informer's key function and its cache the
// object's name, namespace and resource version. It is made on each call
// (for the few calls per event) rather than kept: an ObjectMeta is 240
// bytes.
func (k *cachedKey) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: k.key.Namespace, Name: k.key.Name, ResourceVersion: k.version}
}

func (k *cachedKey) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// cachedService is what an informer's cache keeps of a Service
// (Tracker.Transform): the tracker's conversion of it, shared.
type cachedService struct {
	cachedKey
	conv *trackedService
}

func (c *cachedService) DeepCopyObject() runtime.Object { out := *c; return &out }

// cachedSlice is what an informer's cache keeps of an EndpointSlice: the
// service it belongs to ("" for none this proxy serves: headless or
// unlabelled) and its conversion, shared with the tracker; trigger is its
// change-trigger time, when one counts.
type cachedSlice struct {
	cachedKey
	service string
	conv    *SliceEndpoints
	trigger time.Time
}

func (c *cachedSlice) DeepCopyObject() runtime.Object { out := *c; return &out }

// intern returns the one copy of s that every caller gets: a cluster has a
// few namespaces and every cached object names one.
func intern(s string) string { return interning.Make(s).Value() }
