// Package netfilter reads and writes the kernel's own connection tracking
// (netfilter conntrack, over ctnetlink) for the moments Sluice shares a node
// with a netfilter proxy: taking a node over from kube-proxy, whose
// connections are translated by netfilter's NAT, and giving it back.
//
// It sees netfilter's entries as Flows: the tuple the client sent (Client,
// Frontend) and the tuple the backend answers on (Backend, Source), which
// differ where netfilter translated the flow (DNAT to a Service's backend,
// SNAT to the node's address).
package netfilter

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	nf "github.com/ti-mo/netfilter"
)

// Protocol numbers of the flows handled here.
const (
	ProtoTCP = 6
	ProtoUDP = 17
)

// TCP states of netfilter's conntrack (enum tcp_conntrack).
const (
	TCPSynSent     = 1
	TCPSynRecv     = 2
	TCPEstablished = 3
	TCPFinWait     = 4
	TCPCloseWait   = 5
	TCPLastAck     = 6
	TCPTimeWait    = 7
	TCPClose       = 8
)

// Flow is one of netfilter's entries.
type Flow struct {
	Proto    uint8
	Client   netip.AddrPort // the original direction's source
	Frontend netip.AddrPort // the original direction's destination
	Backend  netip.AddrPort // the reply direction's source
	Source   netip.AddrPort // the reply direction's destination: the client as the backend sees it
	// TCPState is the TCP state (TCP*), 0 for UDP.
	TCPState uint8
	// Assured: both directions were seen (IPS_ASSURED).
	Assured bool
	// Timeout is what is left of the entry's life.
	Timeout time.Duration
}

// DNAT tells whether netfilter translated the flow's destination.
func (f Flow) DNAT() bool { return f.Frontend != f.Backend }

// SNAT tells whether netfilter translated the flow's source.
func (f Flow) SNAT() bool { return f.Client != f.Source }

// Established tells whether a TCP flow is established (UDP flows always are).
func (f Flow) Established() bool { return f.Proto != ProtoTCP || f.TCPState == TCPEstablished }

func (f Flow) String() string {
	s := fmt.Sprintf("%s %v -> %v", protoName(f.Proto), f.Client, f.Frontend)
	if f.DNAT() || f.SNAT() {
		s += fmt.Sprintf(" (nat %v", f.Backend)
		if f.SNAT() {
			s += fmt.Sprintf(", snat %v", f.Source)
		}
		s += ")"
	}
	return s
}

func protoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	}
	return fmt.Sprintf("proto-%d", p)
}

// ErrExists is returned by Create when netfilter already tracks one of the
// flow's tuples.
var ErrExists = errors.New("netfilter already tracks the flow")

// Conn is a ctnetlink connection in the network namespace it was dialled in.
type Conn struct {
	ct *conntrack.Conn
	nf *nf.Conn
}

// Dial opens a ctnetlink connection in the calling thread's network
// namespace.
func Dial() (*Conn, error) {
	ct, err := conntrack.Dial(nil)
	if err != nil {
		return nil, fmt.Errorf("ctnetlink: %w", err)
	}
	raw, err := nf.Dial(nil)
	if err != nil {
		ct.Close()
		return nil, fmt.Errorf("ctnetlink: %w", err)
	}
	return &Conn{ct: ct, nf: raw}, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return errors.Join(c.ct.Close(), c.nf.Close()) }

// Translated lists netfilter's TCP and UDP entries, both families, whose
// destination was translated (DNAT): the flows a proxy balanced.
func (c *Conn) Translated() ([]Flow, error) {
	flows, err := c.ct.Dump(nil)
	if err != nil {
		return nil, fmt.Errorf("dump netfilter's conntrack: %w", err)
	}
	var out []Flow
	for _, cf := range flows {
		f, ok := flowOf(cf)
		if ok && f.DNAT() {
			out = append(out, f)
		}
	}
	return out, nil
}

