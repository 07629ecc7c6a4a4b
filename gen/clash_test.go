package gen_test

import (
	"net/netip"
	"testing"
	"time"

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

func TestClashServerClosedFirstHoldsTheTupleForTimeWait(t *testing.T) {
	d := clashSetup(t)
	serviceFlow(t, d)
	closeFlow(t, d, true)
	fwd, _ := d.CT(bpftest.CtKey(clientAP, vipAP, protoTCP))
	rev, _ := d.CT(bpftest.CtKey(be1AP, clientAP, protoTCP))
	if rev.TcpSeen&uint32(gen.SluiceCtSeenCT_SEEN_FIN_FIRST) == 0 || fwd.TcpSeen&uint32(gen.SluiceCtSeenCT_SEEN_FIN_FIRST) != 0 {
		t.Fatalf("first FIN not recorded on the server's side: fwd %#x rev %#x", fwd.TcpSeen, rev.TcpSeen)
	}
	// The backend holds (backend, client:port) in TIME_WAIT: a direct SYN on it
	// (another timestamp offset) would meet PAWS, so it is remapped.
	if seen := directSYN(t, d); seen.Port() == clientAP.Port() {
		t.Fatal("direct flow took the tuple the server holds in TIME_WAIT")
	}

	// Once TIME_WAIT is over (2 MSL after the last packet) the tuple is free.
	d2 := clashSetup(t)
	serviceFlow(t, d2)
	closeFlow(t, d2, true)
	ageFlow(t, d2, bpftest.CtKey(clientAP, vipAP, protoTCP), 121*time.Second)
	if seen := directSYN(t, d2); seen != clientAP {
		t.Fatalf("direct flow remapped to %v after the server's TIME_WAIT ended", seen)
	}
}

func TestClashClientClosedFirstFreesTheTuple(t *testing.T) {
	d := clashSetup(t)
	serviceFlow(t, d)
	closeFlow(t, d, false)
	if seen := directSYN(t, d); seen != clientAP {
		t.Fatalf("direct flow remapped to %v: the client closed first and holds TIME_WAIT itself", seen)
	}
	wantReplyRestored(t, d, clientAP, be1AP)
}

func TestClashResetFreesTheTuple(t *testing.T) {
	for _, who := range []string{"client", "server"} {
		t.Run(who, func(t *testing.T) {
			d := clashSetup(t)
			serviceFlow(t, d)
			if who == "client" {
				d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.RST))
			} else {
				d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(be1AP, clientAP, bpftest.RST))
			}
			if seen := directSYN(t, d); seen != clientAP {
				t.Fatalf("direct flow remapped to %v after a reset", seen)
			}
		})
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

// ageFlow moves both entries of a flow back in time by d.
func ageFlow(t *testing.T, dp *bpftest.Datapath, fwdKey gen.SluiceCtKey, by time.Duration) {
	t.Helper()
	fwd, ok := dp.CT(fwdKey)
	if !ok {
		t.Fatal("no forward entry to age")
	}
	for _, k := range []gen.SluiceCtKey{fwdKey, fwd.Peer} {
		v, ok := dp.CT(k)
		if !ok {
			t.Fatal("no entry to age")
		}
		v.Created -= uint64(by)
		v.LastSeen -= uint64(by)
		dp.Put(dp.Objs.SlCtV1, k, v)
	}
}
