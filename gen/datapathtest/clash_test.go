package datapathtest_test

import (
	"errors"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"golang.org/x/sys/unix"
)

// The clash rules: a new flow whose tuple at the destination is held by
// another flow (Service or direct, TCP or UDP) keeps the client's address and
// gets another source port, unless the holder ended in a way that frees the
// tuple (a reset, or the client closed first). Every case runs through the
// real programs, once per family; replies of a remapped flow must reach the
// client's own port.

// clashCase is one family's addresses and datapath for the clash tests.
type clashCase struct {
	t                     *testing.T
	d                     *bpftest.Datapath
	client, vip, be1, be2 netip.AddrPort
}

// forEachFamily runs test on an IPv4 and an IPv6 datapath, each with a TCP
// and a UDP ClusterIP (ids 1 and 2) whose only backend is be1.
func forEachFamily(t *testing.T, test func(c *clashCase)) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			d := f.newDP(t)
			d.AddService(bpftest.Service{ID: 1, Front: f.vip, Proto: protoTCP, Backends: []bpftest.Backend{{AP: f.be1}}})
			d.AddService(bpftest.Service{ID: 2, Front: f.vip, Proto: protoUDP, Backends: []bpftest.Backend{{AP: f.be1}}})
			test(&clashCase{t: t, d: d, client: f.client, vip: f.vip, be1: f.be1, be2: f.be2})
		})
	}
}

// tcp runs a TCP segment from src to dst through the workload-egress
// program and returns what left.
func (c *clashCase) tcp(src, dst netip.AddrPort, flags uint8) *bpftest.Decoded {
	c.t.Helper()
	return c.d.RunOK(c.d.Objs.SlFromWl, bpftest.TCPPacket(src, dst, flags))
}

// serviceFlow opens a TCP flow client -> VIP and returns the tuple the
// backend saw.
func (c *clashCase) serviceFlow() netip.AddrPort {
	c.t.Helper()
	out := c.tcp(c.client, c.vip, bpftest.SYN)
	wantAP(c.t, "service SYN destination", out.Dst, c.be1)
	c.tcp(c.be1, out.Src, bpftest.SYN|bpftest.ACK)
	c.tcp(c.client, c.vip, bpftest.ACK)
	return out.Src
}

// directSYN sends client -> be1 directly and returns the source the backend sees.
func (c *clashCase) directSYN() netip.AddrPort {
	c.t.Helper()
	out := c.tcp(c.client, c.be1, bpftest.SYN)
	wantAP(c.t, "direct SYN destination", out.Dst, c.be1)
	if out.Src.Addr() != c.client.Addr() {
		c.t.Fatalf("direct flow left with address %v: only its port may change", out.Src)
	}
	return out.Src
}

// wantReplyRestored checks that the backend's reply to seen reaches the
// client's own port from from.
func (c *clashCase) wantReplyRestored(seen, from netip.AddrPort) {
	c.t.Helper()
	r := c.tcp(c.be1, seen, bpftest.SYN|bpftest.ACK)
	wantAP(c.t, "reply source", r.Src, from)
	wantAP(c.t, "reply destination", r.Dst, c.client)
}

// wantRemapped fails unless seen is the client's address with another port.
func (c *clashCase) wantRemapped(what string, seen netip.AddrPort) {
	c.t.Helper()
	if seen.Addr() != c.client.Addr() || seen.Port() == c.client.Port() {
		c.t.Fatalf("%s left as %v: want the client's address with another port", what, seen)
	}
}

