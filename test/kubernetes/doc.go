// Package kubeapiserver is a test-only module: it builds the real
// kube-apiserver from k8s.io/kubernetes at the version matching client-go, for
// Sluice's integration tests. No other module depends on it.
package kubeapiserver
