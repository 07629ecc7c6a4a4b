// Package policysource follows what Sluice's policy translation reads from a
// cluster — Pods, Namespaces, NetworkPolicies and, where their CRDs are
// installed, ClusterNetworkPolicies, AdminNetworkPolicies,
// BaselineAdminNetworkPolicies and HostEndpoints — and hands it over as a
// k8s.Cluster: from informers (Watch), or from a folder's objects
// (FromObjects). It is the policy's counterpart of package source, and where
// client-go meets package policy/k8s, which stays free of it. Built with
// the tag sluice_nokube it has FromObjects only (see package source).
package policysource

import (
	"time"

	"github.com/sluice-net/sluice/kubeproxy/source"
	"github.com/sluice-net/sluice/policy/k8s"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	npav1alpha1 "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// FromObjects picks the policy inputs out of a folder's objects
// (source.ReadManifests).
func FromObjects(objs []source.Object) k8s.Cluster {
	var c k8s.Cluster
	for _, o := range objs {
		addObject(&c, o.Obj)
	}
	return c
}

// addObject adds obj to c if it is a policy input.
func addObject(c *k8s.Cluster, obj any) {
	switch x := obj.(type) {
	case *v1.Pod:
		c.Pods = append(c.Pods, x)
	case *v1.Namespace:
		c.Namespaces = append(c.Namespaces, x)
	case *netv1.NetworkPolicy:
		c.Policies = append(c.Policies, x)
	case *npav1beta1.ClusterNetworkPolicy:
		c.ClusterNetworkPolicies = append(c.ClusterNetworkPolicies, x)
	case *npav1alpha1.AdminNetworkPolicy:
		c.AdminNetworkPolicies = append(c.AdminNetworkPolicies, x)
	case *npav1alpha1.BaselineAdminNetworkPolicy:
		c.BaselineAdminNetworkPolicies = append(c.BaselineAdminNetworkPolicies, x)
	case *k8s.HostEndpoint:
		c.HostEndpoints = append(c.HostEndpoints, x)
	case *v1.Node:
		c.Nodes = append(c.Nodes, x)
	}
}

// DefaultMinInterval is how close together two updates may follow by
// default: an update costs milliseconds, a policy must hold soon after it is
// created (BenchmarkPolicyEnforcement: with 200 ms, a policy created within
// 200 ms of the last update waited out the rest; bench/README.md), and a burst
// of changes still coalesces.
const DefaultMinInterval = 20 * time.Millisecond