func TestClashLiveServiceFlowThenDirectFlowIsRemapped(t *testing.T) {
	forEachFamily(t, func(c *clashCase) {
		if seen := c.serviceFlow(); seen != c.client {
			t.Fatalf("service flow remapped to %v with nothing to clash with", seen)
		}
		seen := c.directSYN()
		c.wantRemapped("direct flow", seen)
		c.wantReplyRestored(seen, c.be1)
		// The Service flow's replies are still its own.
		c.wantReplyRestored(c.client, c.vip)
		// The direct flow's next segment keeps its new port.
		wantAP(t, "direct flow's next segment", c.tcp(c.client, c.be1, bpftest.ACK).Src, seen)
		if n := c.d.Counter(gen.SluiceCounterCNT_TUPLE_REMAPPED); n != 1 {
			t.Fatalf("remaps counted %d, want 1", n)
		}
	})
}

func TestClashLiveDirectFlowThenServiceFlowIsRemapped(t *testing.T) {
	forEachFamily(t, func(c *clashCase) {
		if seen := c.directSYN(); seen != c.client {
			t.Fatalf("direct flow remapped to %v with nothing to clash with", seen)
		}
		out := c.tcp(c.client, c.vip, bpftest.SYN)
		wantAP(t, "service flow destination", out.Dst, c.be1)
		c.wantRemapped("service flow", out.Src)
		if n := c.d.Counter(gen.SluiceCounterCNT_TUPLE_REMAPPED); n != 1 {
			t.Fatalf("remaps counted %d, want 1", n)
		}
		c.wantReplyRestored(out.Src, c.vip)
		c.wantReplyRestored(c.client, c.be1)
	})
}

// closeFlow exchanges FINs on the service flow (client first or server first)
// and the last ACK.
func (c *clashCase) closeFlow(serverFirst bool) {
	c.t.Helper()
	clientFIN := func() { c.tcp(c.client, c.vip, bpftest.FIN|bpftest.ACK) }
	serverFIN := func() { c.tcp(c.be1, c.client, bpftest.FIN|bpftest.ACK) }
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
	ends := map[string]func(c *clashCase){
		"server closed first": func(c *clashCase) { c.closeFlow(true) },
		"client closed first": func(c *clashCase) { c.closeFlow(false) },
		"client reset":        func(c *clashCase) { c.tcp(c.client, c.vip, bpftest.RST) },
		"server reset":        func(c *clashCase) { c.tcp(c.be1, c.client, bpftest.RST) },
	}
	for name, end := range ends {
		t.Run(name, func(t *testing.T) {
			forEachFamily(t, func(c *clashCase) {
				c.serviceFlow()
				end(c)
				if seen := c.directSYN(); seen.Port() == c.client.Port() {
					t.Fatal("direct flow took the tuple of an ended flow still in conntrack")
				}
				// Once the scanner has removed the ended flow, the tuple is free.
				c.d.DeleteCT(c.client, c.vip, protoTCP)
				c.d.DeleteCT(c.be1, c.client, protoTCP)
				c.d.DeleteCT(c.client, c.be1, protoTCP)
				if seen := c.directSYN(); seen != c.client {
					t.Fatalf("direct flow remapped to %v after the ended flow was removed", seen)
				}
			})
		})
	}
	forEachFamily(t, func(c *clashCase) {
		c.serviceFlow()
		c.closeFlow(true)
		fwd, _ := c.d.Flow(c.client, c.vip, protoTCP)
		rev, _ := c.d.Flow(c.be1, c.client, protoTCP)
		if rev.TCPSeen&uint32(gen.SluiceCtSeenCT_SEEN_FIN_FIRST) == 0 || fwd.TCPSeen&uint32(gen.SluiceCtSeenCT_SEEN_FIN_FIRST) != 0 {
			t.Fatalf("first FIN not recorded on the server's side: fwd %#x rev %#x", fwd.TCPSeen, rev.TCPSeen)
		}
	})
}

