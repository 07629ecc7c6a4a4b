package conntrack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// Reason says why a flow was deleted.
type Reason string

// Deletion reasons.
const (
	ReasonExpired  Reason = "expired"
	ReasonStaleNAT Reason = "stale-nat"
	ReasonOrphan   Reason = "orphan"  // one entry whose peer is gone
	ReasonFlushed  Reason = "flushed" // FlushBackends
	// ReasonEarlyDrop: the map is under pressure and the flow was never
	// answered (a flood's, most often), or it has ended (FINs both ways, or
	// a RST) and is only held for its last packets and the clash rules, as
	// netfilter's early_drop, which evicts unassured flows and TCP flows
	// past their FINs; or, while the map stays past the low-water mark, a
	// datagram flow idle a second, or a guard of a server's TIME_WAIT
	// (ReasonGuardOnly).
	ReasonEarlyDrop Reason = "early-drop"
	// ReasonGuardOnly: the map is under pressure and the flow's server
	// closed first: its forward entry is deleted, and its reverse entry
	// alone stays to keep new flows off the tuple the server holds in
	// TIME_WAIT (one entry, as netfilter's TIME_WAIT conntrack). Such a
	// guard is dropped only while the map stays past the low-water mark,
	// oldest first. Counted per forward entry deleted: the flow lives on
	// as its guard.
	ReasonGuardOnly Reason = "guard-only"
)

// EntryScanner is one link of the scanner's chain: it judges flows.
type EntryScanner interface {
	// Prepare runs before each scan, e.g. to snapshot other maps.
	Prepare(now time.Duration) error
	// Check returns why the flow should be deleted, or "" to keep it.
	Check(p *Pair, now time.Duration) Reason
}

// Liveness expires idle flows by Timeouts.
type Liveness struct{ Timeouts Timeouts }

// Prepare does nothing: liveness needs no other state.
func (*Liveness) Prepare(time.Duration) error { return nil }

// Check expires the flow when it has been idle past its timeout.
func (l *Liveness) Check(p *Pair, now time.Duration) Reason {
	if l.Timeouts.Expired(p, now) {
		return ReasonExpired
	}
	return ""
}

// Options configures a Scanner.
type Options struct {
	// Conntrack and Conntrack6 are the maps to scan (maps.Conntrack,
	// maps.Conntrack6); Conntrack6 may be nil. Each map's fill is judged on
	// its own.
	Conntrack  *maps.Map[gen.SluiceCtKey, gen.SluiceCtValue]
	Conntrack6 *maps.Map[Key, Entry]
	// Scanners is the chain each flow passes; the first reason wins. Nil:
	// Liveness with DefaultTimeouts.
	Scanners []EntryScanner
	// Clock returns the kernel's monotonic time (the datapath stamps entries
	// with its coarse reading, sl_now). Nil: CLOCK_MONOTONIC.
	Clock func() time.Duration
	// Interval is the first scan interval (default 10 s); the interval halves
	// while more than a quarter of the entries expire per scan, down to
	// MinInterval (default 1 s), and doubles while fewer than 5% do, up to
	// MaxInterval (default 1 min).
	Interval, MinInterval, MaxInterval time.Duration
	// PressureFill is the fill ratio above which the map is under pressure
	// (default 0.9): the next scan deletes the flows that were never
	// answered (see Pair.Assured) and are older than UnansweredGrace
	// (default 1 s), so that a flood of new flows, which can fill the map
	// but never evict an established flow, does not lock out the next
	// legitimate ones until its entries expire. It also deletes the TCP
	// flows that have ended (Pair.Ended) and saw no packet for EndedGrace
	// (default 1 s, past a first retransmission of a last FIN): their
	// entries are held for 30 s to 2 min after the end, so a node opening
	// thousands of connections a second would otherwise fill the map with
	// flows that are over and refuse every new one. Of a flow whose server
	// closed first it deletes only the forward entry; past a low-water mark
	// it goes on with idle datagram flows and those flows' reverse entries
	// (evictTowardMark). While its deletions leave the map past
	// PressureFill, the next scan comes after MinInterval.
	PressureFill    float64
	UnansweredGrace time.Duration
	EndedGrace      time.Duration
	// Entries, if set, reads how many entries each map holds by map name
	// without a walk (maps.Filler: the kernel's own counts). Run reads it
	// every MinInterval and scans at once when a map is past PressureFill,
	// and a scan that finds a map past it evicts as under pressure at once:
	// a burst of new flows can fill the map well within the interval of
	// an idle one (up to MaxInterval).
	Entries func() (map[string]int64, error)
	// OnScan, if set, receives every scan's statistics (metrics).
	OnScan func(ScanStats)
	Logger *slog.Logger
}

