package datapathtest_test

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

var dnsVIP = netip.MustParseAddrPort("10.96.0.10:53")

// fragSetup programs a UDP ClusterIP whose only backend is be1AP.
func fragSetup(tb testing.TB) *bpftest.Datapath {
	tb.Helper()
	d := newDP(tb)
	d.AddService(bpftest.Service{ID: 5, Front: dnsVIP, Proto: protoUDP, Backends: []bpftest.Backend{{AP: be1AP}}})
	// The syncer marks every service IP (nat.Syncer); the datapath uses the
	// mark to recognise fragments to a service IP.
	d.Put(d.Objs.SlFeV1, gen.SluiceFeKey{Addr: gen.NetAddr(dnsVIP.Addr()), Proto: protoICMP}, gen.SluiceFeValue{})
	return d
}

// bigDatagram is a UDP datagram of n payload bytes, fragmented to 1480-byte
// IP payloads as a sender on a 1500-byte MTU does.
func bigDatagram(src, dst netip.AddrPort, n int, id uint16) (payload []byte, frags [][]byte) {
	payload = make([]byte, n)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	frame := bpftest.Build(bpftest.PacketSpec{Src: src, Dst: dst, Proto: layers.IPProtocolUDP, Payload: payload, ID: id})
	return payload, bpftest.Fragment(frame, 1480)
}

// runAll runs each fragment through prog and returns the output fragments of
// those that passed.
func runAll(t *testing.T, d *bpftest.Datapath, prog *ebpf.Program, frags [][]byte) (passed [][]byte, dropped int) {
	t.Helper()
	for _, f := range frags {
		ret, out := d.Run(prog, f)
		switch ret {
		case actOK:
			passed = append(passed, out[:len(f)])
		case actShot:
			dropped++
		default:
			t.Fatalf("fragment verdict %d", ret)
		}
	}
	return passed, dropped
}

func wantDatagram(t *testing.T, frags [][]byte, src, dst netip.AddrPort, payload []byte) {
	t.Helper()
	whole, err := bpftest.Reassemble(frags)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := bpftest.Decode(whole)
	if err != nil {
		t.Fatalf("reassembled datagram: %v", err) // checksums included
	}
	wantAP(t, "datagram source", dec.Src, src)
	wantAP(t, "datagram destination", dec.Dst, dst)
	if !bytes.Equal(dec.UDP.Payload, payload) {
		t.Fatal("payload changed")
	}
}

func TestFragmentedDatagramToAServiceAndFragmentedReply(t *testing.T) {
	d := fragSetup(t)
	payload, frags := bigDatagram(clientAP, dnsVIP, 6000, 0x4242)
	if len(frags) != 5 {
		t.Fatalf("%d fragments, want 5", len(frags))
	}
	out, dropped := runAll(t, d, d.Objs.SlFromWl, frags)
	if dropped != 0 {
		t.Fatalf("%d fragments dropped", dropped)
	}
	for i, f := range out {
		if dec, _ := bpftest.Decode(f); dec.IP.DstIP.String() != be1AP.Addr().String() {
			t.Fatalf("fragment %d went to %v, want the backend", i, dec.IP.DstIP)
		}
	}
	wantDatagram(t, out, clientAP, be1AP, payload)
	if got := d.Counter(gen.SluiceCounterCNT_FRAGMENT_TRANSLATED); got != 4 {
		t.Fatalf("%d later fragments translated, want 4", got)
	}

	// The backend's fragmented reply comes back from the Service.
	answer, reply := bigDatagram(be1AP, clientAP, 4000, 0x9999)
	out, dropped = runAll(t, d, d.Objs.SlFromWl, reply)
	if dropped != 0 {
		t.Fatalf("%d reply fragments dropped", dropped)
	}
	wantDatagram(t, out, dnsVIP, clientAP, answer)

	// Duplicates are translated like the original.
	dup, _ := runAll(t, d, d.Objs.SlFromWl, [][]byte{frags[0], frags[2], frags[2]})
	if dec, _ := bpftest.Decode(dup[2]); dec.IP.DstIP.String() != be1AP.Addr().String() {
		t.Fatal("duplicate fragment not translated")
	}
}

func TestFragmentsOutOfOrderOrExpiredAreDroppedNotPassedToAService(t *testing.T) {
	d := fragSetup(t)
	_, frags := bigDatagram(clientAP, dnsVIP, 3000, 0x1111)
	// The last fragment before the first: nothing tells which flow it is.
	ret, _ := d.Run(d.Objs.SlFromWl, frags[2])
	if ret != actShot || d.Counter(gen.SluiceCounterCNT_DROP_FRAGMENT_UNKNOWN) != 1 {
		t.Fatalf("out-of-order fragment to a service IP: verdict %d, %d counted", ret, d.Counter(gen.SluiceCounterCNT_DROP_FRAGMENT_UNKNOWN))
	}
	// A later fragment of a datagram to another address passes untouched.
	_, other := bigDatagram(clientAP, netip.MustParseAddrPort("10.9.9.9:53"), 3000, 0x2222)
	if ret, out := d.Run(d.Objs.SlFromWl, other[1]); ret != actOK || !bytes.Equal(out[:len(other[1])], other[1]) {
		t.Fatalf("unknown fragment to a non-service address: verdict %d or changed", ret)
	}
	if d.Counter(gen.SluiceCounterCNT_PASS_FRAGMENT) != 1 {
		t.Fatal("passed unknown fragment not counted")
	}

	// An expired first fragment no longer serves its datagram.
	_, late := bigDatagram(clientAP, dnsVIP, 3000, 0x3333)
	d.RunOK(d.Objs.SlFromWl, late[0])
	key := gen.SluiceFragKey{Saddr: gen.NetAddr(clientAP.Addr()), Daddr: gen.NetAddr(dnsVIP.Addr()), Id: gen.NetPort(0x3333), Proto: protoUDP}
	var v gen.SluiceFragValue
	if err := d.Objs.SlFragV1.Lookup(key, &v); err != nil {
		t.Fatalf("first fragment not recorded: %v", err)
	}
	v.Created -= uint64(31 * time.Second)
	d.Put(d.Objs.SlFragV1, key, v)
	if ret, _ := d.Run(d.Objs.SlFromWl, late[1]); ret != actShot {
		t.Fatalf("fragment of an expired datagram: verdict %d, want drop", ret)
	}
}

