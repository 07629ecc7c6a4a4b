// Package kubernetes is a test-only module: it builds upstream Kubernetes at
// the version matching client-go for Sluice's integration tests and for the
// conformance cluster in test/cluster. The kube-apiserver and kube-proxy have
// small wrappers in cmd/; kubelet, kube-controller-manager, kube-scheduler,
// kubectl and agnhost are built straight from their upstream packages (the
// tool directives in go.mod pin them); e2e/ is the upstream e2e suite
// narrowed to sig-network. No other module depends on it.
package kubernetes