// ScanStats describe one scan.
type ScanStats struct {
	Entries          int
	Forward, Reverse int
	TCP, UDP, Other  int
	// Flows counts flows (forward entries) by protocol and state: TCP
	// "opening" (no ACK from the client yet), "established", "closing" (a
	// FIN or RST seen from the client); UDP and other protocols "active".
	Flows map[FlowState]int
	// Capacity sums the maps' capacities; FillRatio is the fullest map's
	// fill (the one that refuses new flows first) as the walk found it,
	// LeftRatio the fullest map's once the scan's deletions are applied.
	// Maps has each map's.
	Capacity             uint32
	FillRatio, LeftRatio float64
	Maps                 []MapFill
	// TimeToPressure is how soon the map nearest to it would pass
	// PressureFill, were entries added as fast as since the previous scan;
	// 0 when no map grew (or on the first scan).
	TimeToPressure time.Duration
	Deleted        map[Reason]int
	Duration       time.Duration
}

// MapFill is one conntrack map's fill at a scan.
type MapFill struct {
	Name     string
	Entries  int
	Capacity uint32
}

// FlowState is a flow's protocol and state, as the scanner counts them.
type FlowState struct{ Protocol, State string }

// flowState classifies a flow by its forward entry alone (the scan reads
// reverse entries only when it must).
func flowState(proto uint8, seen uint32) FlowState {
	switch proto {
	case protoTCP:
		switch {
		case seen&(tcpFIN|tcpRST) != 0:
			return FlowState{"tcp", "closing"}
		case seen&tcpACK != 0:
			return FlowState{"tcp", "established"}
		}
		return FlowState{"tcp", "opening"}
	case protoSCTP:
		switch {
		case seen&(tcpFIN|tcpRST) != 0:
			return FlowState{"sctp", "closing"}
		case seen&tcpACK != 0:
			return FlowState{"sctp", "established"}
		}
		return FlowState{"sctp", "opening"}
	case protoUDP:
		return FlowState{"udp", "active"}
	}
	return FlowState{"other", "active"}
}

// DeletedTotal sums the deletions of every reason.
func (s ScanStats) DeletedTotal() int {
	n := 0
	for _, c := range s.Deleted {
		n += c
	}
	return n
}

// fillWarning is the fill ratio above which a scan logs a warning, before
// the map comes under pressure (pressureFill) and well before it refuses
// new flows.
const (
	fillWarning  = 0.8
	pressureFill = 0.9
)

// Scanner walks the conntrack map and deletes flows the chain rejects.
type Scanner struct {
	opts Options
	log  *slog.Logger
	// Reused across entries and scans so a scan of a million entries makes
	// little garbage (a Pair handed to the chain's interfaces would escape).
	pair     Pair
	tables   []table
	toDelete []Key
	reasons  []Reason
	// Under pressure (evictTowardMark): trims are the forward entries of
	// flows whose server closed first, to delete (ReasonGuardOnly);
	// datagrams the forward entries of idle datagram flows, and guards the
	// reverse entries guarding a server's TIME_WAIT, that may be dropped.
	// Reused across scans under pressure, released after one that was
	// not: up to one per flow.
	trims, datagrams, guards []seenEntry
	// removed counts the entries evictTowardMark deleted one by one.
	removed int
	// pressure: the last scan found the map fuller than PressureFill, by
	// table.
	pressure []bool
	// left is what the last scan left in each table, at lastScan (kernel
	// monotonic; 0: no scan yet): the growth since is TimeToPressure's.
	// growth is each table's entries added a second between the last two
	// scans.
	left     []int
	growth   []float64
	lastScan time.Duration
	// countsFailed: the last read of Options.Entries failed (logged once).
	countsFailed bool
}

