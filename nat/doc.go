// Package nat turns a model of services and endpoints into the datapath's
// frontend, backend, source-range and affinity maps.
//
// The model (ServicePort, Endpoint) knows nothing about Kubernetes types, so any
// tool can drive it; package kubeproxy translates Kubernetes objects into it.
// Syncer.Apply programs the maps for a whole State, writing only what changed,
// in an order that never lets a packet see a frontend pointing at a missing
// backend. NodeConfig holds the node-wide settings the datapath reads per new
// flow: the SNAT source, masquerading, which traffic is the cluster's own.
package nat
