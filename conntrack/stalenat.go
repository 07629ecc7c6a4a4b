package conntrack

import (
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// StaleNAT deletes non-TCP flows whose frontend no longer maps to their
// backend: the service is gone, or the backend left it. TCP flows are kept
// until they end (graceful termination), and flows no Service translated
// (service id 0: tracked for the clash check and policy) have no frontend to
// go stale.
//
// It looks frontends up as the datapath does (the exact destination, then the
// NodePort wildcard for this node's addresses), in a snapshot of the NAT maps
// taken when the scan starts and the first non-TCP flow needs it.
type StaleNAT struct {
	Frontends *maps.Map[gen.SluiceFeKey, gen.SluiceFeValue]
	Backends  *maps.Map[gen.SluiceBeKey, gen.SluiceBeValue]
	HostIPs   *maps.Map[gen.SluiceHostipKey, gen.SluiceHostipValue]

	loaded   bool
	fe       map[gen.SluiceFeKey]gen.SluiceFeValue
	backends map[backendRef]bool
	hostIPs  map[uint32]bool
	err      error
}

type backendRef struct {
	svcID uint32
	addr  uint32
	port  uint16
}

// wildcardAddr is the NodePort wildcard frontend address (network order).
const wildcardAddr = 0xffffffff

// Prepare drops the previous snapshot; the next non-TCP flow loads a new one.
func (s *StaleNAT) Prepare(time.Duration) error {
	s.loaded, s.err = false, nil
	return nil
}

func (s *StaleNAT) load() {
	s.loaded = true
	s.fe = map[gen.SluiceFeKey]gen.SluiceFeValue{}
	s.backends = map[backendRef]bool{}
	s.hostIPs = map[uint32]bool{}
	if s.err = s.Frontends.Iterate(func(k gen.SluiceFeKey, v gen.SluiceFeValue) bool { s.fe[k] = v; return true }); s.err != nil {
		return
	}
	if s.err = s.Backends.Iterate(func(k gen.SluiceBeKey, v gen.SluiceBeValue) bool {
		s.backends[backendRef{k.SvcId, v.Addr, v.Port}] = true
		return true
	}); s.err != nil {
		return
	}
	s.err = s.HostIPs.Iterate(func(k gen.SluiceHostipKey, _ gen.SluiceHostipValue) bool { s.hostIPs[k.Addr] = true; return true })
}

// Check reports ReasonStaleNAT for a non-TCP flow whose frontend is gone or no
// longer has the flow's backend. If the snapshot could not be read, it keeps
// every flow.
func (s *StaleNAT) Check(p *Pair, _ time.Duration) Reason {
	if !p.HasFwd || p.FwdKey.Proto == protoTCP || p.Fwd.SvcId == 0 {
		return ""
	}
	if !s.loaded {
		s.load()
	}
	if s.err != nil {
		return ""
	}
	key := gen.SluiceFeKey{Addr: p.FwdKey.Daddr, Port: p.FwdKey.Dport, Proto: p.FwdKey.Proto}
	fe, ok := s.fe[key]
	if !ok && s.hostIPs[key.Addr] {
		key.Addr = wildcardAddr
		fe, ok = s.fe[key]
	}
	if !ok || !s.backends[backendRef{fe.SvcId, p.Fwd.NatAddr, p.Fwd.NatPort}] {
		return ReasonStaleNAT
	}
	return ""
}
