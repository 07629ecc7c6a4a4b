package conntrack_test

import (
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

var (
	nodeIP   = netip.MustParseAddr("10.0.0.1")
	clientAP = netip.MustParseAddrPort("10.1.0.5:41234")
	vipAP    = netip.MustParseAddrPort("10.96.0.10:80")
	dnsAP    = netip.MustParseAddrPort("10.96.0.53:53")
	be1AP    = netip.MustParseAddrPort("10.2.0.7:8080")
	be2AP    = netip.MustParseAddrPort("10.2.0.8:8080")
	udpBE    = netip.MustParseAddrPort("10.2.0.9:5353")
)

// env is the datapath with a web (TCP) and a dns (UDP) service, and a scanner
// whose clock is the kernel's plus an offset the test moves.
type env struct {
	t      *testing.T
	dp     *bpftest.Datapath
	ct     *maps.Map[gen.SluiceCtKey, gen.SluiceCtValue]
	offset atomic.Int64
	sc     *conntrack.Scanner
}

func newEnv(t *testing.T, timeouts conntrack.Timeouts) *env {
	e := &env{t: t, dp: bpftest.NewDatapath(t, nodeIP)}
	e.dp.AddService(bpftest.Service{ID: 1, Front: vipAP, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: be1AP}}})
	e.dp.AddService(bpftest.Service{ID: 2, Front: dnsAP, Proto: bpftest.ProtoUDP, Backends: []bpftest.Backend{{AP: udpBE}}})
	var err error
	if e.ct, err = maps.NewMap[gen.SluiceCtKey, gen.SluiceCtValue](e.dp.Objs.SlCtV2); err != nil {
		t.Fatal(err)
	}
	fe, _ := maps.NewMap[gen.SluiceFeKey, gen.SluiceFeValue](e.dp.Objs.SlFeV1)
	be, _ := maps.NewMap[gen.SluiceBeKey, gen.SluiceBeValue](e.dp.Objs.SlBeV1)
	hip, _ := maps.NewMap[gen.SluiceHostipKey, gen.SluiceHostipValue](e.dp.Objs.SlHostipV1)
	e.sc, err = conntrack.NewScanner(conntrack.Options{
		Conntrack: e.ct,
		Scanners: []conntrack.EntryScanner{
			&conntrack.Liveness{Timeouts: timeouts},
			&conntrack.StaleNAT{Frontends: fe, Backends: be, HostIPs: hip},
		},
		Clock: func() time.Duration { return conntrack.Monotonic() + time.Duration(e.offset.Load()) },
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) advance(d time.Duration) { e.offset.Add(int64(d)) }

func (e *env) scan() conntrack.ScanStats {
	e.t.Helper()
	st, err := e.sc.Scan()
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

func (e *env) tcp(src, dst netip.AddrPort, flags uint8) {
	e.t.Helper()
	e.dp.RunOK(e.dp.Objs.SlFromWl, bpftest.TCPPacket(src, dst, flags))
}

func (e *env) udp(src, dst netip.AddrPort) {
	e.t.Helper()
	e.dp.RunOK(e.dp.Objs.SlFromWl, bpftest.UDPPacket(src, dst, []byte("x")))
}

func (e *env) has(src, dst netip.AddrPort, proto uint8) bool {
	_, ok := e.dp.CT(bpftest.CtKey(src, dst, proto))
	return ok
}

// flow creates one flow per state and returns a function telling whether both
// of its entries are still there (and failing if only one is).
type flowCase struct {
	name    string
	timeout time.Duration
	make    func(e *env, client netip.AddrPort) (fwdDst, revSrc netip.AddrPort, proto uint8)
}

func TestEachTimeoutRule(t *testing.T) {
	def := conntrack.DefaultTimeouts()
	cases := []flowCase{
		{"tcp syn-sent", def.TCPSynSent, func(e *env, c netip.AddrPort) (netip.AddrPort, netip.AddrPort, uint8) {
			e.tcp(c, vipAP, bpftest.SYN)
			return vipAP, be1AP, bpftest.ProtoTCP
		}},
		{"tcp established", def.TCPEstablished, func(e *env, c netip.AddrPort) (netip.AddrPort, netip.AddrPort, uint8) {
			e.tcp(c, vipAP, bpftest.SYN)
			e.tcp(be1AP, c, bpftest.SYN|bpftest.ACK)
			e.tcp(c, vipAP, bpftest.ACK)
			return vipAP, be1AP, bpftest.ProtoTCP
		}},
		{"tcp fins seen", def.TCPFinsSeen, func(e *env, c netip.AddrPort) (netip.AddrPort, netip.AddrPort, uint8) {
			e.tcp(c, vipAP, bpftest.SYN)
			e.tcp(be1AP, c, bpftest.SYN|bpftest.ACK)
			e.tcp(c, vipAP, bpftest.FIN|bpftest.ACK)
			e.tcp(be1AP, c, bpftest.FIN|bpftest.ACK)
			return vipAP, be1AP, bpftest.ProtoTCP
		}},
		{"tcp server closed first", def.TCPServerTimeWait, func(e *env, c netip.AddrPort) (netip.AddrPort, netip.AddrPort, uint8) {
			e.tcp(c, vipAP, bpftest.SYN)
			e.tcp(be1AP, c, bpftest.SYN|bpftest.ACK)
			e.tcp(be1AP, c, bpftest.FIN|bpftest.ACK)
			e.tcp(c, vipAP, bpftest.FIN|bpftest.ACK)
			return vipAP, be1AP, bpftest.ProtoTCP
		}},
		{"untranslated udp", def.UDP, func(e *env, c netip.AddrPort) (netip.AddrPort, netip.AddrPort, uint8) {
			// Tracked for the clash check: no frontend, never stale.
			e.udp(c, udpBE)
			e.dp.RunOK(e.dp.Objs.SlFromWl, bpftest.UDPPacket(udpBE, c, []byte("y")))
			return udpBE, udpBE, bpftest.ProtoUDP
		}},
		{"tcp reset", def.TCPResetSeen, func(e *env, c netip.AddrPort) (netip.AddrPort, netip.AddrPort, uint8) {
			e.tcp(c, vipAP, bpftest.SYN)
			e.tcp(be1AP, c, bpftest.RST|bpftest.ACK)
			return vipAP, be1AP, bpftest.ProtoTCP
		}},
		{"udp", def.UDP, func(e *env, c netip.AddrPort) (netip.AddrPort, netip.AddrPort, uint8) {
			e.udp(c, dnsAP)
			e.dp.RunOK(e.dp.Objs.SlFromWl, bpftest.UDPPacket(udpBE, c, []byte("y")))
			return dnsAP, udpBE, bpftest.ProtoUDP
		}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, def)
			client := netip.AddrPortFrom(clientAP.Addr(), uint16(20000+i))
			fwdDst, revSrc, proto := c.make(e, client)
			both := func() bool {
				f, r := e.has(client, fwdDst, proto), e.has(revSrc, client, proto)
				if f != r {
					t.Fatalf("forward entry present %v, reverse %v: a pair was split", f, r)
				}
				return f
			}
			e.advance(c.timeout - time.Second)
			if st := e.scan(); st.Entries != 2 || !both() {
				t.Fatalf("flow gone %v before its timeout %v", c.timeout-time.Second, c.timeout)
			}
			e.advance(2 * time.Second)
			st := e.scan()
			if both() {
				t.Fatalf("flow kept past its timeout %v", c.timeout)
			}
			if st.Deleted[conntrack.ReasonExpired] != 1 {
				t.Fatalf("deletions %v, want one expired flow", st.Deleted)
			}
		})
	}
}

