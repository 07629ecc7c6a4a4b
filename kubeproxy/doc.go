// Package kubeproxy makes Sluice a drop-in for kube-proxy: it follows Services,
// EndpointSlices and this Node (from the API server or a folder of manifests),
// turns them into the nat model by kube-proxy's rules, and drives the NAT syncer
// and conntrack flushing at a bounded rate, with kube-proxy's health endpoints
// and metrics.
package kubeproxy
