package conntrack

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// Adoption is a connection another proxy translated (netfilter's NAT, for
// kube-proxy), to be carried on by Sluice's datapath with the same
// translation: the backend it has, and the source the backend sees.
type Adoption struct {
	Proto    uint8          // 6 (TCP) or 17 (UDP)
	Client   netip.AddrPort // the client's tuple, as it sends
	Frontend netip.AddrPort
	Backend  netip.AddrPort
	// Source is the client as the backend sees it: the client itself, or
	// the address and port the other proxy SNATed it to.
	Source netip.AddrPort
}

func (a Adoption) String() string {
	s := fmt.Sprintf("%s %v -> %v (nat %v", ProtoName(a.Proto), a.Client, a.Frontend, a.Backend)
	if a.Source != a.Client {
		s += fmt.Sprintf(", snat %v", a.Source)
	}
	return s + ")"
}

// Errors of Adopter.Adopt.
var (
	// ErrNotAService: the flow's frontend is no Service frontend in the
	// NAT maps; Sluice would not translate it, so it leaves it alone.
	ErrNotAService = errors.New("its destination is no Service frontend")
	// ErrTracked: Sluice already tracks a flow on one of its tuples.
	ErrTracked = errors.New("Sluice already tracks a flow on its tuple")
)

// Adopter writes connections another proxy translated into Sluice's
// conntrack, as the datapath would have written them had it balanced them:
// a forward and a reverse entry, established, with the other proxy's
// backend and source translation. From then on the datapath carries them
// on by itself, whatever happens to the other proxy's rules.
//
// Frontends are looked up as the datapath does (the Service's id, whether
// it is external, whether the backend is local) in a snapshot of the NAT
// maps taken at the first Adopt; Refresh drops it.
type Adopter struct {
	Conntrack  *maps.Map[gen.SluiceCtKey, gen.SluiceCtValue]
	Conntrack6 *maps.Map[Key, Entry] // nil: IPv6 flows are refused
	Frontends  *maps.Map[gen.SluiceFeKey, gen.SluiceFeValue]
	Backends   *maps.Map[gen.SluiceBeKey, gen.SluiceBeValue]
	HostIPs    *maps.Map[gen.SluiceHostipKey, gen.SluiceHostipValue]
	Frontends6 *maps.Map[gen.SluiceFe6Key, gen.SluiceFeValue]
	Backends6  *maps.Map[gen.SluiceBeKey, gen.SluiceBe6Value]
	HostIPs6   *maps.Map[gen.SluiceHostip6Key, gen.SluiceHostipValue]
	// Clock is the datapath's clock (default Monotonic).
	Clock func() time.Duration

	snap   natSnapshot
	t4, t6 table
}

// Refresh makes the next Adopt read the NAT maps again.
func (a *Adopter) Refresh() { a.snap = natSnapshot{} }