func TestClashUDPServiceFlowThenDirectFlow(t *testing.T) {
	forEachFamily(t, func(c *clashCase) {
		udp := func(src, dst netip.AddrPort, payload string) *bpftest.Decoded {
			return c.d.RunOK(c.d.Objs.SlFromWl, bpftest.UDPPacket(src, dst, []byte(payload)))
		}
		wantAP(t, "service datagram", udp(c.client, c.vip, "via service").Dst, c.be1)
		direct := udp(c.client, c.be1, "direct")
		c.wantRemapped("direct datagram", direct.Src)
		r := udp(c.be1, direct.Src, "answer")
		wantAP(t, "direct reply source", r.Src, c.be1)
		wantAP(t, "direct reply destination", r.Dst, c.client)
		wantAP(t, "service reply source", udp(c.be1, c.client, "answer").Src, c.vip)
	})
}

// A flow that enters a workload without having left one (the node itself, or
// an interface Sluice does not manage) is tracked at the workload's egress
// and remapped there, exactly as at the other hooks.
func TestClashDetectedEnteringAWorkload(t *testing.T) {
	forEachFamily(t, func(c *clashCase) {
		c.serviceFlow()
		out := c.d.RunOK(c.d.Objs.SlToWl, bpftest.TCPPacket(c.client, c.be1, bpftest.SYN))
		c.wantRemapped("flow entering the backend", out.Src)
		wantAP(t, "reply destination", c.tcp(c.be1, out.Src, bpftest.SYN|bpftest.ACK).Dst, c.client)
	})
}

// A SYN on the tuple of a flow that ended is a new connection: it is
// balanced again (to a live backend) instead of following the old flow.
func TestSYNOnAnEndedFlowIsBalancedAgain(t *testing.T) {
	forEachFamily(t, func(c *clashCase) {
		c.serviceFlow()
		c.closeFlow(false)
		// The backend leaves; another takes its place.
		c.d.AddService(bpftest.Service{ID: 1, Front: c.vip, Proto: protoTCP, Backends: []bpftest.Backend{{AP: c.be2}}})
		wantAP(t, "reopened flow's destination", c.tcp(c.client, c.vip, bpftest.SYN).Dst, c.be2)
		if n := c.d.Counter(gen.SluiceCounterCNT_TUPLE_REUSED); n != 1 {
			t.Fatalf("reuse counted %d times, want 1", n)
		}
		// A retransmitted SYN of the new flow follows it.
		wantAP(t, "retransmitted SYN", c.tcp(c.client, c.vip, bpftest.SYN).Dst, c.be2)
		r := c.tcp(c.be2, c.client, bpftest.SYN|bpftest.ACK)
		wantAP(t, "new flow's reply source", r.Src, c.vip)
	})
}

// A flow whose first packet reached a service IP before the Service was
// programmed (an agent starting, a Service just created) is tracked
// untranslated; once the frontend exists, the client's next SYN from the
// same port, or its next datagram, is balanced instead of following the old
// entry to the bare service IP.
func TestFlowTrackedBeforeItsServiceExistedIsBalancedOnceItDoes(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			d := f.newDP(t)
			early := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(f.client, f.vip, bpftest.SYN))
			wantAP(t, "SYN before the Service exists", early.Dst, f.vip)
			q := d.RunOK(d.Objs.SlFromWl, bpftest.UDPPacket(f.client, f.vip, []byte("early")))
			wantAP(t, "datagram before the Service exists", q.Dst, f.vip)

			d.AddService(bpftest.Service{ID: 1, Front: f.vip, Proto: protoTCP, Backends: []bpftest.Backend{{AP: f.be1}}})
			d.AddService(bpftest.Service{ID: 2, Front: f.vip, Proto: protoUDP, Backends: []bpftest.Backend{{AP: f.be1}}})
			// The client's connect timed out; it tries again from the same port.
			again := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(f.client, f.vip, bpftest.SYN))
			wantAP(t, "SYN after the Service was programmed", again.Dst, f.be1)
			r := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(f.be1, f.client, bpftest.SYN|bpftest.ACK))
			wantAP(t, "reply source", r.Src, f.vip)

			// A UDP client with a fixed port is balanced at the entry's next refresh.
			if v, ok := d.Flow(f.client, f.vip, protoUDP); !ok || v.SvcID != 0 {
				t.Fatalf("untranslated UDP entry %+v (present %v)", v, ok)
			}
			d.AgeFlow(f.client, f.vip, protoUDP, time.Second)
			q = d.RunOK(d.Objs.SlFromWl, bpftest.UDPPacket(f.client, f.vip, []byte("later")))
			wantAP(t, "datagram after the Service was programmed", q.Dst, f.be1)
			if n := d.Counter(gen.SluiceCounterCNT_FLOW_NOW_SERVICE); n != 2 {
				t.Fatalf("counted %d flows balanced anew, want 2", n)
			}
		})
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

