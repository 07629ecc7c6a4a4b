package gen_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// The clash rules: a new flow whose tuple at the destination is held by
// another flow (Service or direct, TCP or UDP) keeps the client's address and
// gets another source port, unless the holder ended in a way that frees the
// tuple (a reset, or the client closed first). Every case runs through the
// real programs; replies of a remapped flow must reach the client's own port.

// clashSetup programs a ClusterIP whose only backend is be1AP.
func clashSetup(t *testing.T) *bpftest.Datapath {
	t.Helper()
	d := newDP(t)
	d.AddService(webService())
	d.AddService(bpftest.Service{ID: 2, Front: vipAP, Proto: protoUDP, Backends: []bpftest.Backend{{AP: be1AP}}})
	return d
}

// serviceFlow opens a TCP flow client -> VIP and returns the tuple the
// backend saw.
func serviceFlow(t *testing.T, d *bpftest.Datapath) netip.AddrPort {
	t.Helper()
	out := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.SYN))
	wantAP(t, "service SYN destination", out.Dst, be1AP)
	d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(be1AP, out.Src, bpftest.SYN|bpftest.ACK))
	d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.ACK))
	return out.Src
}

// directSYN sends client -> be1 directly and returns the source the backend sees.
func directSYN(t *testing.T, d *bpftest.Datapath) netip.AddrPort {
	t.Helper()
	out := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, be1AP, bpftest.SYN))
	wantAP(t, "direct SYN destination", out.Dst, be1AP)
	if out.Src.Addr() != clientAP.Addr() {
		t.Fatalf("direct flow left with address %v: only its port may change", out.Src)
	}
	return out.Src
}

// wantReplyRestored checks that the backend's reply to seen reaches the
// client's own port from from.
func wantReplyRestored(t *testing.T, d *bpftest.Datapath, seen, from netip.AddrPort) {
	t.Helper()
	r := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(be1AP, seen, bpftest.SYN|bpftest.ACK))
	wantAP(t, "reply source", r.Src, from)
	wantAP(t, "reply destination", r.Dst, clientAP)
}

func TestClashLiveServiceFlowThenDirectFlowIsRemapped(t *testing.T) {
	d := clashSetup(t)
	if seen := serviceFlow(t, d); seen != clientAP {
		t.Fatalf("service flow remapped to %v with nothing to clash with", seen)
	}
	seen := directSYN(t, d)
	if seen.Port() == clientAP.Port() {
		t.Fatal("direct flow kept the port a live Service flow holds at the backend")
	}
	wantReplyRestored(t, d, seen, be1AP)
	// The Service flow's replies are still its own.
	wantReplyRestored(t, d, clientAP, vipAP)
	// The direct flow's next segment keeps its new port.
	again := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, be1AP, bpftest.ACK))
	wantAP(t, "direct flow's next segment", again.Src, seen)
	if d.Counter(gen.SluiceCounterCNT_TUPLE_REMAPPED) != 1 {
		t.Fatalf("remaps counted %d, want 1", d.Counter(gen.SluiceCounterCNT_TUPLE_REMAPPED))
	}
}

func TestClashLiveDirectFlowThenServiceFlowIsRemapped(t *testing.T) {
	d := clashSetup(t)
	if seen := directSYN(t, d); seen != clientAP {
		t.Fatalf("direct flow remapped to %v with nothing to clash with", seen)
	}
	out := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.SYN))
	if out.Src.Addr() != clientAP.Addr() || out.Src.Port() == clientAP.Port() {
		t.Fatalf("service flow left as %v: want the client's address with another port", out.Src)
	}
	wantReplyRestored(t, d, out.Src, vipAP)
	wantReplyRestored(t, d, clientAP, be1AP)
}

// closeFlow exchanges FINs on the service flow (client first or server first)
// and the last ACK.
func closeFlow(t *testing.T, d *bpftest.Datapath, serverFirst bool) {
	t.Helper()
	clientFIN := func() { d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.FIN|bpftest.ACK)) }
	serverFIN := func() { d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(be1AP, clientAP, bpftest.FIN|bpftest.ACK)) }
	if serverFirst {
		serverFIN()
		clientFIN()
	} else {
		clientFIN()
		serverFIN()
	}
}

