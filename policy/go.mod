module github.com/sluice-net/sluice/policy

go 1.26

replace (
	github.com/sluice-net/sluice/gen => ../gen
	github.com/sluice-net/sluice/maps => ../maps
)

require (
	github.com/cilium/ebpf v0.22.0
	github.com/sluice-net/sluice/gen v0.0.0-00010101000000-000000000000
)

require (
	github.com/google/gopacket v1.1.19 // indirect
	golang.org/x/sys v0.43.0 // indirect
)