func TestCreationGraceKeepsYoungFlows(t *testing.T) {
	to := conntrack.DefaultTimeouts()
	to.UDP = time.Second
	e := newEnv(t, to)
	e.udp(clientAP, dnsAP)
	e.advance(5 * time.Second) // idle past the UDP timeout, but younger than the grace
	e.scan()
	if !e.has(clientAP, dnsAP, bpftest.ProtoUDP) {
		t.Fatal("flow younger than the creation grace expired")
	}
	e.advance(6 * time.Second)
	e.scan()
	if e.has(clientAP, dnsAP, bpftest.ProtoUDP) {
		t.Fatal("flow kept after the grace and its timeout")
	}
}

func TestReverseEntryJudgedWithItsForwardEntry(t *testing.T) {
	e := newEnv(t, conntrack.DefaultTimeouts())
	// A one-way UDP flow: the backend never answers, so the reverse entry's own
	// last packet is its creation; the forward entry is busy.
	e.udp(clientAP, dnsAP)
	fwdKey := bpftest.CtKey(clientAP, dnsAP, bpftest.ProtoUDP)
	fwd, _ := e.dp.CT(fwdKey)
	e.advance(100 * time.Second)
	fwd.LastSeen = uint64(conntrack.Monotonic() + time.Duration(e.offset.Load()))
	if err := e.ct.Put(fwdKey, fwd, 0); err != nil {
		t.Fatal(err)
	}
	e.scan()
	if !e.has(clientAP, dnsAP, bpftest.ProtoUDP) || !e.has(udpBE, clientAP, bpftest.ProtoUDP) {
		t.Fatal("live one-way flow lost an entry")
	}

	// An orphan: the forward entry is gone (evicted); its reverse entry goes.
	if err := e.ct.Delete(fwdKey); err != nil {
		t.Fatal(err)
	}
	e.advance(100 * time.Second)
	st := e.scan()
	if e.has(udpBE, clientAP, bpftest.ProtoUDP) || st.Deleted[conntrack.ReasonOrphan] != 1 {
		t.Fatalf("orphan reverse entry kept (deleted %v)", st.Deleted)
	}
}