// NewScanner checks opts and fills in defaults.
func NewScanner(opts Options) (*Scanner, error) {
	if opts.Conntrack == nil {
		return nil, errors.New("conntrack scanner: no conntrack map")
	}
	if opts.Scanners == nil {
		opts.Scanners = []EntryScanner{&Liveness{Timeouts: DefaultTimeouts()}}
	}
	if opts.Clock == nil {
		opts.Clock = Monotonic
	}
	if opts.Interval == 0 {
		opts.Interval = 10 * time.Second
	}
	if opts.MinInterval == 0 {
		opts.MinInterval = time.Second
	}
	if opts.PressureFill == 0 {
		opts.PressureFill = pressureFill
	}
	if opts.UnansweredGrace == 0 {
		opts.UnansweredGrace = time.Second
	}
	if opts.EndedGrace == 0 {
		opts.EndedGrace = time.Second
	}
	if opts.MaxInterval == 0 {
		opts.MaxInterval = time.Minute
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	t := tables(opts.Conntrack, opts.Conntrack6)
	return &Scanner{opts: opts, log: log, tables: t, pressure: make([]bool, len(t)),
		left: make([]int, len(t)), growth: make([]float64, len(t))}, nil
}

// Monotonic is the kernel's monotonic clock, the one the datapath's
// timestamps are of (gen.Monotonic).
func Monotonic() time.Duration { return gen.Monotonic() }

// seenEntry is an entry a scan under pressure may delete, as its walk saw
// it: its key and last packet. Such entries are deleted one by one after
// the walk, each only if it has not changed since: a client reusing its
// port reopens the same tuple every few seconds, and a batch deletion after
// the walk would take the new flow's entry.
type seenEntry struct {
	key      Key
	lastSeen uint64
}

// Scan walks the map once. Each forward entry is judged together with its
// reverse entry (looked up by the peer key it holds) and both are deleted
// together. A reverse entry is judged alone only when it looks expired by its
// own data, to find orphans whose forward entry is gone.
//
// The walk uses batch lookups while the datapath keeps writing: flows created
// meanwhile may or may not be seen (they are young, so kept either way), and
// deletions are applied after the walk.
func (s *Scanner) Scan() (ScanStats, error) {
	start := time.Now()
	now := s.opts.Clock()
	st := ScanStats{Deleted: map[Reason]int{}, Flows: map[FlowState]int{}}
	for _, sc := range s.opts.Scanners {
		if err := sc.Prepare(now); err != nil {
			return st, fmt.Errorf("conntrack scan: prepare: %w", err)
		}
	}
	counts := s.counts()
	for i, t := range s.tables {
		entries, early := st.Entries, st.Deleted[ReasonEarlyDrop]
		pressure := s.pressure[i] || s.expectsPressure(i, t, now) || s.pastPressure(counts, t)
		// What the map gains in two polls of its count at the last
		// growth: an eviction leaves room for it below the mark.
		headroom := int(2 * s.growth[i] * s.opts.MinInterval.Seconds())
		if err := s.scanTable(t, pressure, headroom, now, &st); err != nil {
			return st, err
		}
		n := st.Entries - entries
		fill := float64(n) / float64(max(t.capacity(), 1))
		st.Capacity += t.capacity()
		st.FillRatio = max(st.FillRatio, fill)
		st.Maps = append(st.Maps, MapFill{Name: t.name(), Entries: n, Capacity: t.capacity()})
		if dropped := st.Deleted[ReasonEarlyDrop] - early; fill > fillWarning || dropped > 0 {
			s.log.Warn("conntrack map nearly full: new flows are refused when it is full, established ones are kept, and flows never answered or already ended are dropped first",
				"map", t.name(), "entries", n, "capacity", t.capacity(),
				"fill", fmt.Sprintf("%.0f%%", 100*fill), "early_dropped", dropped)
		}
		s.pressure[i] = fill > s.opts.PressureFill
		left := n - len(s.toDelete) - s.removed // entries, both of each deleted flow
		st.LeftRatio = max(st.LeftRatio, float64(left)/float64(max(t.capacity(), 1)))
		s.growth[i] = 0
		if grown := n - s.left[i]; s.lastScan > 0 && grown > 0 && now > s.lastScan {
			s.growth[i] = float64(grown) / (now - s.lastScan).Seconds()
			room := max(s.opts.PressureFill*float64(t.capacity())-float64(left), 0)
			ttp := time.Duration(room / s.growth[i] * float64(time.Second))
			if st.TimeToPressure == 0 || ttp < st.TimeToPressure {
				st.TimeToPressure = max(ttp, 1)
			}
		}
		s.left[i] = left
	}
	s.lastScan = now
	st.Duration = time.Since(start)
	if s.opts.OnScan != nil {
		s.opts.OnScan(st)
	}
	return st, nil
}

// scanTable walks one map and applies its deletions. Each forward entry is
// judged with its reverse entry, as Scan says; pressure: that map was fuller
// than PressureFill at the last scan.
func (s *Scanner) scanTable(t table, pressure bool, room int, now time.Duration, st *ScanStats) error {
	s.toDelete, s.reasons = s.toDelete[:0], s.reasons[:0]
	s.removed = 0
	if pressure {
		s.trims, s.datagrams, s.guards = s.trims[:0], s.datagrams[:0], s.guards[:0]
	} else {
		s.trims, s.datagrams, s.guards = nil, nil, nil
	}
	entries := st.Entries
	var walkErr error
	err := t.iterate(func(k Key, v Entry) bool {
		st.Entries++
		switch k.Proto {
		case protoTCP:
			st.TCP++
		case protoUDP:
			st.UDP++
		default:
			st.Other++
		}
		p := &s.pair
		if v.Type == gen.SluiceCtTypeCT_FORWARD {
			st.Forward++
			st.Flows[flowState(k.Proto, v.TcpSeen)]++
			*p = Pair{FwdKey: k, Fwd: v, HasFwd: true, RevKey: v.Peer}
			readRev := pressure || s.needsReverse(p, now)
			if readRev {
				if walkErr = lookupOwnReverse(t, p); walkErr != nil {
					return false
				}
			}
			reason := s.judge(p, now)
			if reason == "" && pressure {
				switch s.eviction(p, now) {
				case evictFlow:
					reason = ReasonEarlyDrop
				case evictForward:
					s.trims = append(s.trims, seenEntry{key: k, lastSeen: v.LastSeen})
					return true
				case evictPastMark:
					s.datagrams = append(s.datagrams, seenEntry{key: k, lastSeen: v.LastSeen})
				}
			}
			if reason != "" {
				s.delete(k, reason)
				if !readRev {
					if walkErr = lookupOwnReverse(t, p); walkErr != nil {
						return false
					}
				}
				if p.HasRev {
					s.delete(v.Peer, "")
				}
			}
			return true
		}
		st.Reverse++
		*p = Pair{RevKey: k, Rev: v, HasRev: true, FwdKey: v.Peer}
		if !s.looksExpired(p, now) {
			if pressure && k.Proto == protoTCP && v.TcpSeen&(tcpFIN|finFirst) == tcpFIN|finFirst &&
				now-time.Duration(v.LastSeen) > s.opts.EndedGrace {
				s.guards = append(s.guards, seenEntry{key: k, lastSeen: v.LastSeen})
			}
			return true
		}
		p.HasFwd, walkErr = t.lookup(v.Peer, &p.Fwd)
		if walkErr != nil {
			return false
		}
		if !p.HasFwd || p.Fwd.Peer != k {
			s.delete(k, ReasonOrphan) // its forward entry is gone or belongs to another flow
		}
		// Otherwise the forward entry judges the pair.
		return true
	})
	if err == nil {
		err = walkErr
	}
	if err == nil && pressure {
		err = s.evictTowardMark(t, st.Entries-entries, room, st)
	}
	if err != nil {
		return fmt.Errorf("conntrack scan: %s: %w", t.name(), err)
	}
	return s.applyDeletions(t, st)
}

// evictTowardMark deletes the forward entries of the flows whose server
// closed first (trims); then, while what the scan leaves of t's n entries is
// past the low-water mark, the idle datagram flows, least recently used
// first (datagrams), then the guards of the servers' TIME_WAIT, oldest
// first. The mark leaves room for the flows that keep coming until the next
// scans: 10 points under PressureFill, lower by what the map gains in two
// polls of its count when it grows faster (room), at most 30 points under.
//
// A datagram flow has no end to tell that it is over: a resolver asking from
// a new port for every query leaves flows answered once and idle, which the
// UDP timeout keeps a minute (netfilter does not assure them and
// early-drops them). Past the mark they go as in an LRU, after the flows
// never answered and before the guards; the client of one still in use
// starts a new flow with its next datagram. A server holds its TIME_WAIT for
// 60 s (Linux) to 4 minutes, so the oldest guard is the likeliest to guard
// nothing any more; one dropped early lets a new flow take a tuple whose
// server may still refuse its SYN (PAWS: the SYN is retransmitted), where a
// full map refuses new flows outright. Only reverse entries alone are
// guards: one whose flow still has its forward entry is live (a server that
// closed first while its client still sends).
//
// Each entry is read again right before its deletion and kept if a packet
// matched it since the walk, or a new flow took its key.
func (s *Scanner) evictTowardMark(t table, n, room int, st *ScanStats) error {
	left := n - len(s.toDelete)
	var e, other Entry
	// unchanged reads g's entry again into e: still there, no packet since.
	unchanged := func(g seenEntry) (bool, error) {
		ok, err := t.lookup(g.key, &e)
		return ok && e.LastSeen == g.lastSeen, err
	}
	remove := func(k Key, reason Reason) error {
		if err := t.remove(k); err != nil {
			return err
		}
		if reason != "" {
			st.Deleted[reason]++
		}
		s.removed++
		left--
		return nil
	}
	for _, g := range s.trims {
		ok, err := unchanged(g)
		if err == nil && ok {
			err = remove(g.key, ReasonGuardOnly)
		}
		if err != nil {
			return err
		}
	}
	c := float64(t.capacity())
	mark := max(min(int((s.opts.PressureFill-0.1)*c), int(s.opts.PressureFill*c)-room), int((s.opts.PressureFill-0.3)*c))
	// dropOldest goes through entries oldest first while the map stays
	// past the mark, and hands drop each one unchanged since the walk (its
	// entry read into e).
	dropOldest := func(entries []seenEntry, drop func(k Key) error) error {
		if left <= mark {
			return nil
		}
		slices.SortFunc(entries, func(a, b seenEntry) int { return cmp.Compare(a.lastSeen, b.lastSeen) })
		for _, g := range entries {
			if left <= mark {
				break
			}
			ok, err := unchanged(g)
			if err == nil && ok {
				err = drop(g.key)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	err := dropOldest(s.datagrams, func(k Key) error {
		rev := e.Peer
		if err := remove(k, ReasonEarlyDrop); err != nil {
			return err
		}
		ok, err := t.lookup(rev, &other)
		if err == nil && ok && other.Peer == k {
			err = remove(rev, "")
		}
		return err
	})
	if err != nil {
		return err
	}
	return dropOldest(s.guards, func(k Key) error {
		switch ok, err := t.lookup(e.Peer, &other); {
		case err != nil:
			return err
		case ok && other.Peer == k:
			return nil // its flow's forward entry is still there: live
		}
		return remove(k, ReasonEarlyDrop)
	})
}

// counts reads Options.Entries; nil without it or on an error (logged: the
// scans go on, on their interval).
func (s *Scanner) counts() map[string]int64 {
	if s.opts.Entries == nil {
		return nil
	}
	counts, err := s.opts.Entries()
	if err != nil {
		if !s.countsFailed { // once, not every poll
			s.log.Warn("conntrack scanner: cannot read the maps' entry counts; scanning on the interval only", "err", err)
		}
		s.countsFailed = true
		return nil
	}
	s.countsFailed = false
	return counts
}

// pastPressure tells whether the kernel's count puts t past PressureFill.
func (s *Scanner) pastPressure(counts map[string]int64, t table) bool {
	n, ok := counts[t.name()]
	return ok && float64(n) > s.opts.PressureFill*float64(t.capacity())
}

// expectsPressure tells whether table i has passed PressureFill since the
// last scan, were entries added as fast as between the last two: the scan
// then evicts as under pressure at once, rather than a scan later, by which
// time a fast rate has filled the map.
func (s *Scanner) expectsPressure(i int, t table, now time.Duration) bool {
	if s.lastScan == 0 || s.growth[i] == 0 {
		return false
	}
	expected := float64(s.left[i]) + s.growth[i]*(now-s.lastScan).Seconds()
	return expected > s.opts.PressureFill*float64(t.capacity())
}

// evictionChoice is what a scan under pressure does with a flow.
type evictionChoice int

const (
	keepFlow      evictionChoice = iota
	evictFlow                    // both entries
	evictForward                 // the forward entry: the reverse one guards the server's TIME_WAIT
	evictPastMark                // both entries, oldest first, while the map stays past the low-water mark
)

// eviction tells what goes first when the map is under pressure: flows
// never answered past UnansweredGrace, and flows ended and idle past
// EndedGrace, whole; but of a flow whose server closed first only the
// forward entry, so that its reverse entry goes on guarding the tuple the
// server holds in TIME_WAIT (evictTowardMark drops those only past the
// low-water mark). A client reopening that tuple finds its own guard and
// takes it back (bpf/include/ct_new.h, own_tuple). An answered datagram
// flow idle past EndedGrace goes only while the map stays past the
// low-water mark, least recently used first (evictTowardMark).
func (s *Scanner) eviction(p *Pair, now time.Duration) evictionChoice {
	if !p.Assured() {
		if now-p.Created() > s.opts.UnansweredGrace {
			return evictFlow
		}
		return keepFlow
	}
	if p.proto() != protoTCP && p.proto() != protoSCTP && now-p.LastSeen() > s.opts.EndedGrace {
		return evictPastMark
	}
	if !p.Ended() || now-p.LastSeen() <= s.opts.EndedGrace {
		return keepFlow
	}
	if p.State() == StateServerTimeWait {
		return evictForward
	}
	return evictFlow
}

// lookupOwnReverse reads the forward entry's reverse entry into the pair,
// if it is still the flow's own. A client reusing its port toward another
// Service with the same backend makes the same reverse key, and the datapath
// hands it to the new flow: it must neither keep the old flow alive nor be
// deleted with it.
func lookupOwnReverse(t table, p *Pair) error {
	ok, err := t.lookup(p.RevKey, &p.Rev)
	p.HasRev = ok && p.Rev.Peer == p.FwdKey
	if !p.HasRev {
		p.Rev = Entry{}
	}
	return err
}

// needsReverse tells whether judging a flow needs its reverse entry. The
// built-in scanners do not when the forward entry alone proves the flow alive
// (StaleNAT reads only the forward entry); any other scanner gets both.
func (s *Scanner) needsReverse(p *Pair, now time.Duration) bool {
	for _, sc := range s.opts.Scanners {
		switch sc := sc.(type) {
		case *Liveness:
			if !sc.Timeouts.aliveByForward(&p.FwdKey, &p.Fwd, now) {
				return true
			}
		case *StaleNAT:
		default:
			return true
		}
	}
	return false
}

// looksExpired: a reverse entry alone, judged by the liveness scanners.
func (s *Scanner) looksExpired(p *Pair, now time.Duration) bool {
	for _, sc := range s.opts.Scanners {
		if l, ok := sc.(*Liveness); ok && l.Check(p, now) != "" {
			return true
		}
	}
	return false
}

func (s *Scanner) judge(p *Pair, now time.Duration) Reason {
	for _, sc := range s.opts.Scanners {
		if r := sc.Check(p, now); r != "" {
			return r
		}
	}
	return ""
}

// delete queues k; an empty reason marks the second entry of a pair (counted once).
func (s *Scanner) delete(k Key, reason Reason) {
	s.toDelete = append(s.toDelete, k)
	s.reasons = append(s.reasons, reason)
}

// deleteChunk bounds one batch delete.
const deleteChunk = 4096

// applyDeletions deletes the queued keys from t in batches; a key already
// gone (queued twice, or removed meanwhile) counts as deleted.
func (s *Scanner) applyDeletions(t table, st *ScanStats) error {
	for _, r := range s.reasons {
		if r != "" {
			st.Deleted[r]++
		}
	}
	keys := s.toDelete
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), deleteChunk)]
		n, err := t.batchDelete(chunk)
		if errors.Is(err, maps.ErrKeyNotExist) {
			n++ // skip the missing key and go on
		} else if err != nil {
			return fmt.Errorf("conntrack scan: delete: %w", err)
		}
		keys = keys[n:]
	}
	return nil
}