// An ended flow holds its tuple until the conntrack scanner removes it (for
// TIME_WAIT's 120 s when the server closed first): a new flow on it is
// remapped, never given the tuple, so two CPUs starting clashing flows at
// once cannot both take it. The first FIN's side is recorded for the
// scanner.
func TestClashEndedFlowHoldsItsTupleUntilRemoved(t *testing.T) {
	ends := map[string]func(d *bpftest.Datapath){
		"server closed first": func(d *bpftest.Datapath) { closeFlow(t, d, true) },
		"client closed first": func(d *bpftest.Datapath) { closeFlow(t, d, false) },
		"client reset": func(d *bpftest.Datapath) {
			d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.RST))
		},
		"server reset": func(d *bpftest.Datapath) {
			d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(be1AP, clientAP, bpftest.RST))
		},
	}
	for name, end := range ends {
		t.Run(name, func(t *testing.T) {
			d := clashSetup(t)
			serviceFlow(t, d)
			end(d)
			if seen := directSYN(t, d); seen.Port() == clientAP.Port() {
				t.Fatal("direct flow took the tuple of an ended flow still in conntrack")
			}
			// Once the scanner has removed the ended flow, the tuple is free.
			for _, k := range []gen.SluiceCtKey{bpftest.CtKey(clientAP, vipAP, protoTCP), bpftest.CtKey(be1AP, clientAP, protoTCP),
				bpftest.CtKey(clientAP, be1AP, protoTCP)} {
				if err := d.Objs.SlCtV2.Delete(k); err != nil {
					t.Fatal(err)
				}
			}
			if seen := directSYN(t, d); seen != clientAP {
				t.Fatalf("direct flow remapped to %v after the ended flow was removed", seen)
			}
		})
	}
	d := clashSetup(t)
	serviceFlow(t, d)
	closeFlow(t, d, true)
	fwd, _ := d.CT(bpftest.CtKey(clientAP, vipAP, protoTCP))
	rev, _ := d.CT(bpftest.CtKey(be1AP, clientAP, protoTCP))
	if rev.TcpSeen&uint32(gen.SluiceCtSeenCT_SEEN_FIN_FIRST) == 0 || fwd.TcpSeen&uint32(gen.SluiceCtSeenCT_SEEN_FIN_FIRST) != 0 {
		t.Fatalf("first FIN not recorded on the server's side: fwd %#x rev %#x", fwd.TcpSeen, rev.TcpSeen)
	}
}

func TestClashUDPServiceFlowThenDirectFlow(t *testing.T) {
	d := clashSetup(t)
	q := d.RunOK(d.Objs.SlFromWl, bpftest.UDPPacket(clientAP, vipAP, []byte("via service")))
	wantAP(t, "service datagram", q.Dst, be1AP)
	direct := d.RunOK(d.Objs.SlFromWl, bpftest.UDPPacket(clientAP, be1AP, []byte("direct")))
	if direct.Src.Addr() != clientAP.Addr() || direct.Src.Port() == clientAP.Port() {
		t.Fatalf("direct datagram left as %v while a Service flow holds the tuple", direct.Src)
	}
	r := d.RunOK(d.Objs.SlFromWl, bpftest.UDPPacket(be1AP, direct.Src, []byte("answer")))
	wantAP(t, "direct reply source", r.Src, be1AP)
	wantAP(t, "direct reply destination", r.Dst, clientAP)
	r = d.RunOK(d.Objs.SlFromWl, bpftest.UDPPacket(be1AP, clientAP, []byte("answer")))
	wantAP(t, "service reply source", r.Src, vipAP)
}

// A flow that enters a workload without having left one (the node itself, or
// an interface Sluice does not manage) is tracked at the workload's egress
// and remapped there, exactly as at the other hooks.
func TestClashDetectedEnteringAWorkload(t *testing.T) {
	d := clashSetup(t)
	serviceFlow(t, d)
	out := d.RunOK(d.Objs.SlToWl, bpftest.TCPPacket(clientAP, be1AP, bpftest.SYN))
	if out.Src.Addr() != clientAP.Addr() || out.Src.Port() == clientAP.Port() {
		t.Fatalf("flow entering the backend left as %v while a Service flow holds the tuple", out.Src)
	}
	r := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(be1AP, out.Src, bpftest.SYN|bpftest.ACK))
	wantAP(t, "reply destination", r.Dst, clientAP)
}

// A SYN on the tuple of a flow that ended is a new connection: it is
// balanced again (to a live backend) instead of following the old flow.
func TestSYNOnAnEndedFlowIsBalancedAgain(t *testing.T) {
	d := clashSetup(t)
	serviceFlow(t, d)
	closeFlow(t, d, false)
	// The backend leaves; another takes its place.
	d.AddService(bpftest.Service{ID: 1, Front: vipAP, Proto: protoTCP, Backends: []bpftest.Backend{{AP: be2AP}}})
	out := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.SYN))
	wantAP(t, "reopened flow's destination", out.Dst, be2AP)
	if d.Counter(gen.SluiceCounterCNT_TUPLE_REUSED) != 1 {
		t.Fatalf("reuse counted %d times, want 1", d.Counter(gen.SluiceCounterCNT_TUPLE_REUSED))
	}
	// A retransmitted SYN of the new flow follows it.
	again := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.SYN))
	wantAP(t, "retransmitted SYN", again.Dst, be2AP)
	r := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(be2AP, clientAP, bpftest.SYN|bpftest.ACK))
	wantAP(t, "new flow's reply source", r.Src, vipAP)
}