func TestStaleUDPFlushedTCPKept(t *testing.T) {
	e := newEnv(t, conntrack.DefaultTimeouts())
	e.tcp(clientAP, vipAP, bpftest.SYN)
	e.tcp(be1AP, clientAP, bpftest.SYN|bpftest.ACK)
	e.udp(clientAP, dnsAP)
	other := netip.AddrPortFrom(clientAP.Addr(), 999)
	e.udp(other, dnsAP)

	// On demand: the syncer reports the UDP backend gone.
	n, err := e.sc.FlushBackends([]conntrack.Backend{{ServiceID: 2, Addr: udpBE}, {ServiceID: 1, Addr: be1AP}})
	if err != nil || n != 2 {
		t.Fatalf("flushed %d flows (%v), want the 2 UDP flows", n, err)
	}
	if e.has(clientAP, dnsAP, bpftest.ProtoUDP) || e.has(udpBE, clientAP, bpftest.ProtoUDP) || e.has(other, dnsAP, bpftest.ProtoUDP) {
		t.Fatal("UDP flow to the removed backend kept")
	}
	if !e.has(clientAP, vipAP, bpftest.ProtoTCP) || !e.has(be1AP, clientAP, bpftest.ProtoTCP) {
		t.Fatal("TCP flow flushed: established connections must survive their backend leaving")
	}

	// By scan: the backend is replaced in the maps; the next scan finds the
	// UDP flow stale, keeps the TCP one whose backend also left.
	e.udp(clientAP, dnsAP)
	e.dp.Put(e.dp.Objs.SlBeV1, gen.SluiceBeKey{SvcId: 2}, gen.SluiceBeValue{Addr: gen.NetAddr(be2AP.Addr()), Port: gen.NetPort(5353)})
	e.dp.Put(e.dp.Objs.SlBeV1, gen.SluiceBeKey{SvcId: 1}, gen.SluiceBeValue{Addr: gen.NetAddr(be2AP.Addr()), Port: gen.NetPort(be2AP.Port())})
	st := e.scan()
	if st.Deleted[conntrack.ReasonStaleNAT] != 1 || e.has(clientAP, dnsAP, bpftest.ProtoUDP) {
		t.Fatalf("stale UDP flow not removed by scan (deleted %v)", st.Deleted)
	}
	if !e.has(clientAP, vipAP, bpftest.ProtoTCP) {
		t.Fatal("scan removed a TCP flow whose backend left")
	}
	// The next datagram goes to the new backend.
	out := e.dp.RunOK(e.dp.Objs.SlFromWl, bpftest.UDPPacket(clientAP, dnsAP, []byte("again")))
	if out.Dst.Addr() != be2AP.Addr() {
		t.Fatalf("datagram after the flush went to %v", out.Dst)
	}
}

