// Package binding keeps the local pods' NetworkPolicies compiled and
// installed for the interface manager: it translates the cluster's objects
// (policy/k8s), writes the IP sets, installs each endpoint direction's policy
// once per distinct content (policy.Runtime), and hands out the slots an
// interface's state points to, retiring the slots it no longer uses.
//
// A Binder takes over what a previous process left: the program array and
// the interface-state map are pinned, so interfaces keep their policies while
// the agent restarts. Until its first Update, a Binder gives every interface
// the slots it already has, so no pod is left unprotected or judged by
// another pod's policy meanwhile; after it, an unchanged policy keeps its
// slot without being loaded again.
package binding
