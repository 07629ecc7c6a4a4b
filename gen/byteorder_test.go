package gen

import (
	"net/netip"
	"testing"
	"unsafe"
)

func TestNetworkOrderFieldsHoldWireBytes(t *testing.T) {
	a := netip.MustParseAddr("10.1.2.3")
	v := NetAddr(a)
	if b := (*[4]byte)(unsafe.Pointer(&v)); *b != [4]byte{10, 1, 2, 3} {
		t.Fatalf("address bytes %v", *b)
	}
	if AddrFromNet(v) != a {
		t.Fatal("address round trip")
	}
	p := NetPort(0x1f90)
	if b := (*[2]byte)(unsafe.Pointer(&p)); *b != [2]byte{0x1f, 0x90} {
		t.Fatalf("port bytes %v", *b)
	}
	if PortFromNet(p) != 0x1f90 {
		t.Fatal("port round trip")
	}
	n := NetUint32(7)
	if b := (*[4]byte)(unsafe.Pointer(&n)); *b != [4]byte{0, 0, 0, 7} {
		t.Fatalf("uint32 bytes %v", *b)
	}
}
