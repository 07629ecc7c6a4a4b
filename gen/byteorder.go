package gen

import (
	"encoding/binary"
	"net/netip"
)

// Fields documented "network order" in bpf/include hold their bytes as they
// appear on the wire; these helpers convert them to and from Go values.

// NetAddr returns an IPv4 address as a network-order field value.
func NetAddr(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

// AddrFromNet converts a network-order address field to an address.
func AddrFromNet(v uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// NetPort returns a port as a network-order field value.
func NetPort(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

// PortFromNet converts a network-order port field to a port.
func PortFromNet(v uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], v)
	return binary.BigEndian.Uint16(b[:])
}

// NetUint32 returns a host value as a network-order 32-bit field value.
func NetUint32(v uint32) uint32 {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return binary.NativeEndian.Uint32(b[:])
}

// NetAddr6 returns an address as a 16-byte network-order field value (an
// IPv4 address becomes IPv4-mapped).
func NetAddr6(a netip.Addr) [16]uint8 {
	return a.As16()
}

// AddrFromNet6 converts a 16-byte network-order address field to an address.
func AddrFromNet6(v [16]uint8) netip.Addr {
	return netip.AddrFrom16(v)
}

// SvcnetKeyOf returns the sl_svcnet_v1 key of a prefix: both families share
// the trie, so an IPv4 prefix is keyed IPv4-mapped (::ffff:a.b.c.d) with 96
// more bits of prefix length.
func SvcnetKeyOf(pfx netip.Prefix) SluiceSvcnetKey {
	bits := pfx.Bits()
	if pfx.Addr().Is4() {
		bits += 96
	}
	return SluiceSvcnetKey{Prefixlen: uint32(bits), Addr: NetAddr6(pfx.Masked().Addr())}
}

// Prefix returns the prefix an sl_svcnet_v1 key holds, IPv4 unmapped: the
// inverse of SvcnetKeyOf.
func (k SluiceSvcnetKey) Prefix() netip.Prefix {
	a, bits := AddrFromNet6(k.Addr), int(k.Prefixlen)
	if a.Is4In6() && bits >= 96 {
		a, bits = a.Unmap(), bits-96
	}
	return netip.PrefixFrom(a, bits)
}
