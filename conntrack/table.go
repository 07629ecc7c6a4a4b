package conntrack

// Both address families' conntrack maps, as the scanner and the listings
// see them: entries in the IPv6 map's layout, an IPv4 entry's addresses
// IPv4-mapped (::ffff:a.b.c.d). The timeouts, the chain of EntryScanners
// and the decoding of flows then serve both families with one code path.

import (
	"errors"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// Key and Entry are a conntrack key and entry of either family, in the IPv6
// layout (IPv4 addresses IPv4-mapped).
type (
	Key   = gen.SluiceCt6Key
	Entry = gen.SluiceCt6Value
)

// table is one family's conntrack map.
type table interface {
	name() string
	capacity() uint32
	iterate(fn func(k Key, v Entry) bool) error
	// lookup reads k's entry into out; false when k is not there.
	lookup(k Key, out *Entry) (bool, error)
	// batchDelete deletes keys, up to the first missing one (errors.Is
	// maps.ErrKeyNotExist), and says how many it deleted.
	batchDelete(keys []Key) (int, error)
	// put writes k's entry (flags: ebpf.UpdateNoExist and the like).
	put(k Key, v Entry, flags ebpf.MapUpdateFlags) error
	// remove deletes k's entry; a missing one is no error.
	remove(k Key) error
}

type table6 struct{ m *maps.Map[Key, Entry] }

func (t table6) name() string                               { return t.m.Name() }
func (t table6) capacity() uint32                           { return t.m.MaxEntries() }
func (t table6) iterate(fn func(k Key, v Entry) bool) error { return t.m.Iterate(fn) }
func (t table6) batchDelete(keys []Key) (int, error)        { return t.m.BatchDelete(keys) }
func (t table6) lookup(k Key, out *Entry) (bool, error)     { return lookupIn(t.m, &k, out) }
func (t table6) put(k Key, v Entry, flags ebpf.MapUpdateFlags) error {
	return t.m.Put(k, v, flags)
}
func (t table6) remove(k Key) error { return ignoreMissing(t.m.Delete(k)) }

// table4 converts the IPv4 map's entries; its buffers are reused across
// calls, so a scan of a million entries makes little garbage.
type table4 struct {
	m   *maps.Map[gen.SluiceCtKey, gen.SluiceCtValue]
	k   gen.SluiceCtKey
	v   gen.SluiceCtValue
	del []gen.SluiceCtKey
}

func (t *table4) name() string     { return t.m.Name() }
func (t *table4) capacity() uint32 { return t.m.MaxEntries() }

func (t *table4) iterate(fn func(k Key, v Entry) bool) error {
	return t.m.Iterate(func(k gen.SluiceCtKey, v gen.SluiceCtValue) bool { return fn(key6(k), entry6(v)) })
}

func (t *table4) lookup(k Key, out *Entry) (bool, error) {
	t.k = key4(k)
	ok, err := lookupIn(t.m, &t.k, &t.v)
	if ok {
		*out = entry6(t.v)
	}
	return ok, err
}

func (t *table4) batchDelete(keys []Key) (int, error) {
	t.del = t.del[:0]
	for _, k := range keys {
		t.del = append(t.del, key4(k))
	}
	return t.m.BatchDelete(t.del)
}

func (t *table4) put(k Key, v Entry, flags ebpf.MapUpdateFlags) error {
	return t.m.Put(key4(k), entry4(v), flags)
}

func (t *table4) remove(k Key) error { return ignoreMissing(t.m.Delete(key4(k))) }

func ignoreMissing(err error) error {
	if errors.Is(err, maps.ErrKeyNotExist) {
		return nil
	}
	return err
}

func lookupIn[K comparable, V any](m *maps.Map[K, V], k *K, out *V) (bool, error) {
	err := m.Lookup(k, out)
	if errors.Is(err, maps.ErrKeyNotExist) {
		return false, nil
	}
	return err == nil, err
}

func mapped(a uint32) [16]uint8 { return gen.NetAddr6(gen.AddrFromNet(a)) }

func unmapped(b [16]uint8) uint32 { return gen.NetAddr(netip.AddrFrom16(b).Unmap()) }

func key6(k gen.SluiceCtKey) Key {
	return Key{Saddr: mapped(k.Saddr), Daddr: mapped(k.Daddr), Sport: k.Sport, Dport: k.Dport, Proto: k.Proto}
}

func key4(k Key) gen.SluiceCtKey {
	return gen.SluiceCtKey{Saddr: unmapped(k.Saddr), Daddr: unmapped(k.Daddr), Sport: k.Sport, Dport: k.Dport, Proto: k.Proto}
}

func entry6(v gen.SluiceCtValue) Entry {
	return Entry{Created: v.Created, LastSeen: v.LastSeen, Peer: key6(v.Peer),
		NatAddr: mapped(v.NatAddr), SnatAddr: mapped(v.SnatAddr), NatPort: v.NatPort, SnatPort: v.SnatPort,
		SvcId: v.SvcId, TcpSeen: v.TcpSeen, Type: v.Type, Flags: v.Flags, PolEgress: v.PolEgress, PolIngress: v.PolIngress}
}

func entry4(v Entry) gen.SluiceCtValue {
	return gen.SluiceCtValue{Created: v.Created, LastSeen: v.LastSeen, Peer: key4(v.Peer),
		NatAddr: unmapped(v.NatAddr), SnatAddr: unmapped(v.SnatAddr), NatPort: v.NatPort, SnatPort: v.SnatPort,
		SvcId: v.SvcId, TcpSeen: v.TcpSeen, Type: v.Type, Flags: v.Flags, PolEgress: v.PolEgress, PolIngress: v.PolIngress}
}

// KeyOf is the key of a packet from src to dst, for either family.
func KeyOf(src, dst netip.AddrPort, proto uint8) Key {
	return Key{Saddr: src.Addr().As16(), Daddr: dst.Addr().As16(),
		Sport: gen.NetPort(src.Port()), Dport: gen.NetPort(dst.Port()), Proto: proto}
}

// tables lists the maps given, IPv4 first; a nil map is left out.
func tables(ct *maps.Map[gen.SluiceCtKey, gen.SluiceCtValue], ct6 *maps.Map[Key, Entry]) []table {
	var out []table
	if ct != nil {
		out = append(out, &table4{m: ct})
	}
	if ct6 != nil {
		out = append(out, table6{m: ct6})
	}
	return out
}