// Adopt writes f's pair of entries. It refuses, and writes nothing, when f's
// frontend is no Service of the NAT maps (ErrNotAService) or Sluice tracks a
// translated flow on f's tuples (ErrTracked). A flow Sluice tracks on f's
// client tuple untranslated is f itself, seen by the datapath before its
// Service was programmed and passed on to netfilter: it is replaced.
func (a *Adopter) Adopt(f Adoption) error {
	if f.Proto != protoTCP && f.Proto != protoUDP {
		return fmt.Errorf("adopt %v: only TCP and UDP flows are translated", f)
	}
	v4 := f.Client.Addr().Is4()
	if f.Frontend.Addr().Is4() != v4 || f.Backend.Addr().Is4() != v4 || f.Source.Addr().Is4() != v4 {
		return fmt.Errorf("adopt %v: mixed address families", f)
	}
	t := a.table(v4)
	if t == nil {
		return fmt.Errorf("adopt %v: no IPv6 conntrack map", f)
	}
	if !a.snap.loaded {
		a.snap.load(a.Frontends, a.Backends, a.HostIPs, a.Frontends6, a.Backends6, a.HostIPs6)
	}
	if a.snap.err != nil {
		return fmt.Errorf("adopt %v: read the NAT maps: %w", f, a.snap.err)
	}
	fe, ok := a.snap.frontend(addr16(f.Frontend.Addr()), gen.NetPort(f.Frontend.Port()), f.Proto)
	if !ok {
		return fmt.Errorf("adopt %v: %w", f, ErrNotAService)
	}
	beFlags := a.snap.backends[backendRef{fe.SvcId, addr16(f.Backend.Addr()), gen.NetPort(f.Backend.Port())}]

	fwdKey := KeyOf(f.Client, f.Frontend, f.Proto)
	revKey := KeyOf(f.Backend, f.Source, f.Proto)
	var held Entry
	if ok, err := t.lookup(fwdKey, &held); err != nil {
		return fmt.Errorf("adopt %v: %w", f, err)
	} else if ok {
		if held.Type != gen.SluiceCtTypeCT_FORWARD || held.SvcId != 0 {
			return fmt.Errorf("adopt %v: %w", f, ErrTracked)
		}
		// Tracked untranslated: its reverse entry is its own reversed
		// tuple; both go.
		if err := errors.Join(t.remove(held.Peer), t.remove(fwdKey)); err != nil {
			return fmt.Errorf("adopt %v: %w", f, err)
		}
	}

	flags := gen.SluiceCtFlags(0)
	fromHost := fe.Flags&gen.SluiceFeFlagsFE_EXTERNAL != 0
	snat := f.Source != f.Client
	if fromHost {
		flags |= gen.SluiceCtFlagsCT_FROM_HOST
	}
	if beFlags&gen.SluiceBeFlagsBE_LOCAL != 0 {
		flags |= gen.SluiceCtFlagsCT_BACKEND_LOCAL
	}
	if snat {
		flags |= gen.SluiceCtFlagsCT_SNAT
	}
	if !fromHost && f.Backend.Addr() == f.Client.Addr() {
		flags |= gen.SluiceCtFlagsCT_HAIRPIN
	} else if (!fromHost && snat) || a.snap.hostIPs[addr16(f.Frontend.Addr())] {
		flags |= gen.SluiceCtFlagsCT_NODE_SOURCE
	}

	now := uint64(a.now())
	seen := uint32(0)
	if f.Proto == protoTCP {
		seen = tcpSYN | tcpACK
	}
	none := noAddr(v4)
	fwd := Entry{Created: now, LastSeen: now, Peer: revKey,
		NatAddr: addr16(f.Backend.Addr()), NatPort: gen.NetPort(f.Backend.Port()),
		SnatAddr: none, SnatPort: gen.NetPort(f.Source.Port()),
		SvcId: fe.SvcId, TcpSeen: seen, Type: gen.SluiceCtTypeCT_FORWARD, Flags: flags,
		PolEgress: gen.SluicePolVerdictPOL_ALLOWED, PolIngress: gen.SluicePolVerdictPOL_ALLOWED}
	if snat {
		fwd.SnatAddr = addr16(f.Source.Addr())
	}
	rev := Entry{Created: now, LastSeen: now, Peer: fwdKey,
		NatAddr: addr16(f.Frontend.Addr()), NatPort: gen.NetPort(f.Frontend.Port()),
		SnatAddr: addr16(f.Client.Addr()), SnatPort: gen.NetPort(f.Client.Port()),
		SvcId: fe.SvcId, TcpSeen: seen | uint32(gen.SluiceCtSeenCT_SEEN_PACKET), Type: gen.SluiceCtTypeCT_REVERSE, Flags: flags,
		PolEgress: gen.SluicePolVerdictPOL_ALLOWED, PolIngress: gen.SluicePolVerdictPOL_ALLOWED}
	// The reverse entry first, only where its key is free: it is the
	// flow's identity at the backend (ct_create).
	if err := t.put(revKey, rev, ebpf.UpdateNoExist); err != nil {
		if errors.Is(err, ebpf.ErrKeyExist) {
			return fmt.Errorf("adopt %v: %w", f, ErrTracked)
		}
		return fmt.Errorf("adopt %v: %w", f, err)
	}
	if err := t.put(fwdKey, fwd, ebpf.UpdateNoExist); err != nil {
		t.remove(revKey)
		if errors.Is(err, ebpf.ErrKeyExist) {
			return fmt.Errorf("adopt %v: %w", f, ErrTracked)
		}
		return fmt.Errorf("adopt %v: %w", f, err)
	}
	return nil
}

func (a *Adopter) now() time.Duration {
	if a.Clock != nil {
		return a.Clock()
	}
	return Monotonic()
}

func (a *Adopter) table(v4 bool) table {
	if v4 {
		if a.t4 == nil && a.Conntrack != nil {
			a.t4 = &table4{m: a.Conntrack}
		}
		return a.t4
	}
	if a.t6 == nil && a.Conntrack6 != nil {
		a.t6 = table6{m: a.Conntrack6}
	}
	return a.t6
}

// addr16 is an address in the IPv6 layout (IPv4-mapped).
func addr16(a netip.Addr) [16]uint8 { return a.As16() }

// noAddr is the all-zero address of a family, in the IPv6 layout.
func noAddr(v4 bool) [16]uint8 {
	if v4 {
		return mapped(0)
	}
	return [16]uint8{}
}
