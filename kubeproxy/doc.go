// Package kubeproxy will own the kube-proxy shim: watching Services, EndpointSlices
// and Nodes, change tracking, the bounded-frequency sync runner, health servers and
// the static manifest source.
package kubeproxy