// A flow whose first packet reached a service IP before the Service was
// programmed (an agent starting, a Service just created) is tracked
// untranslated; once the frontend exists, the client's next SYN from the
// same port, or its next datagram, is balanced instead of following the old
// entry to the bare service IP.
func TestFlowTrackedBeforeItsServiceExistedIsBalancedOnceItDoes(t *testing.T) {
	d := newDP(t)
	early := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.SYN))
	wantAP(t, "SYN before the Service exists", early.Dst, vipAP)
	q := d.RunOK(d.Objs.SlFromWl, bpftest.UDPPacket(clientAP, vipAP, []byte("early")))
	wantAP(t, "datagram before the Service exists", q.Dst, vipAP)

	d.AddService(webService())
	d.AddService(bpftest.Service{ID: 2, Front: vipAP, Proto: protoUDP, Backends: []bpftest.Backend{{AP: be1AP}}})
	// The client's connect timed out; it tries again from the same port.
	again := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.SYN))
	wantAP(t, "SYN after the Service was programmed", again.Dst, be1AP)
	r := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(be1AP, clientAP, bpftest.SYN|bpftest.ACK))
	wantAP(t, "reply source", r.Src, vipAP)

	// A UDP client with a fixed port is balanced at the entry's next refresh.
	key := bpftest.CtKey(clientAP, vipAP, protoUDP)
	v, ok := d.CT(key)
	if !ok || v.SvcId != 0 {
		t.Fatalf("untranslated UDP entry %+v (present %v)", v, ok)
	}
	v.LastSeen -= uint64(time.Second)
	d.Put(d.Objs.SlCtV2, key, v)
	q = d.RunOK(d.Objs.SlFromWl, bpftest.UDPPacket(clientAP, vipAP, []byte("later")))
	wantAP(t, "datagram after the Service was programmed", q.Dst, be1AP)
	if n := d.Counter(gen.SluiceCounterCNT_FLOW_NOW_SERVICE); n != 2 {
		t.Fatalf("counted %d flows balanced anew, want 2", n)
	}
}

// A flood of new flows fills the conntrack map: new flows are refused and
// counted, and an established flow is never evicted to make room for them
// (an LRU map did that: an idle keep-alive connection died under a UDP
// flood to a ClusterIP).
func TestFullConntrackRefusesNewFlowsNeverEvictsEstablished(t *testing.T) {
	spec, err := gen.Spec()
	if err != nil {
		t.Fatal(err)
	}
	ctSpec := spec.Maps[gen.SluiceMapSlCtV2].Copy()
	ctSpec.MaxEntries = 64
	ct, err := ebpf.NewMap(ctSpec)
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	objs, err := gen.Load(gen.LoadOptions{Maps: map[string]*ebpf.Map{gen.SluiceMapSlCtV2: ct}})
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	d := &bpftest.Datapath{TB: t, Objs: objs}
	d.AddService(webService())
	d.AddService(bpftest.Service{ID: 2, Front: netip.MustParseAddrPort("10.96.0.53:53"), Proto: protoUDP, Backends: []bpftest.Backend{{AP: be1AP}}})

	// An established keep-alive connection.
	d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.SYN))
	d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(be1AP, clientAP, bpftest.SYN|bpftest.ACK))
	// The flood: UDP flows from ever new ports until the map is full, and on.
	refused := 0
	for port := range uint16(200) {
		src := netip.AddrPortFrom(netip.MustParseAddr("10.1.7.7"), 20000+port)
		ret, _ := d.Run(d.Objs.SlFromWl, bpftest.UDPPacket(src, netip.MustParseAddrPort("10.96.0.53:53"), []byte("q")))
		if ret == actShot {
			refused++
		}
	}
	if refused == 0 || d.Counter(gen.SluiceCounterCNT_DROP_CT_FULL) != uint64(refused) {
		t.Fatalf("%d new flows refused, %d counted as conntrack-full", refused, d.Counter(gen.SluiceCounterCNT_DROP_CT_FULL))
	}
	if d.CTCount() > 64 {
		t.Fatalf("%d entries in a map of 64", d.CTCount())
	}
	// The connection goes on, both ways.
	out := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.ACK))
	wantAP(t, "established flow after the flood", out.Dst, be1AP)
	r := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(be1AP, clientAP, bpftest.ACK))
	wantAP(t, "its reply", r.Src, vipAP)
}
