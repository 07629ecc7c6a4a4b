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
// Named ports of ingress rules are the selected pod's own. Those of egress
// rules are the destination's: a named port exists only on pods, so the rule
// allows the pods the peer reaches (any namespace its selectors name; for an
// ipBlock, the pods inside it; with no peer, every pod) each on the number it
// gives the name — pods that disagree each get their own number, not the
// union. A container port without a protocol is TCP, as the API server
// defaults it. Translation runs again whenever pods, namespaces or policies
// change, so names follow the pods.
//
// Translate translates one state of the cluster; a Translator translates
// state after state, keeping between them what unchanged objects determine
// (the pod index, parsed selectors, and each endpoint's translation while
// its pod, its namespace's policies and the pods its peers select stay
// the same), as the agent's Binder does. Its result is always Translate's.
// Slim, an informer transform, keeps of each object what a translation
// reads.
package k8s
