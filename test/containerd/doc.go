// Package containerd is a test-only module: it pins containerd (the daemon,
// its runc shim and ctr) for the conformance cluster in test/cluster. Debian
// ships containerd 1.6, which the kubelet of Kubernetes 1.37 no longer
// supports. No other module depends on it.
package containerd