// holdTuples writes a reverse entry of another flow for be1 -> the client's
// address at each of ports, as closed flows waiting for the scanner hold
// them.
func (c *clashCase) holdTuples(ports []uint16) {
	c.t.Helper()
	var err error
	if c.client.Addr().Is4() {
		keys, vals := make([]gen.SluiceCtKey, len(ports)), make([]gen.SluiceCtValue, len(ports))
		for i, port := range ports {
			keys[i] = bpftest.CtKey(c.be1, netip.AddrPortFrom(c.client.Addr(), port), protoTCP)
			vals[i] = gen.SluiceCtValue{Type: gen.SluiceCtTypeCT_REVERSE}
		}
		_, err = c.d.Objs.SlCtV2.BatchUpdate(keys, vals, nil)
	} else {
		keys, vals := make([]gen.SluiceCt6Key, len(ports)), make([]gen.SluiceCt6Value, len(ports))
		for i, port := range ports {
			keys[i] = bpftest.CtKey6(c.be1, netip.AddrPortFrom(c.client.Addr(), port), protoTCP)
			vals[i] = gen.SluiceCt6Value{Type: gen.SluiceCtTypeCT_REVERSE}
		}
		_, err = c.d.Objs.SlCt6V1.BatchUpdate(keys, vals, nil)
	}
	if err != nil {
		c.t.Fatalf("hold %d tuples: %v", len(ports), err)
	}
}

