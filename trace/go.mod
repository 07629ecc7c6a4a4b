module github.com/sluice-net/sluice/trace

go 1.26.6

require (
	github.com/cilium/ebpf v0.22.0
	github.com/google/gopacket v1.1.19
	github.com/sluice-net/sluice/conntrack v0.1.0
	github.com/sluice-net/sluice/gen v0.1.0
	github.com/sluice-net/sluice/maps v0.1.0
)

require (
	github.com/sluice-net/sluice/netlab v0.1.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

replace (
	github.com/sluice-net/sluice/conntrack => ../conntrack
	github.com/sluice-net/sluice/gen => ../gen
	github.com/sluice-net/sluice/maps => ../maps
)

replace github.com/sluice-net/sluice/netlab => ../netlab