func TestScanWhileFlowsAreCreatedLosesNothingLive(t *testing.T) {
	e := newEnv(t, conntrack.DefaultTimeouts())
	var stop atomic.Bool
	var created atomic.Int32
	var wg sync.WaitGroup
	defer func() { stop.Store(true); wg.Wait() }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load() && i < 20000; i++ {
			src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 1000)
			if i%2 == 0 {
				e.tcp(src, vipAP, bpftest.SYN)
			} else {
				e.udp(src, dnsAP)
			}
			created.Add(1)
		}
	}()
	scans := 0
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); scans++ {
		if st := e.scan(); st.DeletedTotal() != 0 {
			t.Fatalf("scan deleted live flows: %v", st.Deleted)
		}
	}
	stop.Store(true)
	wg.Wait()
	st := e.scan()
	if want := 2 * int(created.Load()); st.Entries != want {
		t.Fatalf("%d entries after %d scans, want %d (2 per flow created)", st.Entries, scans, want)
	}
	if scans < 5 {
		t.Fatalf("only %d scans ran concurrently", scans)
	}
}

func TestDecodeForPeople(t *testing.T) {
	e := newEnv(t, conntrack.DefaultTimeouts())
	e.tcp(clientAP, vipAP, bpftest.SYN)
	e.tcp(be1AP, clientAP, bpftest.SYN|bpftest.ACK)
	rev, _ := e.dp.CT(bpftest.CtKey(be1AP, clientAP, bpftest.ProtoTCP))
	now := time.Duration(rev.LastSeen) + 3500*time.Millisecond
	flows, err := conntrack.ListFlows(e.ct, nil, now)
	if err != nil || len(flows) != 1 {
		t.Fatalf("flows %v %v", flows, err)
	}
	want := "tcp 10.1.0.5:41234 -> 10.96.0.10:80 (nat 10.2.0.7:8080) established, last seen 3s ago"
	if got := flows[0].String(); got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}

	// The same client port toward the backend directly: a tracked, direct
	// flow whose port was remapped (the Service flow holds the tuple).
	e.tcp(clientAP, be1AP, bpftest.SYN)
	fwd, _ := e.dp.CT(bpftest.CtKey(clientAP, be1AP, bpftest.ProtoTCP))
	flows, err = conntrack.ListFlows(e.ct, nil, time.Duration(fwd.LastSeen))
	if err != nil || len(flows) != 2 {
		t.Fatalf("flows %v %v", flows, err)
	}
	got := flows[0].String() // sorted by frontend: the backend's address first
	wantPrefix := "tcp 10.1.0.5:41234 -> 10.2.0.7:8080 (direct, snat 10.1.0.5:"
	if !strings.HasPrefix(got, wantPrefix) || !strings.HasSuffix(got, ") syn-sent, last seen 0s ago") {
		t.Fatalf("got  %q\nwant %q...", got, wantPrefix)
	}
}

