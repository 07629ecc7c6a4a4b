// Package nat will own the service model (independent of Kubernetes types) and the
// NAT syncer that programs the datapath's frontend, backend and affinity maps from it.
package nat
