package conntrack

import (
	"net/netip"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// StaleNAT deletes flows of connectionless protocols whose frontend no
// longer maps to their backend: the service is gone, or the backend left
// it. TCP connections and SCTP associations are kept until they end
// (graceful termination), and flows no Service translated
// (service id 0: tracked for the clash check and policy) have no frontend to
// go stale.
//
// It looks frontends up as the datapath does (the exact destination, then the
// NodePort wildcard for this node's addresses), in a snapshot of the NAT maps
// taken when the scan starts and the first flow it judges needs it.
type StaleNAT struct {
	Frontends *maps.Map[gen.SluiceFeKey, gen.SluiceFeValue]
	Backends  *maps.Map[gen.SluiceBeKey, gen.SluiceBeValue]
	HostIPs   *maps.Map[gen.SluiceHostipKey, gen.SluiceHostipValue]
	// The IPv6 maps; nil leaves IPv6 flows alone.
	Frontends6 *maps.Map[gen.SluiceFe6Key, gen.SluiceFeValue]
	Backends6  *maps.Map[gen.SluiceBeKey, gen.SluiceBe6Value]
	HostIPs6   *maps.Map[gen.SluiceHostip6Key, gen.SluiceHostipValue]

	snap natSnapshot
}

// natSnapshot is a copy of the NAT maps, in the IPv6 layout (IPv4
// addresses IPv4-mapped), to look frontends up as the datapath does.
type natSnapshot struct {
	loaded   bool
	fe       map[gen.SluiceFe6Key]gen.SluiceFeValue
	backends map[backendRef]gen.SluiceBeFlags
	hostIPs  map[[16]uint8]bool
	err      error
}

type backendRef struct {
	svcID uint32
	addr  [16]uint8
	port  uint16
}

// The NodePort wildcard frontend addresses, per family (all ones).
var (
	wildcard4 = mapped(0xffffffff)
	wildcard6 = [16]uint8{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
)

// Prepare drops the previous snapshot; the next flow judged loads a new one.
func (s *StaleNAT) Prepare(time.Duration) error {
	s.snap = natSnapshot{}
	return nil
}

// load reads the snapshot from the maps; nil IPv6 maps leave IPv6 out.
func (s *natSnapshot) load(
	fe4 *maps.Map[gen.SluiceFeKey, gen.SluiceFeValue], be4 *maps.Map[gen.SluiceBeKey, gen.SluiceBeValue],
	host4 *maps.Map[gen.SluiceHostipKey, gen.SluiceHostipValue],
	fe6 *maps.Map[gen.SluiceFe6Key, gen.SluiceFeValue], be6 *maps.Map[gen.SluiceBeKey, gen.SluiceBe6Value],
	host6 *maps.Map[gen.SluiceHostip6Key, gen.SluiceHostipValue],
) {
	s.loaded = true
	s.fe = map[gen.SluiceFe6Key]gen.SluiceFeValue{}
	s.backends = map[backendRef]gen.SluiceBeFlags{}
	s.hostIPs = map[[16]uint8]bool{}
	if s.err = fe4.Iterate(func(k gen.SluiceFeKey, v gen.SluiceFeValue) bool {
		s.fe[gen.SluiceFe6Key{Addr: mapped(k.Addr), Port: k.Port, Proto: k.Proto}] = v
		return true
	}); s.err != nil {
		return
	}
	if s.err = be4.Iterate(func(k gen.SluiceBeKey, v gen.SluiceBeValue) bool {
		s.backends[backendRef{k.SvcId, mapped(v.Addr), v.Port}] = v.Flags
		return true
	}); s.err != nil {
		return
	}
	if s.err = host4.Iterate(func(k gen.SluiceHostipKey, _ gen.SluiceHostipValue) bool {
		s.hostIPs[mapped(k.Addr)] = true
		return true
	}); s.err != nil || fe6 == nil {
		return
	}
	if s.err = fe6.Iterate(func(k gen.SluiceFe6Key, v gen.SluiceFeValue) bool { s.fe[k] = v; return true }); s.err != nil {
		return
	}
	if s.err = be6.Iterate(func(k gen.SluiceBeKey, v gen.SluiceBe6Value) bool {
		s.backends[backendRef{k.SvcId, v.Addr, v.Port}] = v.Flags
		return true
	}); s.err != nil {
		return
	}
	s.err = host6.Iterate(func(k gen.SluiceHostip6Key, _ gen.SluiceHostipValue) bool { s.hostIPs[k.Addr] = true; return true })
}

// Check reports ReasonStaleNAT for a flow of a connectionless protocol (not
// TCP, not SCTP, whose associations end on their own as TCP's connections
// do) whose frontend is gone or no longer has the flow's backend. If the snapshot could not be read, it keeps
// every flow; without the IPv6 maps, it keeps every IPv6 flow.
func (s *StaleNAT) Check(p *Pair, _ time.Duration) Reason {
	if !p.HasFwd || p.FwdKey.Proto == protoTCP || p.FwdKey.Proto == protoSCTP || p.Fwd.SvcId == 0 {
		return ""
	}
	ipv4 := netip.AddrFrom16(p.FwdKey.Daddr).Is4In6()
	if !ipv4 && s.Frontends6 == nil {
		return ""
	}
	if !s.snap.loaded {
		s.snap.load(s.Frontends, s.Backends, s.HostIPs, s.Frontends6, s.Backends6, s.HostIPs6)
	}
	if s.snap.err != nil {
		return ""
	}
	fe, ok := s.snap.frontend(p.FwdKey.Daddr, p.FwdKey.Dport, p.FwdKey.Proto)
	if !ok {
		return ReasonStaleNAT
	}
	if _, ok := s.snap.backends[backendRef{fe.SvcId, p.Fwd.NatAddr, p.Fwd.NatPort}]; !ok {
		return ReasonStaleNAT
	}
	return ""
}

// frontend looks a destination up as the datapath does: the exact address,
// then the NodePort wildcard for the node's own addresses.
func (s *natSnapshot) frontend(addr [16]uint8, port uint16, proto uint8) (gen.SluiceFeValue, bool) {
	key := gen.SluiceFe6Key{Addr: addr, Port: port, Proto: proto}
	fe, ok := s.fe[key]
	if !ok && s.hostIPs[addr] {
		key.Addr = wildcard6
		if netip.AddrFrom16(addr).Is4In6() {
			key.Addr = wildcard4
		}
		fe, ok = s.fe[key]
	}
	return fe, ok
}
