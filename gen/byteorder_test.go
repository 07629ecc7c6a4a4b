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

// TestSvcnetKeyRoundTrip: both families key one trie; an IPv4 prefix is
// mapped with 96 more bits, host bits are cleared, and Prefix undoes it.
func TestSvcnetKeyRoundTrip(t *testing.T) {
	for in, want := range map[string]struct {
		bits uint32
		back string
	}{
		"10.96.0.0/12":     {108, "10.96.0.0/12"},
		"10.96.0.10/32":    {128, "10.96.0.10/32"},
		"10.96.1.7/16":     {112, "10.96.0.0/16"},
		"fd00:96::/108":    {108, "fd00:96::/108"},
		"fd00:96::a/128":   {128, "fd00:96::a/128"},
		"::ffff:0.0.0.0/0": {0, "::/0"},
	} {
		k := SvcnetKeyOf(netip.MustParsePrefix(in))
		if k.Prefixlen != want.bits {
			t.Errorf("%s: prefix length %d, want %d", in, k.Prefixlen, want.bits)
		}
		if got := k.Prefix().String(); got != want.back {
			t.Errorf("%s: back as %s, want %s", in, got, want.back)
		}
	}
}