func TestAdaptiveInterval(t *testing.T) {
	sc, err := conntrack.NewScanner(conntrack.Options{Conntrack: &maps.Map[gen.SluiceCtKey, gen.SluiceCtValue]{},
		MinInterval: time.Second, MaxInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	busy := conntrack.ScanStats{Entries: 100, Deleted: map[conntrack.Reason]int{conntrack.ReasonExpired: 40}}
	idle := conntrack.ScanStats{Entries: 100, Deleted: map[conntrack.Reason]int{conntrack.ReasonExpired: 1}}
	steady := conntrack.ScanStats{Entries: 100, Deleted: map[conntrack.Reason]int{conntrack.ReasonExpired: 10}}
	if got := sc.NextInterval(10*time.Second, busy); got != 5*time.Second {
		t.Fatalf("busy: %v", got)
	}
	if got := sc.NextInterval(1500*time.Millisecond, busy); got != time.Second {
		t.Fatalf("busy at the floor: %v", got)
	}
	if got := sc.NextInterval(10*time.Second, idle); got != 20*time.Second {
		t.Fatalf("idle: %v", got)
	}
	if got := sc.NextInterval(50*time.Second, idle); got != time.Minute {
		t.Fatalf("idle at the ceiling: %v", got)
	}
	if got := sc.NextInterval(10*time.Second, steady); got != 10*time.Second {
		t.Fatalf("steady: %v", got)
	}
}

// A reverse entry can come to belong to another flow than the forward entry
// naming it: a client reopening its connection takes its own reverse key
// back, and older layouts took over keys whose forward entry was gone. When
// the old flow expires, the scanner deletes its forward entry only, and does
// not let the other flow's reverse entry keep it alive; deleting that entry
// would leave the live flow's replies without reverse NAT.
func TestExpiredFlowLeavesAReusedReverseEntry(t *testing.T) {
	e := newEnv(t, conntrack.DefaultTimeouts())
	vip2 := netip.MustParseAddrPort("10.96.0.11:80")
	e.tcp(clientAP, vipAP, bpftest.SYN)
	e.tcp(be1AP, clientAP, bpftest.SYN|bpftest.ACK)
	e.tcp(clientAP, vipAP, bpftest.FIN|bpftest.ACK)
	e.tcp(be1AP, clientAP, bpftest.FIN|bpftest.ACK)
	// A flow from the same client port toward another Service with the
	// same backend comes to hold the reverse key.
	oldKey, newKey := bpftest.CtKey(clientAP, vipAP, bpftest.ProtoTCP), bpftest.CtKey(clientAP, vip2, bpftest.ProtoTCP)
	revKey := bpftest.CtKey(be1AP, clientAP, bpftest.ProtoTCP)
	old, _ := e.dp.CT(oldKey)
	rev, _ := e.dp.CT(revKey)
	fwd := old
	fwd.TcpSeen, fwd.SvcId = 0x02, 3
	rev.Peer, rev.TcpSeen, rev.SvcId = newKey, 0x12, 3
	rev.NatAddr, rev.NatPort = gen.NetAddr(vip2.Addr()), gen.NetPort(vip2.Port())
	if err := e.ct.Put(newKey, fwd, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.ct.Put(revKey, rev, 0); err != nil {
		t.Fatal(err)
	}
	if rev, ok := e.dp.CT(revKey); !ok || rev.Peer != newKey {
		t.Fatalf("reverse entry %+v (present %v) should belong to the new flow", rev, ok)
	}
	// An hour later the old flow is long expired; the new one just saw packets.
	e.advance(time.Hour)
	now := uint64(conntrack.Monotonic() + time.Duration(e.offset.Load()))
	for _, k := range []gen.SluiceCtKey{newKey, revKey} {
		v, _ := e.dp.CT(k)
		v.Created, v.LastSeen = now, now
		if err := e.ct.Put(k, v, 0); err != nil {
			t.Fatal(err)
		}
	}
	st := e.scan()
	if e.has(clientAP, vipAP, bpftest.ProtoTCP) || st.Deleted[conntrack.ReasonExpired] != 1 {
		t.Fatalf("old flow kept (deleted %v)", st.Deleted)
	}
	if rev, ok := e.dp.CT(revKey); !ok || rev.Peer != newKey {
		t.Fatalf("the live flow lost its reverse entry: %+v present %v", rev, ok)
	}
	e.dp.RunOK(e.dp.Objs.SlFromWl, bpftest.TCPPacket(be1AP, clientAP, bpftest.SYN|bpftest.ACK))
}

// A flow this node balanced by DSR (bpf/include/dsr.h) shows only its
// client's packets here: the client's ACK establishes it, its FIN or RST
// ends it. Judged as a flow that sees both directions, an established DSR
// flow would expire after the SYN timeout, cutting a live connection.
func TestDSRFlowsAreJudgedByTheClientsSide(t *testing.T) {
	def := conntrack.DefaultTimeouts()
	front := netip.AddrPortFrom(nodeIP, 30090)
	remote := netip.MustParseAddrPort("10.3.0.4:8080")
	ext := netip.MustParseAddr("198.51.100.9")
	for i, c := range []struct {
		name    string
		flags   []uint8
		state   conntrack.State
		timeout time.Duration
	}{
		{"syn-sent", []uint8{bpftest.SYN}, conntrack.StateSynSent, def.TCPSynSent},
		{"established", []uint8{bpftest.SYN, bpftest.ACK}, conntrack.StateEstablished, def.TCPEstablished},
		{"client fin", []uint8{bpftest.SYN, bpftest.ACK, bpftest.FIN | bpftest.ACK}, conntrack.StateFinsSeen, def.TCPFinsSeen},
		{"client reset", []uint8{bpftest.SYN, bpftest.ACK, bpftest.RST}, conntrack.StateReset, def.TCPResetSeen},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, def)
			e.dp.Put(e.dp.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP), Flags: gen.SluiceConfigFlagsCFG_DSR_TCP})
			e.dp.AddService(bpftest.Service{ID: 3, Front: front, Proto: bpftest.ProtoTCP,
				Backends: []bpftest.Backend{{AP: remote}}, Flags: gen.SluiceFeFlagsFE_EXTERNAL})
			client := netip.AddrPortFrom(ext, uint16(30000+i))
			for _, f := range c.flags {
				e.dp.RunOK(e.dp.Objs.SlFromHost, bpftest.TCPPacket(client, front, f))
			}
			flows, err := conntrack.ListFlows(e.ct, nil, conntrack.Monotonic())
			if err != nil || len(flows) != 1 {
				t.Fatalf("flows %v (%v), want one", flows, err)
			}
			if f := flows[0]; f.DSR != conntrack.DSRSent || f.State != c.state || f.SNAT.IsValid() {
				t.Fatalf("flow %v, want state %s, dsr sent, no SNAT", f, c.state)
			}
			e.advance(c.timeout - time.Second)
			if e.scan(); !e.has(client, front, bpftest.ProtoTCP) {
				t.Fatalf("flow gone before its timeout %v", c.timeout)
			}
			e.advance(2 * time.Second)
			if st := e.scan(); e.has(client, front, bpftest.ProtoTCP) || e.has(remote, client, bpftest.ProtoTCP) ||
				st.Deleted[conntrack.ReasonExpired] != 1 {
				t.Fatalf("flow kept past its timeout %v (deletions %v)", c.timeout, st.Deleted)
			}
		})
	}
}

