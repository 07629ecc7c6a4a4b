package k8s

import (
	"maps"
	"slices"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Most updates of a Pod in a live cluster change nothing a translation reads:
// readiness and container statuses, conditions, annotations, and every
// object again at each informer resync. The functions below say which
// updates can change Translate's result, so that a caller translates again
// only for those. They must follow what Translate reads; each field below is
// named where it is read (podIPs, namedPort, the pod index, the namespace
// labels).

// PodChangeMatters tells whether replacing old by new can change a
// translation: the pod's identity, labels, node, host networking, IPs or
// container ports differ.
func PodChangeMatters(old, new *v1.Pod) bool {
	return old.Namespace != new.Namespace || old.Name != new.Name ||
		!maps.Equal(old.Labels, new.Labels) ||
		old.Spec.NodeName != new.Spec.NodeName || old.Spec.HostNetwork != new.Spec.HostNetwork ||
		old.Status.PodIP != new.Status.PodIP || !slices.Equal(old.Status.PodIPs, new.Status.PodIPs) ||
		!slices.EqualFunc(old.Spec.Containers, new.Spec.Containers, func(a, b v1.Container) bool {
			return slices.Equal(a.Ports, b.Ports)
		})
}

// NamespaceChangeMatters tells whether replacing old by new can change a
// translation: the namespace's name or labels differ.
func NamespaceChangeMatters(old, new *v1.Namespace) bool {
	return old.Name != new.Name || !maps.Equal(old.Labels, new.Labels)
}

// NodeChangeMatters tells whether replacing old by new can change a
// translation: the node's name, labels or addresses differ (not its
// heartbeats, conditions or images, which change far more often).
func NodeChangeMatters(old, new *v1.Node) bool {
	return old.Name != new.Name || !maps.Equal(old.Labels, new.Labels) ||
		!slices.Equal(old.Status.Addresses, new.Status.Addresses)
}

// Slim returns what Translate reads of an object, for an informer's
// transform (the informer's cache then keeps only that): of a Pod, what
// PodChangeMatters names (its identity, labels, node, host networking, IPs,
// and each container's name and ports); of a Namespace, its name and
// labels; of a Node, its name, labels and addresses; a NetworkPolicy without its managed fields and annotations.
// Other objects are returned as they are. A node's informers hold every
// Pod of the cluster, and a Pod's spec and status are most of its
// kilobytes.
func Slim(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Pod:
		out := &v1.Pod{ObjectMeta: slimMeta(o.ObjectMeta),
			Spec:   v1.PodSpec{NodeName: o.Spec.NodeName, HostNetwork: o.Spec.HostNetwork},
			Status: v1.PodStatus{PodIP: o.Status.PodIP, PodIPs: o.Status.PodIPs}}
		for _, c := range o.Spec.Containers {
			out.Spec.Containers = append(out.Spec.Containers, v1.Container{Name: c.Name, Ports: c.Ports})
		}
		return out, nil
	case *v1.Namespace:
		return &v1.Namespace{ObjectMeta: slimMeta(o.ObjectMeta)}, nil
	case *v1.Node:
		return &v1.Node{ObjectMeta: slimMeta(o.ObjectMeta), Status: v1.NodeStatus{Addresses: o.Status.Addresses}}, nil
	case *netv1.NetworkPolicy:
		o.ManagedFields, o.Annotations = nil, nil
	}
	return obj, nil
}

func slimMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion, Labels: m.Labels}
}
