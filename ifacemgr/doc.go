// Package ifacemgr decides which programs run on which interface and cgroup,
// attaches and detaches them, and leaves nothing behind.
//
// So far it holds the attach primitives: XDP in driver mode with a generic-mode
// fallback, and the socket load-balancing programs on a cgroup. The interface
// monitor, classification, interface-state map and apply loop build on them.
package ifacemgr
