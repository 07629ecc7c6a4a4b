module github.com/sluice-net/sluice/ifacemgr

go 1.26.6

require (
	github.com/cilium/ebpf v0.22.0
	github.com/sluice-net/sluice/gen v0.1.0
	github.com/sluice-net/sluice/maps v0.1.0
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	golang.org/x/sys v0.48.0
)

require (
	github.com/google/gopacket v1.1.19 // indirect
	github.com/sluice-net/sluice/netlab v0.1.0
)

replace (
	github.com/sluice-net/sluice/gen => ../gen
	github.com/sluice-net/sluice/maps => ../maps
)

replace github.com/sluice-net/sluice/netlab => ../netlab