// A client whose closed flows hold most of the remap range at a backend (as
// one that alternates Services with a common backend at thousands of
// connections a second does) still gets a free port for every new flow, as
// it does through netfilter: the search tries enough ports that a flow is
// refused only when nearly every one is taken. With 7 of 8 ports held, eight
// tries refused a flow in three. Once every port is held, the flow is
// refused and counted.
func TestClashRemapFindsAFreePortInACrowdedRange(t *testing.T) {
	forEachFamily(t, func(c *clashCase) {
		var held, free []uint16
		for port := 1024; port <= 65535; port++ {
			if port%8 == 0 {
				free = append(free, uint16(port))
			} else {
				held = append(held, uint16(port))
			}
		}
		c.holdTuples(held)
		isFree := map[uint16]bool{}
		for _, port := range free {
			isFree[port] = true
		}
		const flows = 200
		for i := range flows {
			client := netip.AddrPortFrom(c.client.Addr(), uint16(20001+8*i)) // held: remapped
			out, frame := c.d.Run(c.d.Objs.SlFromWl, bpftest.TCPPacket(client, c.be1, bpftest.SYN))
			if out != actOK {
				c.t.Fatalf("flow %d refused (verdict %d) with %d of %d ports free; refusals counted: %d",
					i, out, len(free)-i, 65535-1023, c.d.Counter(gen.SluiceCounterCNT_DROP_SNAT_PORTS))
			}
			dec, err := bpftest.Decode(frame)
			if err != nil {
				c.t.Fatal(err)
			}
			seen := dec.Src
			if seen.Addr() != client.Addr() || !isFree[seen.Port()] {
				c.t.Fatalf("flow %d left as %v: want the client's address and a port that was free", i, seen)
			}
			delete(isFree, seen.Port())
		}
		if n := c.d.Counter(gen.SluiceCounterCNT_TUPLE_REMAPPED); n != flows {
			c.t.Fatalf("remaps counted %d, want %d", n, flows)
		}

		var rest []uint16
		for port := range isFree {
			rest = append(rest, port)
		}
		c.holdTuples(rest)
		// The search's CPU must be the one whose crowding state is read.
		cpu := onOneCPU(c.t)
		client := netip.AddrPortFrom(c.client.Addr(), 20001+8*flows)
		if out, _ := c.d.Run(c.d.Objs.SlFromWl, bpftest.TCPPacket(client, c.be1, bpftest.SYN)); out != actShot {
			c.t.Fatalf("a flow with every port held: verdict %d, want TC_ACT_SHOT", out)
		}
		if n := c.d.Counter(gen.SluiceCounterCNT_DROP_SNAT_PORTS); n != 1 {
			c.t.Fatalf("refusals counted %d, want 1", n)
		}
		// The refusal makes the CPU's next searches short (PORT_TRIES_CROWDED),
		// until one succeeds.
		if at := c.crowdedSince(cpu); at == 0 {
			c.t.Fatal("a search that found no port left no mark on its CPU")
		}
		// It marks the destination full: within SNAT_FULL_NS, a flow that
		// cannot keep its port is refused without a search, even once ports
		// are free again.
		if _, ok := c.snatFullAt(); !ok {
			c.t.Fatal("a full search that found no port left no mark on its destination")
		}
		c.releaseTuples(held[:len(held)*7/8])
		// The release took its time (one delete a port): the mark made just
		// now again, so that the next flow meets it younger than
		// SNAT_FULL_NS however slow the machine.
		c.markSNATFull(0)
		drawn := c.d.Counter(gen.SluiceCounterCNT_SNAT_PORT_DRAWN)
		client = netip.AddrPortFrom(c.client.Addr(), 65001) // held still: remapped
		if out, _ := c.d.Run(c.d.Objs.SlFromWl, bpftest.TCPPacket(client, c.be1, bpftest.SYN)); out != actShot {
			c.t.Fatalf("a flow to a destination marked full: verdict %d, want TC_ACT_SHOT", out)
		}
		if n := c.d.Counter(gen.SluiceCounterCNT_SNAT_PORT_DRAWN); n != drawn {
			c.t.Fatalf("a flow to a destination marked full searched for a port (%d draws counted, want %d)", n, drawn)
		}
		if n := c.d.Counter(gen.SluiceCounterCNT_DROP_SNAT_PORTS); n != 2 {
			c.t.Fatalf("refusals counted %d, want 2", n)
		}
		// Once the mark is older than SNAT_FULL_NS, the next flow searches.
		c.ageSNATFull(time.Second)
		if out, _ := c.d.Run(c.d.Objs.SlFromWl, bpftest.TCPPacket(client, c.be1, bpftest.SYN)); out != actOK {
			c.t.Fatalf("a flow once most ports are free again: verdict %d, want TC_ACT_OK", out)
		}
		if at := c.crowdedSince(cpu); at != 0 {
			c.t.Fatalf("a search that found a port left its CPU crowded (since %d)", at)
		}
	})
}

