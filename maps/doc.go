// Package maps gives typed access to Sluice's BPF maps: Map[K, V] over
// *ebpf.Map, CachingMap for minimal-diff reconciliation, and the catalogue of
// every map the datapath uses with Open, which creates or reuses pinned maps.
//
// Key and value types are the structs bpf2go generates from bpf/include, so the
// C headers stay the single source of truth for every layout.
package maps
