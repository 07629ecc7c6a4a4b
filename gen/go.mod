module github.com/sluice-net/sluice/gen

go 1.26.6

require (
	github.com/cilium/ebpf v0.22.0
	golang.org/x/sys v0.48.0
)

require github.com/google/gopacket v1.1.19

require (
	github.com/sluice-net/sluice/netlab v0.1.0
	golang.org/x/net v0.59.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
)

tool github.com/cilium/ebpf/cmd/bpf2go

replace github.com/sluice-net/sluice/netlab => ../netlab
