module github.com/sluice-net/sluice/gen

go 1.26

require (
	github.com/cilium/ebpf v0.22.0
	golang.org/x/sys v0.43.0
)

require github.com/google/gopacket v1.1.19

tool github.com/cilium/ebpf/cmd/bpf2go