// A destination marked full refuses only flows that would search: a client
// whose own port is free at the backend keeps it. A mark older than
// SNAT_FULL_NS makes the next search a full one even on a crowded CPU,
// whose own searches try PORT_TRIES_CROWDED ports: with 7 of 8 ports held,
// 8 tries fail one flow in three, and 128 practically never.
func TestSNATFullMarkRefusesOnlySearchesAndExpires(t *testing.T) {
	forEachFamily(t, func(c *clashCase) {
		c.markSNATFull(0)
		own := netip.AddrPortFrom(c.client.Addr(), 40000)
		out := c.tcp(own, c.be1, bpftest.SYN)
		wantAP(c.t, "a flow keeping its own free port past a mark", out.Src, own)
		// The mark is live: a flow that would search is refused.
		c.holdTuples([]uint16{40001})
		c.markSNATFull(0)
		if ret, _ := c.d.Run(c.d.Objs.SlFromWl, bpftest.TCPPacket(netip.AddrPortFrom(c.client.Addr(), 40001), c.be1, bpftest.SYN)); ret != actShot {
			c.t.Fatalf("a flow that must search, to a destination marked full: verdict %d, want TC_ACT_SHOT", ret)
		}

		var held []uint16
		for port := 1024; port <= 65535; port++ {
			if port%8 != 0 || port == 20000 {
				held = append(held, uint16(port))
			}
		}
		c.holdTuples(held)
		cpu := onOneCPU(c.t)
		for i := range 20 {
			c.markSNATFull(time.Second)
			c.crowd(cpu)
			client := netip.AddrPortFrom(c.client.Addr(), uint16(20001+8*i)) // held: remapped
			if out, _ := c.d.Run(c.d.Objs.SlFromWl, bpftest.TCPPacket(client, c.be1, bpftest.SYN)); out != actOK {
				c.t.Fatalf("flow %d after an expired mark, on a crowded CPU, with 1 port in 8 free: verdict %d, want TC_ACT_OK", i, out)
			}
		}
	})
}

// snatFullKey is the mark's key for flows from the client's address to be1
// (sl_snatfull_v1, sl_snatfull6_v1): the reverse key, port 0.
func (c *clashCase) snatFullKey() (*ebpf.Map, any) {
	dst := netip.AddrPortFrom(c.client.Addr(), 0)
	if dst.Addr().Is4() {
		return c.d.Objs.SlSnatfullV1, bpftest.CtKey(c.be1, dst, protoTCP)
	}
	return c.d.Objs.SlSnatfull6V1, bpftest.CtKey6(c.be1, dst, protoTCP)
}

// snatFullAt reads when a full search last found every port to be1 from
// the client's address taken.
func (c *clashCase) snatFullAt() (uint64, bool) {
	c.t.Helper()
	m, k := c.snatFullKey()
	var v gen.SluiceSnatFull
	if err := m.Lookup(k, &v); errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, false
	} else if err != nil {
		c.t.Fatal(err)
	}
	return v.At, true
}

// ageSNATFull moves the mark of snatFullAt back by age.
func (c *clashCase) ageSNATFull(age time.Duration) {
	c.t.Helper()
	at, ok := c.snatFullAt()
	if !ok {
		c.t.Fatal("no mark to age")
	}
	m, k := c.snatFullKey()
	c.d.Put(m, k, gen.SluiceSnatFull{At: at - uint64(age)})
}

// datapathNow is a time the datapath's clock (sl_now, the tick's) has
// passed: a Monotonic read may be ahead of it by up to two ticks (8 ms at
// 250 Hz, 20 at 100), and a stamp ahead of the clock would read as ages
// ago. It leaves a mark made at it 80 ms of SNAT_FULL_NS.
func datapathNow() uint64 {
	return uint64(gen.Monotonic() - 20*time.Millisecond)
}

// markSNATFull marks the destination of snatFullKey full, age ago by the
// datapath's clock.
func (c *clashCase) markSNATFull(age time.Duration) {
	c.t.Helper()
	m, k := c.snatFullKey()
	c.d.Put(m, k, gen.SluiceSnatFull{At: datapathNow() - uint64(age)})
}

// crowd makes cpu's next searches short, as a search that found no port
// does (PORT_TRIES_CROWDED).
func (c *clashCase) crowd(cpu int) {
	c.t.Helper()
	vs := make([]gen.SluicePortCrowded, ebpf.MustPossibleCPU())
	vs[cpu].RefusedAt = datapathNow()
	c.d.Put(c.d.Objs.SlPortcrowdV1, uint32(0), vs)
}

