// Package conntrack will own the conntrack scanner and its entry scanners (timeouts,
// stale NAT), decoding of entries for people, and flushing.
package conntrack
