package maps_test

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

func ifStatsEntry(ifindex uint32, packets uint64) (gen.SluiceIfStatsKey, gen.SluiceIfStats) {
	return gen.SluiceIfStatsKey{Ifindex: ifindex}, gen.SluiceIfStats{Packets: packets}
}

// The counting program, loaded against the pinned catalogue maps, run on
// gopacket-built frames, its counters read back through maps.Map.
func TestCountProgramCountsByProtocol(t *testing.T) {
	set := openSet(t)
	objs, err := gen.Load(gen.LoadOptions{Maps: set.All()})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	defer objs.Close()

	a := netip.MustParseAddrPort("10.0.0.1:1234")
	b := netip.MustParseAddrPort("10.0.0.2:80")
	tcp := bpftest.TCPPacket(a, b, bpftest.SYN)
	frames := map[string][]byte{
		"tcp":       tcp,
		"udp":       bpftest.UDPPacket(a, b, []byte("hello")),
		"icmp":      bpftest.Build(bpftest.PacketSpec{Src: a, Dst: b, Proto: layers.IPProtocolICMPv4, ICMPType: 8}),
		"truncated": tcp[:14+20+10], // TCP header cut short
		"arp":       arpFrame(),
	}
	want := gen.SluiceIfStats{}
	runs := map[string]int{"tcp": 3, "udp": 2, "icmp": 1, "truncated": 1, "arp": 1}
	for name, n := range runs {
		for range n {
			ret, err := objs.SlCount.Run(&ebpf.RunOptions{Data: frames[name]})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if ret != 0 { // TC_ACT_OK
				t.Fatalf("%s: return %d, want TC_ACT_OK", name, ret)
			}
			want.Packets++
			want.Bytes += uint64(len(frames[name]))
		}
	}
	want.Ipv4, want.Tcp, want.Udp, want.Malformed, want.NonIpv4 = 6, 3, 2, 1, 1

	m, err := maps.IfStats.In(set)
	if err != nil {
		t.Fatal(err)
	}
	// BPF_PROG_TEST_RUN runs the program as if on the loopback device.
	got, err := m.Get(gen.SluiceIfStatsKey{Ifindex: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("counters %+v, want %+v", got, want)
	}
}

func arpFrame() []byte {
	f := make([]byte, 42)
	copy(f[12:], []byte{0x08, 0x06})
	return f
}
