module github.com/sluice-net/sluice/conntrack

go 1.26.6

require (
	github.com/mdlayher/netlink v1.7.2
	github.com/sluice-net/sluice/gen v0.1.0
	github.com/sluice-net/sluice/maps v0.1.0
	github.com/ti-mo/conntrack v0.6.0
	github.com/ti-mo/netfilter v0.5.3
)

require (
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/josharian/native v1.1.0 // indirect
	github.com/mdlayher/socket v0.5.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/sluice-net/sluice/netlab v0.1.0 // indirect
	golang.org/x/net v0.59.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

require (
	github.com/cilium/ebpf v0.22.0
	github.com/google/gopacket v1.1.19 // indirect
)

replace (
	github.com/sluice-net/sluice/gen => ../gen
	github.com/sluice-net/sluice/maps => ../maps
)

replace github.com/sluice-net/sluice/netlab => ../netlab
