// Package kubeproxy makes Sluice a drop-in for kube-proxy: the change tracker
// takes Services, EndpointSlices and this Node, the converter turns them into
// the nat model by kube-proxy's rules, and the proxier drives the NAT syncer
// and conntrack flushing at a bounded rate (Runner). As Kubernetes splits
// pkg/proxy, the rest are packages of their own: source (informers, or a
// folder of manifests), healthcheck (kube-proxy's health endpoints) and
// metrics. It writes only through the nat syncer and the conntrack flusher
// it is given.
package kubeproxy