// A flow whose server closed first, and whose client then reopened its
// tuple toward another backend, leaves its reverse entry alone as the guard
// of the server's TIME_WAIT (bpf/include/ct_new.h): the scanner keeps it for
// TCPServerTimeWait and then removes it, as it would the whole flow.
func TestReverseEntryLeftByAReopenedTupleLastsTheServersTimeWait(t *testing.T) {
	to := conntrack.DefaultTimeouts()
	e := newEnv(t, to)
	e.tcp(clientAP, vipAP, bpftest.SYN)
	e.tcp(be1AP, clientAP, bpftest.SYN|bpftest.ACK)
	e.tcp(clientAP, vipAP, bpftest.ACK)
	e.tcp(be1AP, clientAP, bpftest.FIN|bpftest.ACK) // the server first
	e.tcp(clientAP, vipAP, bpftest.FIN|bpftest.ACK)
	// The client reopens its tuple; the Service now has another backend.
	be2 := netip.AddrPortFrom(netip.MustParseAddr("10.2.0.9"), 8080)
	e.dp.AddService(bpftest.Service{ID: 1, Front: vipAP, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: be2}}})
	e.tcp(clientAP, vipAP, bpftest.SYN)
	if !e.has(be1AP, clientAP, bpftest.ProtoTCP) {
		t.Fatal("the ended flow's reverse entry is gone: nothing guards the server's TIME_WAIT")
	}
	e.advance(to.TCPServerTimeWait - 10*time.Second)
	e.scan()
	if !e.has(be1AP, clientAP, bpftest.ProtoTCP) {
		t.Fatalf("guard removed before the server's TIME_WAIT (%v) ended", to.TCPServerTimeWait)
	}
	e.advance(20 * time.Second)
	st := e.scan()
	if e.has(be1AP, clientAP, bpftest.ProtoTCP) {
		t.Fatalf("guard kept past the server's TIME_WAIT (deleted %v)", st.Deleted)
	}
}

