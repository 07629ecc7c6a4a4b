package bpftest_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/sluice-net/sluice/gen/bpftest"
)

// Build a TCP SYN as the programs receive it (Ethernet, IPv4, TCP, valid
// checksums, padded to the 60 bytes of a minimal frame) and decode it.
func ExampleTCPPacket() {
	frame := bpftest.TCPPacket(netip.MustParseAddrPort("10.0.0.5:40000"), netip.MustParseAddrPort("10.96.0.10:80"), bpftest.SYN)
	dec, err := bpftest.Decode(frame)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(frame), dec.Src, "->", dec.Dst, bpftest.VerifyChecksums(frame))
	// Output: 60 10.0.0.5:40000 -> 10.96.0.10:80 <nil>
}

// A test of one's own runs a packet through Sluice's programs, loaded into
// the kernel, with a Service in the maps: the SYN to the ClusterIP leaves
// for the backend.
func ExampleNewDatapath() {
	_ = func(t *testing.T) {
		d := bpftest.NewDatapath(t, netip.MustParseAddr("10.0.0.1")) // skips (or fails, in CI) without BPF
		d.AddService(bpftest.Service{ID: 1, Front: netip.MustParseAddrPort("10.96.0.10:80"), Proto: 6,
			Backends: []bpftest.Backend{{AP: netip.MustParseAddrPort("10.1.0.7:8080")}}})
		out := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(netip.MustParseAddrPort("10.0.0.5:40000"),
			netip.MustParseAddrPort("10.96.0.10:80"), bpftest.SYN))
		if out.Dst != netip.MustParseAddrPort("10.1.0.7:8080") {
			t.Fatalf("sent to %v", out.Dst)
		}
	}
}
