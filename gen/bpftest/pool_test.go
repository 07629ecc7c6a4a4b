package bpftest_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// A datapath a test hands back must reach the next test as a fresh load
// would: every map written here, of every type, is empty or zero afterwards,
// and the ring buffer has nothing left to read. One with a program in its
// program array is not emptied at all; sl_spanwriter_v1 keeps the program
// the load put in it.
func TestEmptyReturnsEveryMapToItsLoadedState(t *testing.T) {
	node := netip.MustParseAddr("10.0.0.1")
	client := netip.MustParseAddrPort("10.1.0.5:41234")
	vip := netip.MustParseAddrPort("10.96.0.10:80")
	d := bpftest.NewDatapath(t, node)
	objs := d.Objs

	// An event in the ring buffer: a new flow with flow events on.
	d.Put(objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(node), EventsPerSec: 100, Flags: gen.SluiceConfigFlagsCFG_FLOW_EVENTS})
	d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: netip.MustParseAddrPort("10.2.0.7:8080")}}})
	d.RunOK(objs.SlFromWl, bpftest.TCPPacket(client, vip, bpftest.SYN))
	rd, err := ringbuf.NewReader(objs.SlEventsV1)
	if err != nil {
		t.Fatal(err)
	}
	if rd.AvailableBytes() == 0 {
		t.Fatal("the new flow wrote no event: the ring buffer's draining would go untested")
	}
	rd.Close()

	// One entry of a recognisable pattern in every other map.
	maps := reflect.ValueOf(&objs.SluiceMaps).Elem()
	for i := range maps.NumField() {
		m := maps.Field(i).Interface().(*ebpf.Map)
		name := maps.Type().Field(i).Tag.Get("ebpf")
		var err error
		switch m.Type() {
		case ebpf.RingBuf:
			continue
		case ebpf.ProgramArray:
			if m == objs.SlSpanwriterV1 {
				continue // filled by the load, and left so by Empty
			}
			err = m.Put(uint32(3), objs.SlPolicyVerdict)
		case ebpf.HashOfMaps:
			inner, ierr := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4 * gen.MaglevDefaultTableSize, MaxEntries: 1})
			if ierr != nil {
				t.Fatal(ierr)
			}
			err = m.Put(uint32(7), inner)
			inner.Close()
		case ebpf.ArrayOfMaps:
			// A table like the one the bridge stands for: the conntrack
			// map the same load made, whose layout the slot requires.
			table := objs.SlCtV2
			if m == objs.SlCtprev6V1 {
				table = objs.SlCt6V1
			}
			inner, ierr := ebpf.NewMap(&ebpf.MapSpec{Type: table.Type(), KeySize: table.KeySize(), ValueSize: table.ValueSize(), MaxEntries: 16, Flags: table.Flags()})
			if ierr != nil {
				t.Fatal(ierr)
			}
			err = m.Put(uint32(0), inner)
			inner.Close()
		case ebpf.DevMapHash:
			// A devmap takes only an interface that exists: the loopback.
			err = m.Put(uint32(1), uint32(1))
		case ebpf.PerCPUArray, ebpf.PerCPUHash:
			cpus, _ := ebpf.PossibleCPU()
			values := make([][]byte, cpus)
			for c := range values {
				values[c] = pattern(int(m.ValueSize()))
			}
			err = m.Put(key(m), values)
		default:
			err = m.Put(key(m), pattern(int(m.ValueSize())))
		}
		if err != nil {
			t.Fatalf("put into %s: %v", name, err)
		}
	}

	// A program in the program array makes the datapath one to close, not
	// to empty (requireNoProgram); without it, emptying succeeds.
	if err := bpftest.Empty(&objs.SluiceMaps); err == nil || !strings.Contains(err.Error(), "sl_polprog_v1") {
		t.Fatalf("emptying a datapath with a program in its program array: %v, want an error naming sl_polprog_v1", err)
	}
	if err := objs.SlPolprogV1.Delete(uint32(3)); err != nil {
		t.Fatal(err)
	}
	if err := bpftest.Empty(&objs.SluiceMaps); err != nil {
		t.Fatal(err)
	}

	for i := range maps.NumField() {
		m := maps.Field(i).Interface().(*ebpf.Map)
		name := maps.Type().Field(i).Tag.Get("ebpf")
		switch m.Type() {
		case ebpf.RingBuf:
			rd, err := ringbuf.NewReader(m)
			if err != nil {
				t.Fatal(err)
			}
			if n := rd.AvailableBytes(); n != 0 {
				t.Errorf("%s: %d bytes left to read", name, n)
			}
			rd.SetDeadline(time.Now().Add(20 * time.Millisecond))
			if rec, err := rd.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("%s: a record was left to read (%d bytes, %v)", name, len(rec.RawSample), err)
			}
			rd.Close()
		case ebpf.ProgramArray:
			var id uint32
			if m == objs.SlSpanwriterV1 {
				if err := m.Lookup(uint32(0), &id); err != nil {
					t.Errorf("%s: the load's sl_write_span is gone from index 0: %v", name, err)
				}
				continue
			}
			if err := m.Lookup(uint32(3), &id); !errors.Is(err, ebpf.ErrKeyNotExist) {
				t.Errorf("%s: index 3 holds a program (id %d, %v)", name, id, err)
			}
		case ebpf.Array, ebpf.PerCPUArray:
			it := m.Iterate()
			var k uint32
			var v []byte
			var pv [][]byte
			for {
				var ok bool
				if m.Type() == ebpf.PerCPUArray {
					ok = it.Next(&k, &pv)
					v = bytes.Join(pv, nil)
				} else {
					ok = it.Next(&k, &v)
				}
				if !ok {
					break
				}
				if !bytes.Equal(v, make([]byte, len(v))) {
					t.Errorf("%s: index %d is not zero: %x", name, k, v)
					break
				}
			}
			if err := it.Err(); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		case ebpf.ArrayOfMaps:
			var id uint32
			if err := m.Lookup(uint32(0), &id); !errors.Is(err, ebpf.ErrKeyNotExist) {
				t.Errorf("%s: slot 0 holds a map (id %d, %v)", name, id, err)
			}
		default:
			if k, err := m.NextKeyBytes(nil); err != nil || k != nil {
				t.Errorf("%s: key %x left (%v)", name, k, err)
			}
		}
	}
}

// key is a valid key for m: all 0x01 bytes, with a full prefix length for an
// LPM trie and index 1 for an array.
func key(m *ebpf.Map) []byte {
	k := bytes.Repeat([]byte{1}, int(m.KeySize()))
	switch m.Type() {
	case ebpf.LPMTrie:
		binary.NativeEndian.PutUint32(k, 8*(m.KeySize()-4))
	case ebpf.Array, ebpf.PerCPUArray:
		k = []byte{0, 0, 0, 0}
		if m.MaxEntries() > 1 {
			k[0] = 1
		}
	}
	return k
}

func pattern(n int) []byte { return bytes.Repeat([]byte{0xa5}, n) }
