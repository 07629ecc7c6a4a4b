package maps_test

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

// The datapath, loaded against the pinned catalogue maps, run on built
// frames; its counters read back by name through maps.ReadCounters, as the
// agent's metrics read them.
func TestDatapathCountersReadByName(t *testing.T) {
	set := openSet(t)
	objs, err := gen.Load(gen.LoadOptions{Maps: set.All()})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	defer objs.Close()

	a := netip.MustParseAddrPort("10.0.0.1:1234")
	b := netip.MustParseAddrPort("10.0.0.2:80")
	tcp := bpftest.TCPPacket(a, b, bpftest.SYN)
	// A datagram in fragments: its later fragments are not the first one's,
	// and no Service owns the destination, so they pass as they are.
	frags := bpftest.Fragment(bpftest.UDPPacket(a, b, make([]byte, 1200)), 400)
	runs := []struct {
		name  string
		frame []byte
		ret   uint32
	}{
		{"truncated TCP", tcp[:14+20+10], 2}, // TC_ACT_SHOT
		{"truncated TCP again", tcp[:14+20+10], 2},
		{"ARP", arpFrame(), 0}, // TC_ACT_OK: not IPv4
		{"later fragment", frags[2], 0},
	}
	for _, r := range runs {
		ret, err := objs.SlFromHost.Run(&ebpf.RunOptions{Data: r.frame})
		if err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		if ret != r.ret {
			t.Fatalf("%s: return %d, want %d", r.name, ret, r.ret)
		}
	}

	m, err := maps.Counters.In(set)
	if err != nil {
		t.Fatal(err)
	}
	names, err := maps.CounterNames()
	if err != nil {
		t.Fatal(err)
	}
	got, err := maps.ReadCounters(m, names)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"drop_malformed": 2, "pass_fragment": 1}
	for name, n := range got {
		if n != want[name] {
			t.Errorf("counter %s = %d, want %d", name, n, want[name])
		}
	}
	if len(got) != len(names) {
		t.Errorf("read %d counters, the header names %d", len(got), len(names))
	}
}

func arpFrame() []byte {
	f := make([]byte, 42)
	copy(f[12:], []byte{0x08, 0x06})
	return f
}