// Run scans until ctx ends, adapting the interval to how much each scan
// deletes, and at once when Options.Entries shows a map past PressureFill.
// Scan errors are logged, not fatal.
func (s *Scanner) Run(ctx context.Context) {
	interval := s.opts.Interval
	timer := time.NewTimer(interval)
	defer timer.Stop()
	var poll <-chan time.Time
	if s.opts.Entries != nil {
		t := time.NewTicker(s.opts.MinInterval)
		defer t.Stop()
		poll = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-poll:
			if !s.anyPastPressure() {
				continue
			}
		}
		st, err := s.Scan()
		if err != nil {
			s.log.Error("conntrack scan failed", "err", err)
		} else {
			interval = s.NextInterval(interval, st)
		}
		timer.Reset(interval)
	}
}

// anyPastPressure: some map is past PressureFill by the kernel's count.
func (s *Scanner) anyPastPressure() bool {
	counts := s.counts()
	for _, t := range s.tables {
		if s.pastPressure(counts, t) {
			return true
		}
	}
	return false
}

// NextInterval is the adaptive rule: MinInterval while the map stays under
// pressure after the scan's deletions (see Options.PressureFill); otherwise
// halve while more than 25% of the entries were deleted, double while fewer
// than 5% were, within [MinInterval, MaxInterval]; and never later than half
// the TimeToPressure, so that a rising connection rate meets a scan before
// it meets a full map. A scan that evicted the map back under the mark need
// not be followed within MinInterval: with Options.Entries, Run scans as
// soon as the kernel's count passes the mark again, and a walk of a full
// table each second would take the CPU the flows need.
func (s *Scanner) NextInterval(cur time.Duration, st ScanStats) time.Duration {
	if st.LeftRatio > s.opts.PressureFill {
		return s.opts.MinInterval // still under pressure
	}
	next := cur
	if st.Entries == 0 {
		next = min(cur*2, s.opts.MaxInterval)
	} else {
		ratio := float64(st.DeletedTotal()) / float64(st.Entries)
		switch {
		case ratio > 0.25:
			next = max(cur/2, s.opts.MinInterval)
		case ratio < 0.05:
			next = min(cur*2, s.opts.MaxInterval)
		}
	}
	if st.TimeToPressure > 0 {
		next = max(min(next, st.TimeToPressure/2), s.opts.MinInterval)
	}
	return next
}

