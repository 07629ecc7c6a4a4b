package nat

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// Frontend is one programmed frontend read back from the maps.
type Frontend struct {
	Service   string         `json:"service"` // "namespace/name:port", or "" if unnamed
	ServiceID uint32         `json:"serviceID"`
	Address   netip.AddrPort `json:"address"` // all ones (255.255.255.255, ffff:...:ffff) is the NodePort wildcard
	// AllNodeAddresses marks the NodePort wildcard: the port on every node
	// address of the family (Address holds the datapath's all-ones key).
	AllNodeAddresses bool      `json:"allNodeAddresses,omitempty"`
	Protocol         string    `json:"protocol"`
	Flags            []string  `json:"flags,omitempty"`
	Count            uint32    `json:"count"`
	Local            uint32    `json:"local"`
	Affinity         uint32    `json:"affinitySeconds,omitempty"`
	Backends         []Backend `json:"backends"`
}

// Shown is the frontend's address as people write it: the NodePort
// wildcard as the family's unspecified address, 0.0.0.0:30080 or
// [::]:30080, the way a socket on every address shows.
func (f Frontend) Shown() netip.AddrPort {
	if !f.AllNodeAddresses {
		return f.Address
	}
	if f.Address.Addr().Is6() {
		return netip.AddrPortFrom(netip.IPv6Unspecified(), f.Address.Port())
	}
	return netip.AddrPortFrom(netip.IPv4Unspecified(), f.Address.Port())
}

// Backend is one backend of a programmed frontend.
type Backend struct {
	Address netip.AddrPort `json:"address"`
	Local   bool           `json:"local,omitempty"`
}

// ReadFrontends reads what the maps of both families hold (pinned maps work
// as well while the agent runs as after it stopped), sorted by service name
// and address. Echo markers are left out.
func ReadFrontends(set *maps.Set) ([]Frontend, error) {
	fe, err := maps.Frontends.In(set)
	if err != nil {
		return nil, err
	}
	be, err := maps.Backends.In(set)
	if err != nil {
		return nil, err
	}
	fe6, err := maps.Frontends6.In(set)
	if err != nil {
		return nil, err
	}
	be6, err := maps.Backends6.In(set)
	if err != nil {
		return nil, err
	}
	names, err := maps.SvcNames.In(set)
	if err != nil {
		return nil, err
	}
	backends := map[uint32][]Backend{}
	add := func(k gen.SluiceBeKey, b Backend) bool {
		list := backends[k.SvcId]
		for len(list) <= int(k.Ordinal) {
			list = append(list, Backend{})
		}
		list[k.Ordinal] = b
		backends[k.SvcId] = list
		return true
	}
	err = be.Iterate(func(k gen.SluiceBeKey, v gen.SluiceBeValue) bool {
		return add(k, Backend{Address: netip.AddrPortFrom(gen.AddrFromNet(v.Addr), gen.PortFromNet(v.Port)),
			Local: v.Flags&gen.SluiceBeFlagsBE_LOCAL != 0})
	})
	if err != nil {
		return nil, err
	}
	err = be6.Iterate(func(k gen.SluiceBeKey, v gen.SluiceBe6Value) bool {
		return add(k, Backend{Address: backendAddr(v), Local: v.Flags&gen.SluiceBeFlagsBE_LOCAL != 0})
	})
	if err != nil {
		return nil, err
	}
	var out []Frontend
	frontend := func(addr netip.AddrPort, proto uint8, v gen.SluiceFeValue) bool {
		if proto == protoICMP || proto == protoICMPv6 {
			return true // echo marker
		}
		f := Frontend{ServiceID: v.SvcId, Protocol: Protocol(proto).String(), Address: addr,
			Count: v.Count, Local: v.LocalCount, Affinity: v.AffinityTimeout, Flags: flagNames(v.Flags),
			Backends: backends[v.SvcId], AllNodeAddresses: addr.Addr() == wildcardFor(addr.Addr())}
		if n, err := names.Get(gen.SluiceSvcnameKey{SvcId: v.SvcId}); err == nil {
			f.Service = gen.CString(n.Name[:])
		}
		out = append(out, f)
		return true
	}
	err = fe.Iterate(func(k gen.SluiceFeKey, v gen.SluiceFeValue) bool {
		return frontend(netip.AddrPortFrom(gen.AddrFromNet(k.Addr), gen.PortFromNet(k.Port)), k.Proto, v)
	})
	if err != nil {
		return nil, err
	}
	err = fe6.Iterate(func(k gen.SluiceFe6Key, v gen.SluiceFeValue) bool {
		return frontend(netip.AddrPortFrom(gen.AddrFromNet6(k.Addr), gen.PortFromNet(k.Port)), k.Proto, v)
	})
	slices.SortFunc(out, func(a, b Frontend) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), a.Address.Compare(b.Address))
	})
	return out, err
}

func flagNames(f gen.SluiceFeFlags) []string {
	var out []string
	for _, x := range []struct {
		bit  gen.SluiceFeFlags
		name string
	}{{gen.SluiceFeFlagsFE_INT_LOCAL, "internal-local"}, {gen.SluiceFeFlagsFE_EXT_LOCAL, "external-local"},
		{gen.SluiceFeFlagsFE_SRC_RANGES, "source-ranges"}, {gen.SluiceFeFlagsFE_EXTERNAL, "external"},
		{gen.SluiceFeFlagsFE_MAGLEV, "maglev"}} {
		if f&x.bit != 0 {
			out = append(out, x.name)
		}
	}
	return out
}