// A later fragment whose first fragment was rejected (no endpoints) starts
// nothing and does not reach the Service's address.
func TestFragmentsOfARejectedDatagramAreDropped(t *testing.T) {
	d := fragSetup(t)
	d.AddService(bpftest.Service{ID: 5, Front: dnsVIP, Proto: protoUDP}) // no endpoints
	_, frags := bigDatagram(clientAP, dnsVIP, 3000, 0x5555)
	if ret, _ := d.Run(d.Objs.SlFromWl, frags[0]); ret != actRedirect {
		t.Fatalf("first fragment to a Service without endpoints: verdict %d, want the reject", ret)
	}
	if ret, _ := d.Run(d.Objs.SlFromWl, frags[1]); ret != actShot {
		t.Fatalf("later fragment of a rejected datagram: verdict %d, want drop", ret)
	}
	if d.CTCount() != 0 {
		t.Fatalf("%d conntrack entries", d.CTCount())
	}
}

// FuzzFragments sends a fragmented datagram to a Service in an order, with
// duplicates, overlaps and expiries chosen by the fuzzer. Invariants: no
// fragment passes with the Service's address as destination; every fragment
// that passes goes to the backend; when the whole datagram got through, it
// reassembles with a valid checksum.
//
//	go test -fuzz FuzzFragments -fuzztime 60s ./gen
func FuzzFragments(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3})
	f.Add([]byte{3, 2, 1, 0})
	f.Add([]byte{0, 0, 1, 1, 2, 3})
	f.Add([]byte{0, 0x81, 2, 3, 0x43})
	f.Add([]byte{0xc0, 1, 2, 3})
	d := fragSetup(f)
	var id uint16
	f.Fuzz(func(t *testing.T, plan []byte) {
		if len(plan) > 32 {
			return
		}
		d.TB = t
		id++
		src := netip.AddrPortFrom(clientAP.Addr(), 20000+id%1000)
		payload, frags := bigDatagram(src, dnsVIP, 5000, id)
		var passed [][]byte
		for _, step := range plan {
			frag := append([]byte(nil), frags[int(step&0x0f)%len(frags)]...)
			if step&0x40 != 0 {
				// Overlap: shift a later fragment's offset back by 8 bytes.
				ip := frag[14:]
				if fo := uint16(ip[6])<<8 | uint16(ip[7]); fo&0x1fff > 0 {
					fo--
					ip[6], ip[7] = byte(fo>>8), byte(fo)
					ip[10], ip[11] = 0, 0
					sum := ipChecksum(ip[:20])
					ip[10], ip[11] = byte(sum>>8), byte(sum)
				}
			}
			if step&0x80 != 0 {
				key := gen.SluiceFragKey{Saddr: gen.NetAddr(src.Addr()), Daddr: gen.NetAddr(dnsVIP.Addr()), Id: gen.NetPort(id), Proto: protoUDP}
				var v gen.SluiceFragValue
				if d.Objs.SlFragV1.Lookup(key, &v) == nil {
					v.Created -= uint64(time.Minute)
					d.Put(d.Objs.SlFragV1, key, v)
				}
			}
			ret, out := d.Run(d.Objs.SlFromWl, frag)
			if ret == actRedirect {
				continue // a reject answer
			}
			if ret != actOK {
				continue
			}
			dec, _ := bpftest.Decode(out[:len(frag)])
			if dec.IP.DstIP.Equal(dnsVIP.Addr().AsSlice()) {
				t.Fatalf("plan %x: a fragment passed to the Service's address untranslated", plan)
			}
			if !dec.IP.DstIP.Equal(be1AP.Addr().AsSlice()) {
				t.Fatalf("plan %x: fragment went to %v", plan, dec.IP.DstIP)
			}
			if step&0x40 == 0 {
				passed = append(passed, out[:len(frag)])
			}
		}
		if whole, err := bpftest.Reassemble(passed); err == nil {
			dec, err := bpftest.Decode(whole)
			if err != nil {
				t.Fatalf("plan %x: reassembled datagram: %v", plan, err)
			}
			if dec.Dst != be1AP || !bytes.Equal(dec.UDP.Payload, payload) {
				t.Fatalf("plan %x: reassembled to %v, payload equal %v", plan, dec.Dst, bytes.Equal(dec.UDP.Payload, payload))
			}
		}
	})
}
