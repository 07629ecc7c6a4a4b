package k8s

import (
	"maps"
	"slices"

	v1 "k8s.io/api/core/v1"
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