// onOneCPU keeps the calling goroutine on its thread and the thread on one
// CPU until the test ends, and returns the CPU.
func onOneCPU(t *testing.T) int {
	runtime.LockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Fatal(err)
	}
	cpu := 0
	for !old.IsSet(cpu) {
		cpu++
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	})
	return cpu
}

// crowdedSince reads when cpu's last port search found no port (0: none
// since one succeeded).
func (c *clashCase) crowdedSince(cpu int) uint64 {
	c.t.Helper()
	var vs []gen.SluicePortCrowded
	if err := c.d.Objs.SlPortcrowdV1.Lookup(uint32(0), &vs); err != nil {
		c.t.Fatal(err)
	}
	return vs[cpu].RefusedAt
}

// releaseTuples removes what holdTuples wrote for ports.
func (c *clashCase) releaseTuples(ports []uint16) {
	c.t.Helper()
	for _, port := range ports {
		held := netip.AddrPortFrom(c.client.Addr(), port)
		c.d.DeleteCT(c.be1, held, protoTCP)
	}
}

// A SYN that reopens an ended flow's tuple replaces that flow: its reverse
// entry goes, unless the server closed first and holds the tuple in
// TIME_WAIT, when the entry stays so that no other flow takes the tuple
// until the scanner removes it.
func TestReopenedTupleReplacesItsEndedFlow(t *testing.T) {
	for name, serverFirst := range map[string]bool{"client closed first": false, "server closed first": true} {
		t.Run(name, func(t *testing.T) {
			forEachFamily(t, func(c *clashCase) {
				c.serviceFlow()
				c.closeFlow(serverFirst)
				// The flow is balanced to another backend this time.
				c.d.AddService(bpftest.Service{ID: 1, Front: c.vip, Proto: protoTCP, Backends: []bpftest.Backend{{AP: c.be2}}})
				wantAP(t, "reopened flow's destination", c.tcp(c.client, c.vip, bpftest.SYN).Dst, c.be2)
				_, held := c.d.Flow(c.be1, c.client, protoTCP)
				if held != serverFirst {
					t.Fatalf("old flow's reverse entry present: %v, want %v", held, serverFirst)
				}
				if _, ok := c.d.Flow(c.be2, c.client, protoTCP); !ok {
					t.Fatal("the new flow has no reverse entry")
				}
			})
		})
	}
}

// A SNATed client reopening its tuple after its server closed first keeps
// its port at the same backend, where the ended flow's entry still guards
// the server's TIME_WAIT: the flow takes back its own tuple rather than
// drawing a port (which would hold one of the range for 120 s per reuse).
func TestSNATedClientReopeningKeepsItsPort(t *testing.T) {
	forEachFamily(t, func(c *clashCase) {
		c.d.Put(c.d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP), Flags: gen.SluiceConfigFlagsCFG_MASQUERADE_ALL})
		for i := range 3 {
			out := c.tcp(c.client, c.vip, bpftest.SYN)
			if out.Src.Port() != c.client.Port() || out.Src.Addr() == c.client.Addr() {
				t.Fatalf("round %d: SNATed SYN left as %v: want the node's address and the client's port", i, out.Src)
			}
			c.tcp(c.be1, out.Src, bpftest.SYN|bpftest.ACK)
			c.tcp(c.client, c.vip, bpftest.ACK)
			c.tcp(c.be1, out.Src, bpftest.FIN|bpftest.ACK)
			c.tcp(c.client, c.vip, bpftest.FIN|bpftest.ACK)
		}
		if n := c.d.Counter(gen.SluiceCounterCNT_SNAT_PORT_DRAWN); n != 0 {
			t.Fatalf("%d ports drawn, want 0", n)
		}
		if n := c.d.Counter(gen.SluiceCounterCNT_TUPLE_REUSED); n != 2 {
			t.Fatalf("%d reopened tuples, want 2", n)
		}
	})
}
