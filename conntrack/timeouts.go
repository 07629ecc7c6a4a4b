package conntrack

import (
	"time"

	"github.com/sluice-net/sluice/gen"
)

// Timeouts decide when an idle flow expires, by protocol and TCP state.
type Timeouts struct {
	// CreationGrace: no flow younger than this is expired, whatever its state.
	CreationGrace  time.Duration
	TCPSynSent     time.Duration
	TCPEstablished time.Duration
	// TCPFinsSeen applies once both sides sent a FIN.
	TCPFinsSeen time.Duration
	// TCPServerTimeWait applies instead of TCPFinsSeen when the server sent
	// the first FIN: the server then holds the tuple in TIME_WAIT, and the
	// datapath keeps new flows off it for TCP_TIME_WAIT_NS (bpf/include/
	// consts.h) after the flow's last packet, which needs the flow's
	// entries; it must not be shorter than that.
	TCPServerTimeWait time.Duration
	// TCPResetSeen applies once either side sent a RST.
	TCPResetSeen time.Duration
	UDP          time.Duration
	// SCTP's, by its association's state as its chunks tell it
	// (bpf/include/sctp.h): opening (INIT sent, not answered), established
	// (the destination answered), closing (SHUTDOWN seen), closed (ABORT
	// or SHUTDOWN COMPLETE seen).
	SCTPOpening     time.Duration
	SCTPEstablished time.Duration
	SCTPClosing     time.Duration
	SCTPClosed      time.Duration
	ICMP            time.Duration
	Other           time.Duration
}

// DefaultTimeouts are Calico's defaults; SCTP's are netfilter's (Calico has
// none): an established association's heartbeats, every 30 s by default,
// keep it well within its 210 s.
func DefaultTimeouts() Timeouts {
	return Timeouts{
		CreationGrace:     10 * time.Second,
		TCPSynSent:        20 * time.Second,
		TCPEstablished:    time.Hour,
		TCPFinsSeen:       30 * time.Second,
		TCPServerTimeWait: 2 * time.Minute,
		TCPResetSeen:      40 * time.Second,
		UDP:               60 * time.Second,
		SCTPOpening:       3 * time.Second,
		SCTPEstablished:   210 * time.Second,
		SCTPClosing:       3 * time.Second,
		SCTPClosed:        10 * time.Second,
		ICMP:              5 * time.Second,
		Other:             10 * time.Minute,
	}
}

// TCP flag bits recorded in ct_value.tcp_seen (bpf/include/parse.h); an
// SCTP packet's first chunk is recorded as such (bpf/include/sctp.h): INIT
// as SYN, INIT ACK as SYN|ACK, SHUTDOWN and SHUTDOWN ACK as FIN, ABORT and
// SHUTDOWN COMPLETE as RST, any other chunk as ACK.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
	// finFirst marks the direction whose FIN came first (enum ct_seen).
	finFirst = uint32(gen.SluiceCtSeenCT_SEEN_FIN_FIRST)
	// seenPacket marks an entry a packet matched after the flow's creation:
	// on the reverse entry, an answer.
	seenPacket = uint32(gen.SluiceCtSeenCT_SEEN_PACKET)
)

const (
	protoICMP   = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58
	protoSCTP   = 132
)

// State is a flow's state as the timeouts see it.
type State string

// Flow states.
const (
	StateSynSent     State = "syn-sent"
	StateEstablished State = "established"
	StateFinsSeen    State = "closing"
	// StateServerTimeWait: FINs both ways, the server's first; the server
	// holds the tuple in TIME_WAIT.
	StateServerTimeWait State = "server-time-wait"
	StateReset          State = "reset"
	StateActive         State = "active" // any flow but TCP and SCTP
)

// Pair is a flow's two conntrack entries; either may be missing (an orphan).
// Entries of both families are in the IPv6 layout (Key, Entry).
type Pair struct {
	FwdKey, RevKey Key
	Fwd, Rev       Entry
	HasFwd, HasRev bool
}

func (p *Pair) proto() uint8 {
	if p.HasFwd {
		return p.FwdKey.Proto
	}
	return p.RevKey.Proto
}

// DSRFront tells whether this node balanced the flow to a remote backend
// by direct server return (bpf/include/dsr.h): the backend's node answers
// the client directly, so only the forward entry ever sees a packet here.
func (p *Pair) DSRFront() bool {
	e := &p.Fwd
	if !p.HasFwd {
		e = &p.Rev
	}
	return e.Flags&(gen.SluiceCtFlagsCT_DSR|gen.SluiceCtFlagsCT_BACKEND_LOCAL) == gen.SluiceCtFlagsCT_DSR
}

// State derives the TCP state from the flags each direction has seen; an
// SCTP association's in the same terms (sctpState).
func (p *Pair) State() State {
	switch p.proto() {
	case protoTCP:
	case protoSCTP:
		return p.sctpState()
	default:
		return StateActive
	}
	fwd, rev := p.Fwd.TcpSeen, p.Rev.TcpSeen
	if p.DSRFront() {
		// The client's side alone: its ACK after the SYN completes the
		// handshake, its FIN or RST ends the flow.
		switch {
		case fwd&tcpRST != 0:
			return StateReset
		case fwd&tcpFIN != 0:
			return StateFinsSeen
		case fwd&tcpACK != 0:
			return StateEstablished
		}
		return StateSynSent
	}
	switch {
	case (fwd|rev)&tcpRST != 0:
		return StateReset
	case fwd&tcpFIN != 0 && rev&tcpFIN != 0 && rev&finFirst != 0:
		return StateServerTimeWait
	case !p.HasFwd && rev&tcpFIN != 0 && rev&finFirst != 0:
		// A reverse entry alone whose server closed first: the client
		// reopened its tuple toward another backend and its forward entry
		// went to the new flow; this entry guards the server's TIME_WAIT
		// (bpf/include/ct_new.h, ct_reopened). Judged as established, it
		// would hold its tuple and a conntrack slot for an hour.
		return StateServerTimeWait
	case fwd&tcpFIN != 0 && rev&tcpFIN != 0:
		return StateFinsSeen
	case rev&(tcpSYN|tcpACK) == tcpSYN|tcpACK:
		return StateEstablished
	}
	return StateSynSent
}

