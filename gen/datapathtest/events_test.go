package datapathtest_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// eventsOn writes the node config with a flow-event budget (and flow starts
// and ends with flows), and returns a reader of the ring buffer.
func eventsOn(t *testing.T, d *bpftest.Datapath, budget uint32, flows bool) *ringbuf.Reader {
	t.Helper()
	c := gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP), EventsPerSec: budget}
	if flows {
		c.Flags |= gen.SluiceConfigFlagsCFG_FLOW_EVENTS
	}
	d.Put(d.Objs.SlConfigV1, uint32(0), c)
	rd, err := ringbuf.NewReader(d.Objs.SlEventsV1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close() })
	return rd
}

// readEvents reads every event written so far.
func readEvents(t *testing.T, rd *ringbuf.Reader) []gen.SluiceEvent {
	t.Helper()
	var out []gen.SluiceEvent
	for {
		rd.SetDeadline(time.Now().Add(20 * time.Millisecond))
		rec, err := rd.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var e gen.SluiceEvent
		if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &e); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
}

func evAddr(a [16]uint8, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(gen.AddrFromNet6(a).Unmap(), gen.PortFromNet(port))
}

// A drop is an event with its reason and the packet's addresses; with flow
// events on, a service flow's start names its backend and its end comes
// once, with the packet that closes it.
func TestEventsDropsAndFlows(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			d := fam.newDP(t)
			rd := eventsOn(t, d, 100, true)
			d.AddService(bpftest.Service{ID: 1, Front: fam.vip, Proto: protoTCP, Backends: []bpftest.Backend{{AP: fam.be1}}})
			// A frontend whose only backend is elsewhere, with traffic
			// policy Local: a drop with its reason.
			local := netip.AddrPortFrom(fam.vip.Addr(), 81)
			d.AddService(bpftest.Service{ID: 2, Front: local, Proto: protoTCP, Backends: []bpftest.Backend{{AP: fam.be2}},
				Flags: gen.SluiceFeFlagsFE_INT_LOCAL})

			d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(fam.client, fam.vip, bpftest.SYN))
			d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(fam.be1, fam.client, bpftest.SYN|bpftest.ACK))
			d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(fam.client, fam.vip, bpftest.ACK))
			d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(fam.client, fam.vip, bpftest.FIN|bpftest.ACK))
			d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(fam.be1, fam.client, bpftest.FIN|bpftest.ACK))
			d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(fam.client, fam.vip, bpftest.ACK))
			if ret, _ := d.Run(d.Objs.SlFromWl, bpftest.TCPPacket(fam.client, local, bpftest.SYN)); ret != actShot {
				t.Fatalf("verdict %d, want a drop", ret)
			}

			evs := readEvents(t, rd)
			if len(evs) != 3 {
				t.Fatalf("%d events %+v, want a start, an end and a drop", len(evs), evs)
			}
			start, end, drop := evs[0], evs[1], evs[2]
			if start.Type != gen.SluiceEventTypeEV_FLOW_START || evAddr(start.Saddr, start.Sport) != fam.client ||
				evAddr(start.Daddr, start.Dport) != fam.vip || evAddr(start.NatAddr, start.NatPort) != fam.be1 ||
				start.SvcId != 1 || start.Proto != protoTCP || start.Hook != 0 /* HOOK_FROM_WL */ {
				t.Fatalf("start event %+v", start)
			}
			// The end is the backend's FIN, after the client's: the reply's
			// tuple as it came, before its translation.
			if end.Type != gen.SluiceEventTypeEV_FLOW_END || evAddr(end.Saddr, end.Sport) != fam.be1 ||
				evAddr(end.Daddr, end.Dport) != fam.client || end.SvcId != 1 || end.Reason&0x01 == 0 {
				t.Fatalf("end event %+v", end)
			}
			if drop.Type != gen.SluiceEventTypeEV_DROP || drop.Reason != uint32(gen.SluiceCounterCNT_DROP_NO_LOCAL_BACKEND) ||
				evAddr(drop.Saddr, drop.Sport) != fam.client || evAddr(drop.Daddr, drop.Dport) != local {
				t.Fatalf("drop event %+v", drop)
			}
			if (fam.name == "IPv4") != (drop.Family == 4) || drop.Ts == 0 || drop.Ifindex == 0 {
				t.Fatalf("drop event %+v: family, time or interface missing", drop)
			}

			// A reset ends a flow too.
			other := netip.AddrPortFrom(fam.client.Addr(), fam.client.Port()+1)
			d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(other, fam.vip, bpftest.SYN))
			d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(fam.be1, other, bpftest.RST|bpftest.ACK))
			evs = readEvents(t, rd)
			if len(evs) != 2 || evs[1].Type != gen.SluiceEventTypeEV_FLOW_END || evs[1].Reason&0x04 == 0 {
				t.Fatalf("events %+v, want a start and a reset end", evs)
			}
		})
	}
}

// Without flow events only drops are written; with a budget of 0, nothing.
func TestEventsOffWritesNothing(t *testing.T) {
	d := newDP(t)
	rd := eventsOn(t, d, 100, false)
	d.AddService(webService())
	d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.SYN))
	if evs := readEvents(t, rd); len(evs) != 0 {
		t.Fatalf("flow events written while off: %+v", evs)
	}
	d.Put(d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP), Flags: gen.SluiceConfigFlagsCFG_FLOW_EVENTS})
	d.Run(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vipAP, bpftest.SYN)[:40]) // cut short: dropped
	d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(netip.AddrPortFrom(clientAP.Addr(), 2), vipAP, bpftest.SYN))
	if evs := readEvents(t, rd); len(evs) != 0 {
		t.Fatalf("events written with a budget of 0: %+v", evs)
	}
}

// A flood of drops writes each CPU's budget of events a second and counts
// the rest: the ring buffer, and whoever reads it, sees a bounded rate.
func TestEventsFloodIsBounded(t *testing.T) {
	d := newDP(t)
	rd := eventsOn(t, d, 25, false)
	malformed := bpftest.TCPPacket(clientAP, vipAP, bpftest.SYN)[:14+20+10]
	start := time.Now()
	for range 1000 {
		if ret, _ := d.Run(d.Objs.SlFromWl, malformed); ret != actShot {
			t.Fatalf("verdict %d, want a drop", ret)
		}
	}
	elapsed := time.Since(start)
	evs := readEvents(t, rd)
	suppressed := d.Counter(gen.SluiceCounterCNT_EVENTS_SUPPRESSED)
	// Each CPU the runs landed on writes at most 25 in each second (a
	// second starts with a CPU's first event after the last one ended).
	maxEvents := 25 * runtime.NumCPU() * (int(elapsed/time.Second) + 2)
	if len(evs) == 0 || len(evs) > maxEvents || int(suppressed)+len(evs) != 1000 {
		t.Fatalf("%d events and %d suppressed for 1000 drops in %v; want at most %d events, the rest suppressed",
			len(evs), suppressed, elapsed, maxEvents)
	}
	for _, e := range evs {
		if e.Reason != uint32(gen.SluiceCounterCNT_DROP_MALFORMED) {
			t.Fatalf("event %+v: reason %d, want drop_malformed", e, e.Reason)
		}
	}
}
