package maps

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/sluice-net/sluice/gen"
)

// EventBudget is each CPU's flow-event budget (bpf/include/events.h).
var EventBudget = PerCPUDef[uint32, gen.SluiceEvCpu]{Name: gen.SluiceMapSlEvcpuV1}

// Event types, as Event.Type says them.
const (
	EventDrop      = "drop"
	EventFlowStart = "flow-start"
	EventFlowEnd   = "flow-end"
)

// Event is one flow event of the datapath (struct event in
// bpf/include/events.h), decoded.
type Event struct {
	// Time is when the datapath wrote it, on the kernel's monotonic clock
	// (conntrack.Monotonic); At converts it.
	Time time.Duration `json:"-"`
	Type string        `json:"type"`
	// Reason: a drop's counter name ("drop_src_range"); a flow end's TCP
	// flags ("fin", "rst").
	Reason string `json:"reason,omitempty"`
	Proto  string `json:"proto"`
	// Src and Dst: the packet's addresses and ports where the event was
	// written (a flow's as it came: client and frontend).
	Src netip.AddrPort `json:"src"`
	Dst netip.AddrPort `json:"dst"`
	// Backend: a flow start's backend.
	Backend netip.AddrPort `json:"backend,omitzero"`
	// ServiceID names the Service (sl_svcname_v1), where known.
	ServiceID uint32 `json:"serviceID,omitempty"`
	// RuleID: a policy's drop: the rule that denied (policy rule ids).
	RuleID  uint32 `json:"ruleID,omitempty"`
	Ifindex uint32 `json:"ifindex"`
	// Hook is where the packet was: from_wl, to_wl, from_host, to_host
	// (a policy's drop: its direction, from_wl for egress, to_wl for
	// ingress).
	Hook string `json:"hook"`
}

var hookNames = []string{"from_wl", "to_wl", "from_host", "to_host"}

// DecodeEvent decodes one ring-buffer record; names are the counter names
// (CounterNames) for a drop's reason.
func DecodeEvent(raw []byte, names map[gen.SluiceCounter]string) (Event, error) {
	var e gen.SluiceEvent
	if err := binary.Read(bytes.NewReader(raw), binary.NativeEndian, &e); err != nil {
		return Event{}, fmt.Errorf("flow event of %d bytes: %w", len(raw), err)
	}
	out := Event{Time: time.Duration(e.Ts), ServiceID: e.SvcId, RuleID: e.RuleId, Ifindex: e.Ifindex,
		Proto: protoName(e.Proto)}
	addr := func(a [16]uint8, port uint16) netip.AddrPort {
		return netip.AddrPortFrom(gen.AddrFromNet6(a).Unmap(), gen.PortFromNet(port))
	}
	out.Src, out.Dst = addr(e.Saddr, e.Sport), addr(e.Daddr, e.Dport)
	if int(e.Hook) < len(hookNames) {
		out.Hook = hookNames[e.Hook]
	}
	switch e.Type {
	case gen.SluiceEventTypeEV_DROP:
		out.Type = EventDrop
		out.Reason = names[gen.SluiceCounter(e.Reason)]
		if out.Reason == "" {
			out.Reason = fmt.Sprintf("counter %d", e.Reason)
		}
	case gen.SluiceEventTypeEV_FLOW_START:
		out.Type = EventFlowStart
		out.Backend = addr(e.NatAddr, e.NatPort)
	case gen.SluiceEventTypeEV_FLOW_END:
		out.Type = EventFlowEnd
		out.Reason = "fin"
		if e.Reason&0x04 != 0 { // TCP_FLAG_RST
			out.Reason = "rst"
		}
	default:
		return out, fmt.Errorf("flow event of unknown type %d", e.Type)
	}
	return out, nil
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 1:
		return "icmp"
	case 58:
		return "icmpv6"
	}
	return fmt.Sprintf("proto-%d", p)
}

// String reads like "drop drop_src_range tcp 198.51.100.9:50000 -> 10.0.0.1:30082 at from_host".
func (e Event) String() string {
	var b strings.Builder
	b.WriteString(e.Type)
	if e.Reason != "" {
		b.WriteString(" " + e.Reason)
	}
	fmt.Fprintf(&b, " %s %v -> %v", e.Proto, e.Src, e.Dst)
	if e.Backend.IsValid() {
		fmt.Fprintf(&b, " backend %v", e.Backend)
	}
	if e.Reason == "drop_policy" {
		b.WriteString(" rule " + RuleName(e.RuleID))
	}
	if e.Hook != "" {
		fmt.Fprintf(&b, " at %s", e.Hook)
	}
	return b.String()
}

// RuleName names a policy rule id for people: its number, or for the
// implicit verdicts (policy.ImplicitRuleBase, policy.EndOfPolicyRule) the
// default of a tier ("tier-1-default") or the end of the policy.
func RuleName(id uint32) string {
	const implicitBase, endOfPolicy = 0xffff0000, 0xffffffff
	switch {
	case id == endOfPolicy:
		return "end-of-policy"
	case id >= implicitBase:
		return fmt.Sprintf("tier-%d-default", id-implicitBase)
	}
	return fmt.Sprint(id)
}

// EventPoll is how often a reader looks for events: the datapath wakes it
// only once 64 KiB of events wait (bpf/include/events.h), so an event is
// read at most this late.
const EventPoll = 200 * time.Millisecond

// EventReader reads the datapath's flow events. The ring buffer has one
// reader at a time: two would each see part of the events.
type EventReader struct {
	rd       *ringbuf.Reader
	names    map[gen.SluiceCounter]string
	deadline time.Time
}

// OpenEvents reads the flow-event ring buffer of s.
func OpenEvents(s *Set) (*EventReader, error) {
	m, ok := s.maps[gen.SluiceMapSlEventsV1]
	if !ok {
		return nil, fmt.Errorf("map %s is not open in %s", gen.SluiceMapSlEventsV1, s.dir)
	}
	names, err := CounterNames()
	if err != nil {
		return nil, err
	}
	rd, err := ringbuf.NewReader(m)
	if err != nil {
		return nil, fmt.Errorf("flow events: %w", err)
	}
	return &EventReader{rd: rd, names: names}, nil
}

// ErrNoEvent is Read's error when the deadline passed without an event.
var ErrNoEvent = errors.New("no flow event before the deadline")

// SetDeadline makes Read return ErrNoEvent after t (the zero time: never).
func (r *EventReader) SetDeadline(t time.Time) { r.deadline = t }

// Read waits for the next event, looking every EventPoll.
func (r *EventReader) Read() (Event, error) {
	for {
		poll := time.Now().Add(EventPoll)
		if !r.deadline.IsZero() && r.deadline.Before(poll) {
			poll = r.deadline
		}
		r.rd.SetDeadline(poll)
		rec, err := r.rd.Read()
		if err == nil {
			return DecodeEvent(rec.RawSample, r.names)
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return Event{}, fmt.Errorf("flow events: %w", err)
		}
		if !r.deadline.IsZero() && !time.Now().Before(r.deadline) {
			return Event{}, ErrNoEvent
		}
	}
}

// Close stops a blocked Read and releases the reader.
func (r *EventReader) Close() error { return r.rd.Close() }