// sctpState is an SCTP association's state in TCP's terms: reset once
// either side aborted it or completed its shutdown, closing once either
// side began one, established once the destination answered anything
// (its INIT ACK, or any chunk of an association already up when this flow
// was first seen), syn-sent before.
func (p *Pair) sctpState() State {
	fwd, rev := p.Fwd.TcpSeen, p.Rev.TcpSeen
	switch {
	case (fwd|rev)&tcpRST != 0:
		return StateReset
	case (fwd|rev)&tcpFIN != 0:
		return StateFinsSeen
	case rev&tcpACK != 0:
		return StateEstablished
	}
	return StateSynSent
}

// Assured tells whether the destination answered: a TCP flow whose server
// sent its SYN-ACK, another flow with a reply seen (netfilter's assured).
// Under pressure, the scanner drops flows that are not assured first.
func (p *Pair) Assured() bool {
	if p.DSRFront() {
		// No reply passes here: the client's own packets after its first.
		if p.proto() == protoTCP {
			return p.Fwd.TcpSeen&tcpACK != 0
		}
		return p.Fwd.TcpSeen&seenPacket != 0
	}
	if !p.HasRev {
		return false
	}
	switch p.proto() {
	case protoTCP:
		return p.Rev.TcpSeen&(tcpSYN|tcpACK) == tcpSYN|tcpACK
	case protoSCTP:
		return p.Rev.TcpSeen&tcpACK != 0
	}
	return p.Rev.TcpSeen&seenPacket != 0
}

// Ended tells whether a TCP flow is over: FINs both ways, or a RST (an
// SCTP association: a SHUTDOWN or an ABORT). Its entries are then kept
// only for late packets (a retransmitted last FIN) and the clash rules,
// and go first when the map is under pressure.
func (p *Pair) Ended() bool {
	if p.proto() != protoTCP && p.proto() != protoSCTP {
		return false
	}
	switch p.State() {
	case StateReset, StateFinsSeen, StateServerTimeWait:
		return true
	}
	return false
}

// LastSeen is the later of the two entries' last packets (kernel monotonic).
func (p *Pair) LastSeen() time.Duration {
	return time.Duration(max(p.Fwd.LastSeen, p.Rev.LastSeen))
}

// Created is when the flow's first packet was seen (kernel monotonic).
func (p *Pair) Created() time.Duration {
	if p.HasFwd {
		return time.Duration(p.Fwd.Created)
	}
	return time.Duration(p.Rev.Created)
}

// Timeout returns the idle time after which the flow expires.
func (t *Timeouts) Timeout(p *Pair) time.Duration {
	switch p.proto() {
	case protoTCP:
		switch p.State() {
		case StateReset:
			return t.TCPResetSeen
		case StateFinsSeen:
			return t.TCPFinsSeen
		case StateServerTimeWait:
			return max(t.TCPFinsSeen, t.TCPServerTimeWait)
		case StateEstablished:
			return t.TCPEstablished
		}
		return t.TCPSynSent
	case protoSCTP:
		switch p.sctpState() {
		case StateReset:
			return t.SCTPClosed
		case StateFinsSeen:
			return t.SCTPClosing
		case StateEstablished:
			return t.SCTPEstablished
		}
		return t.SCTPOpening
	case protoUDP:
		return t.UDP
	case protoICMP:
		return t.ICMP
	}
	return t.Other
}

// shortest is the least idle time after which a flow of proto can expire.
func (t *Timeouts) shortest(proto uint8) time.Duration {
	switch proto {
	case protoTCP:
		return min(t.TCPSynSent, t.TCPEstablished, t.TCPFinsSeen, t.TCPResetSeen, max(t.TCPFinsSeen, t.TCPServerTimeWait))
	case protoSCTP:
		return min(t.SCTPOpening, t.SCTPEstablished, t.SCTPClosing, t.SCTPClosed)
	case protoUDP:
		return t.UDP
	case protoICMP:
		return t.ICMP
	}
	return t.Other
}

// aliveByForward: the forward entry alone proves the flow is not expired (it
// is young, or it saw a packet within the shortest timeout of its protocol),
// so the reverse entry need not be read to judge liveness.
func (t *Timeouts) aliveByForward(k *Key, v *Entry, now time.Duration) bool {
	return now-time.Duration(v.Created) < t.CreationGrace || now-time.Duration(v.LastSeen) <= t.shortest(k.Proto)
}

// Expired judges the pair at now (kernel monotonic time).
func (t *Timeouts) Expired(p *Pair, now time.Duration) bool {
	if now-p.Created() < t.CreationGrace {
		return false
	}
	return now-p.LastSeen() > t.Timeout(p)
}
