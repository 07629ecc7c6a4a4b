// Package bench will own the gopacket packet builders, per-packet and map-sync
// benchmarks, and the iptables/nftables baselines.
package bench