func flowOf(cf conntrack.Flow) (Flow, bool) {
	o, r := cf.TupleOrig, cf.TupleReply
	if o.Proto.Protocol != ProtoTCP && o.Proto.Protocol != ProtoUDP {
		return Flow{}, false
	}
	f := Flow{
		Proto:    o.Proto.Protocol,
		Client:   netip.AddrPortFrom(o.IP.SourceAddress.Unmap(), o.Proto.SourcePort),
		Frontend: netip.AddrPortFrom(o.IP.DestinationAddress.Unmap(), o.Proto.DestinationPort),
		Backend:  netip.AddrPortFrom(r.IP.SourceAddress.Unmap(), r.Proto.SourcePort),
		Source:   netip.AddrPortFrom(r.IP.DestinationAddress.Unmap(), r.Proto.DestinationPort),
		Assured:  cf.Status.Assured(),
		Timeout:  time.Duration(cf.Timeout) * time.Second,
	}
	if cf.ProtoInfo.TCP != nil {
		f.TCPState = cf.ProtoInfo.TCP.State
	}
	return f, true
}

// Delete deletes netfilter's entry of f (found by its original tuple). A
// flow netfilter does not track is not an error.
func (c *Conn) Delete(f Flow) error {
	// Both tuples: the reply's family names the request's (an original
	// tuple alone is sent as IPv4).
	err := c.ct.Delete(conntrack.Flow{TupleOrig: tuple(f.Proto, f.Client, f.Frontend), TupleReply: tuple(f.Proto, f.Backend, f.Source)})
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("delete netfilter's entry of %v: %w", f, err)
	}
	return nil
}

func tuple(proto uint8, src, dst netip.AddrPort) conntrack.Tuple {
	return conntrack.Tuple{
		IP:    conntrack.IPTuple{SourceAddress: src.Addr(), DestinationAddress: dst.Addr()},
		Proto: conntrack.ProtoTuple{Protocol: proto, SourcePort: src.Port(), DestinationPort: dst.Port()},
	}
}

// ctnetlink's attribute types (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaStatus     = 3
	ctaProtoinfo  = 4
	ctaNATSrc     = 6
	ctaTimeout    = 7
	ctaNATDst     = 13

	ctaTupleIP    = 1
	ctaTupleProto = 2
	ctaIPv4Src    = 1
	ctaIPv4Dst    = 2
	ctaIPv6Src    = 3
	ctaIPv6Dst    = 4
	ctaProtoNum   = 1
	ctaProtoSrc   = 2
	ctaProtoDst   = 3

	ctaNATv4Min   = 1
	ctaNATv4Max   = 2
	ctaNATProto   = 3
	ctaNATv6Min   = 4
	ctaNATv6Max   = 5
	ctaPortMin    = 1
	ctaPortMax    = 2
	ctaProtoTCP   = 1
	ctaTCPState   = 1
	ctaTCPFlagsOr = 4
	ctaTCPFlagsRe = 5

	ipctnlMsgCtNew = 0

	// IPS_SEEN_REPLY | IPS_ASSURED | IPS_CONFIRMED: an entry created
	// unconfirmed is refused (EBUSY) when ctnetlink inserts it.
	statusLive = 1<<1 | 1<<2 | 1<<3
	// IP_CT_TCP_FLAG_BE_LIBERAL: window tracking starts from the next
	// segments, as for a connection picked up mid-stream.
	tcpFlagLiberal = 0x08
)

