package conntrack

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/sluice-net/sluice/gen"
)

// Flow is a tracked flow decoded for people and tools: balanced by a Service
// (ServiceID > 0), or direct (ServiceID 0, Frontend = Backend), the latter
// with SNAT set when its source port was remapped to avoid a clash.
type Flow struct {
	Proto     string         `json:"proto"`
	Client    netip.AddrPort `json:"client"`
	Frontend  netip.AddrPort `json:"frontend"`
	Backend   netip.AddrPort `json:"backend"`
	SNAT      netip.AddrPort `json:"snat,omitzero"` // the node's address the flow leaves with
	ServiceID uint32         `json:"serviceID"`
	State     State          `json:"state"`
	Idle      time.Duration  `json:"idle"`
	Orphan    bool           `json:"orphan,omitempty"` // one entry of the pair is missing
	// DSR is the node's part in a flow by direct server return: DSRSent
	// (balanced here, answered by the backend's node) or DSRAnswered (the
	// backend is here and answers the client from Frontend).
	DSR DSRRole `json:"dsr,omitempty"`
}

// DSRRole is a node's part in a flow by direct server return.
type DSRRole string

// DSR roles.
const (
	DSRSent     DSRRole = "sent"
	DSRAnswered DSRRole = "answered"
)

func addrPort(a [16]uint8, p uint16) netip.AddrPort {
	return netip.AddrPortFrom(gen.AddrFromNet6(a).Unmap(), gen.PortFromNet(p))
}

// ProtoName is the lower-case name of an IP protocol number.
func ProtoName(p uint8) string {
	switch p {
	case protoTCP:
		return "tcp"
	case protoUDP:
		return "udp"
	case protoSCTP:
		return "sctp"
	case protoICMP:
		return "icmp"
	case protoICMPv6:
		return "icmpv6"
	}
	return fmt.Sprintf("proto-%d", p)
}

// Decode describes the pair as of now (kernel monotonic time).
func Decode(p *Pair, now time.Duration) Flow {
	f := Flow{Proto: ProtoName(p.proto()), State: p.State(), Idle: now - p.LastSeen(), Orphan: !p.HasFwd || !p.HasRev}
	switch {
	case p.HasFwd:
		f.Client = addrPort(p.FwdKey.Saddr, p.FwdKey.Sport)
		f.Frontend = addrPort(p.FwdKey.Daddr, p.FwdKey.Dport)
		f.Backend = addrPort(p.Fwd.NatAddr, p.Fwd.NatPort)
		f.ServiceID = p.Fwd.SvcId
		if p.Fwd.Flags&gen.SluiceCtFlagsCT_SNAT != 0 {
			f.SNAT = addrPort(p.Fwd.SnatAddr, p.Fwd.SnatPort)
		}
		if p.Fwd.Flags&gen.SluiceCtFlagsCT_DSR != 0 && p.HasRev {
			// The backend's node: the packets came already translated; the
			// reverse entry knows the frontend the replies leave from.
			f.Frontend = addrPort(p.Rev.NatAddr, p.Rev.NatPort)
		}
	default: // only the reverse entry: it knows the client and the frontend too
		f.Backend = addrPort(p.RevKey.Saddr, p.RevKey.Sport)
		f.Frontend = addrPort(p.Rev.NatAddr, p.Rev.NatPort)
		f.Client = addrPort(p.Rev.SnatAddr, p.Rev.SnatPort)
		f.ServiceID = p.Rev.SvcId
		if p.Rev.Flags&gen.SluiceCtFlagsCT_SNAT != 0 {
			f.SNAT = addrPort(p.RevKey.Daddr, p.RevKey.Dport)
		}
	}
	switch {
	case p.DSRFront():
		f.DSR = DSRSent
	case (p.Fwd.Flags|p.Rev.Flags)&gen.SluiceCtFlagsCT_DSR != 0:
		f.DSR = DSRAnswered
	}
	return f
}

// String reads like
// "tcp 10.0.0.5:41234 -> 10.96.0.10:80 (nat 10.244.1.7:8080) established, last seen 3s ago".
func (f Flow) String() string {
	var b strings.Builder
	if f.ServiceID == 0 && f.Frontend == f.Backend {
		fmt.Fprintf(&b, "%s %v -> %v (direct", f.Proto, f.Client, f.Frontend)
	} else {
		fmt.Fprintf(&b, "%s %v -> %v (nat %v", f.Proto, f.Client, f.Frontend, f.Backend)
	}
	if f.SNAT.IsValid() {
		fmt.Fprintf(&b, ", snat %v", f.SNAT)
	}
	if f.DSR != "" {
		fmt.Fprintf(&b, ", dsr %s", f.DSR)
	}
	fmt.Fprintf(&b, ") %s, last seen %s ago", f.State, f.Idle.Truncate(time.Second))
	if f.Orphan {
		b.WriteString(" [orphan]")
	}
	return b.String()
}
