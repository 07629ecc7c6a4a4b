package bench

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// drainEvents reads the event ring buffer until the benchmark ends, as
// `sluice monitor` would, and returns how many it read.
func drainEvents(b *testing.B, d *bpftest.Datapath) func() int {
	rd, err := ringbuf.NewReader(d.Objs.SlEventsV1)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan int)
	go func() {
		n := 0
		for {
			rd.SetDeadline(time.Now().Add(100 * time.Millisecond))
			if _, err := rd.Read(); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					continue
				}
				done <- n
				return
			}
			n++
		}
	}()
	return func() int { rd.Close(); return <-done }
}

// BenchmarkEvents: what flow events (bpf/include/events.h) cost the
// datapath. Each path runs with events off (a budget of 0), and on: flow
// starts and ends with a reader draining the ring buffer, and a drop flood
// against a budget that suppresses most of it, or (unlimited) writes every
// event.
func BenchmarkEvents(b *testing.B) {
	b.Run("floor", benchFloor)
	vip, be := serviceAddr(0), backendAddr(0)
	for _, mode := range []struct {
		name   string
		budget uint32
		flows  bool
	}{{"off", 0, false}, {"flows", 1 << 30, true}, {"budget-1000", 1000, true}} {
		d := bpftest.NewDatapath(b, nodeIP)
		c := gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP), EventsPerSec: mode.budget}
		if mode.flows {
			c.Flags = gen.SluiceConfigFlagsCFG_FLOW_EVENTS
		}
		d.Put(d.Objs.SlConfigV1, uint32(0), c)
		d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: be}}})
		d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(clientAP, vip, bpftest.SYN))
		b.Run("established-"+mode.name, func(b *testing.B) {
			measure(b, d.Objs.SlFromWl, bpftest.ActOK, fixed(bpftest.TCPPacket(clientAP, vip, bpftest.ACK)))
		})
		b.Run("new-flow-"+mode.name, func(b *testing.B) {
			stop := drainEvents(b, d)
			measureNew(b, d.ClearConntrack, d.Objs.SlFromWl, bpftest.ActOK, newFlowFrames(vip))
			b.ReportMetric(float64(stop())/float64(b.N), "events/packet")
		})
		b.Run("drop-flood-"+mode.name, func(b *testing.B) {
			stop := drainEvents(b, d)
			measure(b, d.Objs.SlFromWl, bpftest.ActShot, fixed(Malformed(vip)))
			b.ReportMetric(float64(stop())/float64(b.N), "events/packet")
		})
	}
}