// Backend is a backend that left a service (from the NAT syncer's report).
type Backend struct {
	ServiceID uint32
	Addr      netip.AddrPort
}

// FlushBackends deletes the UDP flows balanced to the given backends of the
// given services, both entries of each, so a client with a fixed source port
// reaches a live backend with its next datagram (kube-proxy's stale UDP rule).
// TCP flows are left to end on their own.
func (s *Scanner) FlushBackends(backends []Backend) (int, error) {
	if len(backends) == 0 {
		return 0, nil
	}
	gone := make(map[Backend]bool, len(backends))
	for _, b := range backends {
		gone[b] = true
	}
	return s.Flush(func(k Key, v Entry) bool {
		return k.Proto == protoUDP && gone[Backend{ServiceID: v.SvcId, Addr: addrPort(v.NatAddr, v.NatPort)}]
	})
}

// Flush deletes every flow, of either family, whose forward entry match
// accepts: the forward entry, and the reverse entry when it is the flow's
// own (a reverse entry another flow took over after a port reuse stays). It
// returns how many flows it deleted.
func (s *Scanner) Flush(match func(k Key, v Entry) bool) (int, error) {
	flushed := 0
	for _, t := range s.tables {
		s.toDelete, s.reasons = s.toDelete[:0], s.reasons[:0]
		var walkErr error
		err := t.iterate(func(k Key, v Entry) bool {
			if v.Type != gen.SluiceCtTypeCT_FORWARD || !match(k, v) {
				return true
			}
			s.delete(k, ReasonFlushed)
			s.pair = Pair{FwdKey: k, Fwd: v, HasFwd: true, RevKey: v.Peer}
			if walkErr = lookupOwnReverse(t, &s.pair); walkErr != nil {
				return false
			}
			if s.pair.HasRev {
				s.delete(v.Peer, "")
			}
			return true
		})
		if err == nil {
			err = walkErr
		}
		if err != nil {
			return flushed, fmt.Errorf("conntrack flush: %s: %w", t.name(), err)
		}
		st := ScanStats{Deleted: map[Reason]int{}}
		if err := s.applyDeletions(t, &st); err != nil {
			return flushed, err
		}
		flushed += st.Deleted[ReasonFlushed]
	}
	return flushed, nil
}
