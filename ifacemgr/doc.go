// Package ifacemgr will own the interface monitor, interface classification,
// attaching and detaching programs, the interface-state map, workload and host
// endpoints, the dirty-set apply loop and cleanup.
package ifacemgr