// Create writes f into netfilter's conntrack as a confirmed, assured flow
// with its translation (DNAT to Backend, SNAT to Source where they differ
// from the original tuple), to live timeout: netfilter then carries the
// flow's packets on, translated, as if it had balanced it itself. It
// returns ErrExists when either of f's tuples is tracked already.
func (c *Conn) Create(f Flow, timeout time.Duration) error {
	if f.Client.Addr().Is4() != f.Backend.Addr().Is4() || f.Frontend.Addr().Is4() != f.Source.Addr().Is4() ||
		f.Client.Addr().Is4() != f.Frontend.Addr().Is4() {
		return fmt.Errorf("create netfilter's entry of %v: mixed address families", f)
	}
	family := nf.ProtoIPv4
	if !f.Client.Addr().Is4() {
		family = nf.ProtoIPv6
	}
	// The reply tuple is the untranslated one, as of a flow the NAT rules
	// have not seen yet: the kernel derives the translated reply tuple, and
	// the NAT status that makes it translate packets, from the bindings
	// (nf_nat_setup_info), and does nothing for a reply tuple already
	// translated.
	attrs := []nf.Attribute{
		tupleAttr(ctaTupleOrig, f.Proto, f.Client, f.Frontend),
		tupleAttr(ctaTupleReply, f.Proto, f.Frontend, f.Client),
		u32Attr(ctaStatus, statusLive),
		u32Attr(ctaTimeout, uint32(max(timeout/time.Second, 1))),
	}
	if f.DNAT() {
		attrs = append(attrs, natAttr(ctaNATDst, f.Backend))
	}
	if f.SNAT() {
		attrs = append(attrs, natAttr(ctaNATSrc, f.Source))
	}
	if f.Proto == ProtoTCP {
		state := f.TCPState
		if state == 0 {
			state = TCPEstablished
		}
		flags := nf.Attribute{Type: ctaTCPFlagsOr, Data: []byte{tcpFlagLiberal, tcpFlagLiberal}}
		flagsReply := nf.Attribute{Type: ctaTCPFlagsRe, Data: []byte{tcpFlagLiberal, tcpFlagLiberal}}
		attrs = append(attrs, nf.Attribute{Type: ctaProtoinfo, Nested: true, Children: []nf.Attribute{
			{Type: ctaProtoTCP, Nested: true, Children: []nf.Attribute{{Type: ctaTCPState, Data: []byte{state}}, flags, flagsReply}},
		}})
	}
	req, err := nf.MarshalNetlink(nf.Header{
		SubsystemID: nf.NFSubsysCTNetlink,
		MessageType: nf.MessageType(ipctnlMsgCtNew),
		Family:      family,
		Flags:       netlink.Request | netlink.Acknowledge | netlink.Create | netlink.Excl,
	}, attrs)
	if err != nil {
		return fmt.Errorf("create netfilter's entry of %v: %w", f, err)
	}
	if _, err := c.nf.Query(req); err != nil {
		if errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("create netfilter's entry of %v: %w", f, ErrExists)
		}
		return fmt.Errorf("create netfilter's entry of %v: %w", f, err)
	}
	return nil
}

func u32Attr(t uint16, v uint32) nf.Attribute {
	a := nf.Attribute{Type: t}
	a.PutUint32(v)
	return a
}

func u16Attr(t uint16, v uint16) nf.Attribute {
	a := nf.Attribute{Type: t}
	a.PutUint16(v)
	return a
}

func tupleAttr(t uint16, proto uint8, src, dst netip.AddrPort) nf.Attribute {
	ip := nf.Attribute{Type: ctaTupleIP, Nested: true}
	if src.Addr().Is4() {
		s, d := src.Addr().As4(), dst.Addr().As4()
		ip.Children = []nf.Attribute{{Type: ctaIPv4Src, Data: s[:]}, {Type: ctaIPv4Dst, Data: d[:]}}
	} else {
		s, d := src.Addr().As16(), dst.Addr().As16()
		ip.Children = []nf.Attribute{{Type: ctaIPv6Src, Data: s[:]}, {Type: ctaIPv6Dst, Data: d[:]}}
	}
	return nf.Attribute{Type: t, Nested: true, Children: []nf.Attribute{ip, {Type: ctaTupleProto, Nested: true, Children: []nf.Attribute{
		{Type: ctaProtoNum, Data: []byte{proto}}, u16Attr(ctaProtoSrc, src.Port()), u16Attr(ctaProtoDst, dst.Port()),
	}}}}
}

// natAttr is a NAT binding to exactly to: one address, one port.
func natAttr(t uint16, to netip.AddrPort) nf.Attribute {
	var addrs []nf.Attribute
	if to.Addr().Is4() {
		a := to.Addr().As4()
		addrs = []nf.Attribute{{Type: ctaNATv4Min, Data: a[:]}, {Type: ctaNATv4Max, Data: a[:]}}
	} else {
		a := to.Addr().As16()
		addrs = []nf.Attribute{{Type: ctaNATv6Min, Data: a[:]}, {Type: ctaNATv6Max, Data: a[:]}}
	}
	ports := nf.Attribute{Type: ctaNATProto, Nested: true, Children: []nf.Attribute{
		u16Attr(ctaPortMin, to.Port()), u16Attr(ctaPortMax, to.Port()),
	}}
	return nf.Attribute{Type: t, Nested: true, Children: append(addrs, ports)}
}
