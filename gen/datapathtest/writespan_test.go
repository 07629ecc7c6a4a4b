package datapathtest_test

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// TestDeferredTranslationWritesAsTheHelper checks sl_write_span, the program
// the entry programs tail-call to write an established packet's translation
// with direct writes (WRITE_SPAN, bpf/include/rewrite.h): which packets go to
// it, and that what it writes is what the helper's store writes, byte for
// byte. Over IPv4 and IPv6, TCP and UDP, both directions of a ClusterIP
// flow from a workload, and a flow from outside.
func TestDeferredTranslationWritesAsTheHelper(t *testing.T) {
	// A namespace of no routes: the FIB's answer for the backend is "the
	// stack", so a workload's flow is marked stack-routed after its first
	// established packet.
	ns := bpftest.NewNetNS(t)

	// marker returns markerVerdict: put in sl_spanwriter_v1's slot, it shows
	// which packets the entry program hands to the writer.
	const markerVerdict = 100
	marker, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, markerVerdict), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer marker.Close()

	type family struct {
		name                           string
		newDP                          func(testing.TB) *bpftest.Datapath
		client, vip, backend, external netip.AddrPort
	}
	families := []family{
		{"IPv4", newDP, clientAP, vipAP, netip.MustParseAddrPort("10.9.0.9:80"), netip.MustParseAddrPort("192.0.2.7:50001")},
		{"IPv6", newDP6, client6, vip6, netip.MustParseAddrPort("[fd00:9::9]:80"), netip.MustParseAddrPort("[2001:db8::7]:50001")},
	}
	for _, tc := range []struct {
		family
		proto uint8
	}{{families[0], protoTCP}, {families[0], protoUDP}, {families[1], protoTCP}, {families[1], protoUDP}} {
		name := tc.name + "/" + map[uint8]string{protoTCP: "TCP", protoUDP: "UDP"}[tc.proto]
		proto, client, vip, backend, external := tc.proto, tc.client, tc.vip, tc.backend, tc.external
		t.Run(name, func(t *testing.T) {
			d := tc.newDP(t)
			d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: proto, Backends: []bpftest.Backend{{AP: backend}}})
			run := func(prog *ebpf.Program, frame []byte) (uint32, []byte) {
				t.Helper()
				var ret uint32
				var out []byte
				if err := ns.Do(func() error {
					opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256)}
					var err error
					ret, err = prog.Run(&opts)
					out = opts.DataOut
					return err
				}); err != nil {
					t.Fatal(err)
				}
				return ret, out
			}
			packet := func(src, dst netip.AddrPort, first bool) []byte {
				if proto == protoUDP {
					return bpftest.UDPPacket(src, dst, []byte("datagram"))
				}
				if first {
					return bpftest.TCPPacket(src, dst, bpftest.SYN)
				}
				return bpftest.TCPPacket(src, dst, bpftest.ACK)
			}
			// translated runs prog on frame, wants it passed, translated to
			// want with valid checksums, and returns the frame.
			translated := func(prog *ebpf.Program, frame []byte, wantSrc, wantDst netip.AddrPort) []byte {
				t.Helper()
				ret, out := run(prog, frame)
				if ret != actOK {
					logCounters(t, d)
					t.Fatalf("verdict %d, want TC_ACT_OK", ret)
				}
				dec, err := bpftest.Decode(out)
				if err != nil {
					t.Fatal(err)
				}
				wantAP(t, "source", dec.Src, wantSrc)
				wantAP(t, "destination", dec.Dst, wantDst)
				return out
			}
			toWriter := func(prog *ebpf.Program, frame []byte) bool {
				t.Helper()
				if err := d.Objs.SlSpanwriterV1.Put(uint32(0), marker); err != nil {
					t.Fatal(err)
				}
				defer func() {
					if err := d.Objs.SlSpanwriterV1.Put(uint32(0), d.Objs.SlWriteSpan); err != nil {
						t.Fatal(err)
					}
				}()
				ret, _ := run(prog, frame)
				return ret == markerVerdict
			}

			// From a workload: the first packet, and the first
			// established one (not yet marked stack-routed: its verdict
			// waits for local delivery's answer) are written by the helper.
			translated(d.Objs.SlFromWl, packet(client, vip, true), client, backend)
			fwd := packet(client, vip, false)
			if toWriter(d.Objs.SlFromWl, fwd) {
				t.Fatal("an established packet of a flow not marked stack-routed went to the writer")
			}
			byHelper := translated(d.Objs.SlFromWl, fwd, client, backend)
			if !toWriter(d.Objs.SlFromWl, fwd) {
				t.Fatal("an established packet of a stack-routed flow did not go to the writer")
			}
			byWriter := translated(d.Objs.SlFromWl, fwd, client, backend)
			if !bytes.Equal(byWriter, byHelper) {
				t.Fatalf("the writer's packet differs from the helper's:\n%x\n%x", byWriter, byHelper)
			}

			// The reply, from the backend's workload: marked by its
			// first packet, then written by the writer.
			reply := packet(backend, client, false)
			replyByHelper := translated(d.Objs.SlFromWl, reply, vip, client)
			if !toWriter(d.Objs.SlFromWl, reply) {
				t.Fatal("a reply of a stack-routed flow did not go to the writer")
			}
			if got := translated(d.Objs.SlFromWl, reply, vip, client); !bytes.Equal(got, replyByHelper) {
				t.Fatalf("the writer's reply differs from the helper's:\n%x\n%x", got, replyByHelper)
			}

			// Without the writer (an agent that has exited empties the
			// array), the entry program stores the span itself.
			if err := d.Objs.SlSpanwriterV1.Delete(uint32(0)); err != nil {
				t.Fatal(err)
			}
			if got := translated(d.Objs.SlFromWl, fwd, client, backend); !bytes.Equal(got, byHelper) {
				t.Fatalf("the fallback's packet differs from the helper's:\n%x\n%x", got, byHelper)
			}
			if err := d.Objs.SlSpanwriterV1.Put(uint32(0), d.Objs.SlWriteSpan); err != nil {
				t.Fatal(err)
			}

			// From outside: a flow its host endpoint allowed (none judges
			// it here) goes to the writer from its first established
			// packet; the writer and the fallback write the same bytes.
			translated(d.Objs.SlFromHost, packet(external, vip, true), external, backend)
			ext := packet(external, vip, false)
			if !toWriter(d.Objs.SlFromHost, ext) {
				t.Fatal("an established packet from outside did not go to the writer")
			}
			extByWriter := translated(d.Objs.SlFromHost, ext, external, backend)
			if err := d.Objs.SlSpanwriterV1.Delete(uint32(0)); err != nil {
				t.Fatal(err)
			}
			if got := translated(d.Objs.SlFromHost, ext, external, backend); !bytes.Equal(got, extByWriter) {
				t.Fatalf("the fallback's packet from outside differs from the writer's:\n%x\n%x", got, extByWriter)
			}
		})
	}
}
