package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

// ctlist reads what an agent pinned: here a pin directory on a private bpffs
// holding the agent's maps, with one IPv4 and one IPv6 connection written
// into the real kernel maps as the datapath writes them.
func TestListPrintsTheTrackedConnections(t *testing.T) {
	dir := bpftest.PinDir(t)
	set, err := maps.Open(maps.OpenOptions{PinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	ct, err := maps.Conntrack.In(set)
	if err != nil {
		t.Fatal(err)
	}
	ct6, err := maps.Conntrack6.In(set)
	if err != nil {
		t.Fatal(err)
	}
	client, front, backend := netip.MustParseAddrPort("10.0.0.5:40000"), netip.MustParseAddrPort("10.96.0.10:80"), netip.MustParseAddrPort("10.1.0.7:8080")
	key := gen.SluiceCtKey{Saddr: gen.NetAddr(client.Addr()), Daddr: gen.NetAddr(front.Addr()),
		Sport: gen.NetPort(client.Port()), Dport: gen.NetPort(front.Port()), Proto: 6}
	if err := ct.Put(key, gen.SluiceCtValue{Type: gen.SluiceCtTypeCT_FORWARD, NatAddr: gen.NetAddr(backend.Addr()),
		NatPort: gen.NetPort(backend.Port())}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	client6, front6, backend6 := netip.MustParseAddrPort("[fd00::5]:40001"), netip.MustParseAddrPort("[fd00:96::10]:53"), netip.MustParseAddrPort("[fd00:1::7]:5353")
	key6 := gen.SluiceCt6Key{Saddr: gen.NetAddr6(client6.Addr()), Daddr: gen.NetAddr6(front6.Addr()),
		Sport: gen.NetPort(client6.Port()), Dport: gen.NetPort(front6.Port()), Proto: 17}
	if err := ct6.Put(key6, gen.SluiceCt6Value{Type: gen.SluiceCtTypeCT_FORWARD, NatAddr: gen.NetAddr6(backend6.Addr()),
		NatPort: gen.NetPort(backend6.Port())}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := list(&out, dir); err != nil {
		t.Fatal(err)
	}
	for _, want := range [][]string{{"tcp", "10.0.0.5:40000", "10.96.0.10:80", "backend 10.1.0.7:8080"},
		{"udp", "[fd00::5]:40001", "[fd00:96::10]:53", "backend [fd00:1::7]:5353"}} {
		if !strings.Contains(strings.Join(strings.Fields(out.String()), " "), strings.Join(want[:2], " ")+" -> "+strings.Join(want[2:], " ")) {
			t.Errorf("no line %q in:\n%s", want, out.String())
		}
	}
}

// With nothing pinned, ctlist says where it looked.
func TestListSaysWhyThereIsNothing(t *testing.T) {
	dir := bpftest.PinDir(t) + "/nothing-here"
	err := list(&strings.Builder{}, dir)
	if err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("an empty pin directory: %v", err)
	}
}