// SCTP associations expire by the state their chunks tell (netfilter's
// timeouts); an established association outlives its backend's removal
// from the Service, as a TCP connection does, until it ends.
func TestSCTPTimeoutsByAssociationState(t *testing.T) {
	def := conntrack.DefaultTimeouts()
	def.CreationGrace = time.Second // below SCTP's shortest timeouts
	sctpVIP := netip.MustParseAddrPort("10.96.0.38:3868")
	sctpBE := netip.MustParseAddrPort("10.2.0.9:3869")
	cases := []struct {
		name    string
		timeout time.Duration
		chunks  func(c netip.AddrPort) [][2]any // {from, chunk}
	}{
		{"opening", def.SCTPOpening, func(c netip.AddrPort) [][2]any {
			return [][2]any{{c, bpftest.SCTPInit}}
		}},
		{"established", def.SCTPEstablished, func(c netip.AddrPort) [][2]any {
			return [][2]any{{c, bpftest.SCTPInit}, {sctpBE, bpftest.SCTPInitAck}, {c, bpftest.SCTPCookieEcho}, {sctpBE, bpftest.SCTPCookieAck}}
		}},
		{"closing", def.SCTPClosing, func(c netip.AddrPort) [][2]any {
			return [][2]any{{c, bpftest.SCTPInit}, {sctpBE, bpftest.SCTPInitAck}, {c, bpftest.SCTPShutdown}}
		}},
		{"closed", def.SCTPClosed, func(c netip.AddrPort) [][2]any {
			return [][2]any{{c, bpftest.SCTPInit}, {sctpBE, bpftest.SCTPInitAck}, {sctpBE, bpftest.SCTPAbort}}
		}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, def)
			e.dp.AddService(bpftest.Service{ID: 3, Front: sctpVIP, Proto: bpftest.ProtoSCTP, Backends: []bpftest.Backend{{AP: sctpBE}}})
			client := netip.AddrPortFrom(clientAP.Addr(), uint16(21000+i))
			for _, step := range c.chunks(client) {
				from, chunk := step[0].(netip.AddrPort), uint8(step[1].(int))
				to := sctpVIP
				if from == sctpBE {
					to = client
				}
				e.dp.RunOK(e.dp.Objs.SlFromWl, bpftest.SCTPPacket(from, to, chunk, make([]byte, 8)))
			}
			if c.name == "established" {
				// The backend leaves the Service: the association stays.
				if err := e.dp.Objs.SlFeV1.Delete(bpftest.FeKey(sctpVIP, bpftest.ProtoSCTP)); err != nil {
					t.Fatal(err)
				}
			}
			e.advance(c.timeout - 500*time.Millisecond)
			if e.scan(); !e.has(client, sctpVIP, bpftest.ProtoSCTP) || !e.has(sctpBE, client, bpftest.ProtoSCTP) {
				t.Fatalf("association gone before its %s timeout %v", c.name, c.timeout)
			}
			e.advance(time.Second)
			st := e.scan()
			if e.has(client, sctpVIP, bpftest.ProtoSCTP) || e.has(sctpBE, client, bpftest.ProtoSCTP) {
				t.Fatalf("association kept past its %s timeout %v", c.name, c.timeout)
			}
			if st.Deleted[conntrack.ReasonExpired] != 1 {
				t.Fatalf("deletions %v, want one expired flow", st.Deleted)
			}
		})
	}
}
