package nat

// Both address families in one syncer. A dual-stack Service is one service
// port per family (ServicePortName.IPv6), as kube-proxy runs one proxier per
// family; the datapath has one map set per family. The syncer plans in the
// IPv6 maps' layout, with an IPv4 address IPv4-mapped (::ffff:a.b.c.d), and
// splitMap writes each entry to its family's map.

import (
	"fmt"
	"net/netip"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// Protocol numbers of the echo markers (the ICMP frontends that make the
// datapath answer pings to a service IP), per family.
const (
	protoICMP   = 1
	protoICMPv6 = 58
)

// splitMap is one desired-state map over a pair of caching maps: the IPv6 map
// holds entries in the planning layout (K, V); the IPv4 map's entries are
// converted.
type splitMap[K, V, K4, V4 comparable] struct {
	m6 *maps.CachingMap[K, V]
	m4 *maps.CachingMap[K4, V4]
	// to4 converts an entry for the IPv4 map; false: the entry is IPv6.
	to4 func(K, V) (K4, V4, bool)
	// key4 converts a key; false: it can only be IPv6. Keys without a
	// family (a backend's {service id, ordinal}) convert always: they are
	// looked up in both maps, and live in at most one.
	key4  func(K) (K4, bool)
	from4 func(K4, V4) (K, V)
}

func (m *splitMap[K, V, K4, V4]) SetDesired(k K, v V) {
	if k4, v4, ok := m.to4(k, v); ok {
		m.m4.SetDesired(k4, v4)
		return
	}
	m.m6.SetDesired(k, v)
}

func (m *splitMap[K, V, K4, V4]) DeleteDesired(k K) {
	if k4, ok := m.key4(k); ok {
		m.m4.DeleteDesired(k4)
	}
	m.m6.DeleteDesired(k)
}

func (m *splitMap[K, V, K4, V4]) GetDesired(k K) (V, bool) {
	if k4, ok := m.key4(k); ok {
		if v4, ok := m.m4.GetDesired(k4); ok {
			_, v := m.from4(k4, v4)
			return v, true
		}
	}
	return m.m6.GetDesired(k)
}

func (m *splitMap[K, V, K4, V4]) GetDataplane(k K) (V, bool) {
	if k4, ok := m.key4(k); ok {
		if v4, ok := m.m4.GetDataplane(k4); ok {
			_, v := m.from4(k4, v4)
			return v, true
		}
	}
	return m.m6.GetDataplane(k)
}

func (m *splitMap[K, V, K4, V4]) IterDataplane(fn func(K, V) bool) {
	more := true
	m.m4.IterDataplane(func(k4 K4, v4 V4) bool {
		more = fn(m.from4(k4, v4))
		return more
	})
	if more {
		m.m6.IterDataplane(fn)
	}
}

// fits tells whether add4 more IPv4 and add6 more IPv6 entries fit beside
// what is desired; the error names the service and the map that would
// overfill.
func (m *splitMap[K, V, K4, V4]) fits(service ServicePortName, add4, add6 int) error {
	for _, c := range []struct {
		name       string
		inUse, add int
		capacity   uint32
	}{
		{m.m4.Map().Name(), m.m4.DesiredLen(), add4, m.m4.Map().MaxEntries()},
		{m.m6.Map().Name(), m.m6.DesiredLen(), add6, m.m6.Map().MaxEntries()},
	} {
		if c.add > 0 && c.inUse+c.add > int(c.capacity) {
			return fmt.Errorf("service %s: needs %d more entries of map %s, which has %d of %d in use: %w",
				service, c.add, c.name, c.inUse, c.capacity, &maps.FullError{Map: c.name, MaxEntries: c.capacity})
		}
	}
	return nil
}

func (m *splitMap[K, V, K4, V4]) LoadDataplaneState() error {
	if err := m.m4.LoadDataplaneState(); err != nil {
		return err
	}
	return m.m6.LoadDataplaneState()
}

func (m *splitMap[K, V, K4, V4]) both(f4 func() (maps.ApplyStats, error), f6 func() (maps.ApplyStats, error)) (maps.ApplyStats, error) {
	s4, err := f4()
	if err != nil {
		return s4, err
	}
	s6, err := f6()
	return s4.Add(s6), err
}

func (m *splitMap[K, V, K4, V4]) ApplyUpdatesOnly() (maps.ApplyStats, error) {
	return m.both(m.m4.ApplyUpdatesOnly, m.m6.ApplyUpdatesOnly)
}

func (m *splitMap[K, V, K4, V4]) ApplyDeletionsOnly() (maps.ApplyStats, error) {
	return m.both(m.m4.ApplyDeletionsOnly, m.m6.ApplyDeletionsOnly)
}

func (m *splitMap[K, V, K4, V4]) ApplyAll() (maps.ApplyStats, error) {
	return m.both(m.m4.ApplyAll, m.m6.ApplyAll)
}

// unmapped is the IPv4 address of an IPv4-mapped planning address.
func unmapped(b [16]uint8) (netip.Addr, bool) {
	a := netip.AddrFrom16(b)
	return a.Unmap(), a.Is4In6()
}

func newFrontendMap(m4 *maps.Map[gen.SluiceFeKey, gen.SluiceFeValue], m6 *maps.Map[gen.SluiceFe6Key, gen.SluiceFeValue]) *splitMap[gen.SluiceFe6Key, gen.SluiceFeValue, gen.SluiceFeKey, gen.SluiceFeValue] {
	key4 := func(k gen.SluiceFe6Key) (gen.SluiceFeKey, bool) {
		a, ok := unmapped(k.Addr)
		if !ok {
			return gen.SluiceFeKey{}, false
		}
		return gen.SluiceFeKey{Addr: gen.NetAddr(a), Port: k.Port, Proto: k.Proto}, true
	}
	return &splitMap[gen.SluiceFe6Key, gen.SluiceFeValue, gen.SluiceFeKey, gen.SluiceFeValue]{
		m6: maps.NewCachingMap(m6), m4: maps.NewCachingMap(m4), key4: key4,
		to4: func(k gen.SluiceFe6Key, v gen.SluiceFeValue) (gen.SluiceFeKey, gen.SluiceFeValue, bool) {
			k4, ok := key4(k)
			return k4, v, ok
		},
		from4: func(k gen.SluiceFeKey, v gen.SluiceFeValue) (gen.SluiceFe6Key, gen.SluiceFeValue) {
			return gen.SluiceFe6Key{Addr: gen.NetAddr6(gen.AddrFromNet(k.Addr)), Port: k.Port, Proto: k.Proto}, v
		},
	}
}

func newBackendMap(m4 *maps.Map[gen.SluiceBeKey, gen.SluiceBeValue], m6 *maps.Map[gen.SluiceBeKey, gen.SluiceBe6Value]) *splitMap[gen.SluiceBeKey, gen.SluiceBe6Value, gen.SluiceBeKey, gen.SluiceBeValue] {
	return &splitMap[gen.SluiceBeKey, gen.SluiceBe6Value, gen.SluiceBeKey, gen.SluiceBeValue]{
		m6: maps.NewCachingMap(m6), m4: maps.NewCachingMap(m4),
		key4: func(k gen.SluiceBeKey) (gen.SluiceBeKey, bool) { return k, true },
		to4: func(k gen.SluiceBeKey, v gen.SluiceBe6Value) (gen.SluiceBeKey, gen.SluiceBeValue, bool) {
			a, ok := unmapped(v.Addr)
			if !ok {
				return k, gen.SluiceBeValue{}, false
			}
			return k, gen.SluiceBeValue{Addr: gen.NetAddr(a), Port: v.Port, Flags: v.Flags}, true
		},
		from4: func(k gen.SluiceBeKey, v gen.SluiceBeValue) (gen.SluiceBeKey, gen.SluiceBe6Value) {
			return k, gen.SluiceBe6Value{Addr: gen.NetAddr6(gen.AddrFromNet(v.Addr)), Port: v.Port, Flags: v.Flags}
		},
	}
}

// An IPv4 source range is planned as its IPv4-mapped prefix: 96 bits more.
const mappedBits = 96

func newSrcRangeMap(m4 *maps.Map[gen.SluiceSrcrangeKey, gen.SluiceSrcrangeValue], m6 *maps.Map[gen.SluiceSrcrange6Key, gen.SluiceSrcrangeValue]) *splitMap[gen.SluiceSrcrange6Key, gen.SluiceSrcrangeValue, gen.SluiceSrcrangeKey, gen.SluiceSrcrangeValue] {
	key4 := func(k gen.SluiceSrcrange6Key) (gen.SluiceSrcrangeKey, bool) {
		a, ok := unmapped(k.Src)
		if !ok {
			return gen.SluiceSrcrangeKey{}, false
		}
		return gen.SluiceSrcrangeKey{Prefixlen: k.Prefixlen - mappedBits, SvcId: k.SvcId, Src: gen.NetAddr(a)}, true
	}
	return &splitMap[gen.SluiceSrcrange6Key, gen.SluiceSrcrangeValue, gen.SluiceSrcrangeKey, gen.SluiceSrcrangeValue]{
		m6: maps.NewCachingMap(m6), m4: maps.NewCachingMap(m4), key4: key4,
		to4: func(k gen.SluiceSrcrange6Key, v gen.SluiceSrcrangeValue) (gen.SluiceSrcrangeKey, gen.SluiceSrcrangeValue, bool) {
			k4, ok := key4(k)
			return k4, v, ok
		},
		from4: func(k gen.SluiceSrcrangeKey, v gen.SluiceSrcrangeValue) (gen.SluiceSrcrange6Key, gen.SluiceSrcrangeValue) {
			return gen.SluiceSrcrange6Key{Prefixlen: k.Prefixlen + mappedBits, SvcId: k.SvcId, Src: gen.NetAddr6(gen.AddrFromNet(k.Src))}, v
		},
	}
}

func newHostIPMap(m4 *maps.Map[gen.SluiceHostipKey, gen.SluiceHostipValue], m6 *maps.Map[gen.SluiceHostip6Key, gen.SluiceHostipValue]) *splitMap[gen.SluiceHostip6Key, gen.SluiceHostipValue, gen.SluiceHostipKey, gen.SluiceHostipValue] {
	key4 := func(k gen.SluiceHostip6Key) (gen.SluiceHostipKey, bool) {
		a, ok := unmapped(k.Addr)
		if !ok {
			return gen.SluiceHostipKey{}, false
		}
		return gen.SluiceHostipKey{Addr: gen.NetAddr(a)}, true
	}
	return &splitMap[gen.SluiceHostip6Key, gen.SluiceHostipValue, gen.SluiceHostipKey, gen.SluiceHostipValue]{
		m6: maps.NewCachingMap(m6), m4: maps.NewCachingMap(m4), key4: key4,
		to4: func(k gen.SluiceHostip6Key, v gen.SluiceHostipValue) (gen.SluiceHostipKey, gen.SluiceHostipValue, bool) {
			k4, ok := key4(k)
			return k4, v, ok
		},
		from4: func(k gen.SluiceHostipKey, v gen.SluiceHostipValue) (gen.SluiceHostip6Key, gen.SluiceHostipValue) {
			return gen.SluiceHostip6Key{Addr: gen.NetAddr6(gen.AddrFromNet(k.Addr))}, v
		},
	}
}
