// Package k8s translates Kubernetes NetworkPolicies into Sluice's policy
// model. It imports only k8s.io/api types (and apimachinery's label
// matching), never client-go: the agent feeds it from informers.
//
// Semantics (the NetworkPolicy API): a pod selected by at least one policy
// of a type (Ingress, Egress) is isolated for that direction — default deny —
// and allowed what any of those policies' rules allow; a pod no policy
// selects for a direction is not isolated for it. A rule allows traffic from
// (to) any of its peers on any of its ports; no peers means everyone, no
// ports every port. ipBlock except ranges are carved out of their CIDR.
//
// Named ports of ingress rules are the selected pod's own; those of egress
// rules are resolved to the numbers the peer pods give that name (the union,
// when pods disagree).
package k8s
