package trace

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// affinity reads a client's entries from the affinity map of its family:
// an IPv6 client's from sl_aff6_v1 (it once read only the IPv4 map, and an
// IPv6 flow with affinity was always "a new pick").
func TestAffinityReadsTheClientsFamily(t *testing.T) {
	bpftest.Require(t)
	spec, err := gen.LoadSluice()
	if err != nil {
		t.Fatal(err)
	}
	replace := map[string]*ebpf.Map{}
	for _, name := range []string{gen.SluiceMapSlAffV1, gen.SluiceMapSlAff6V1} {
		ms := spec.Maps[name].Copy()
		ms.MaxEntries, ms.Pinning = 16, ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		replace[name] = m
	}
	client4, client6 := netip.MustParseAddr("10.1.9.2"), netip.MustParseAddr("fd00:1::9:2")
	if err := replace[gen.SluiceMapSlAffV1].Put(gen.SluiceAffKey{SvcId: 7, Client: gen.NetAddr(client4)},
		gen.SluiceAffValue{Addr: gen.NetAddr(netip.MustParseAddr("10.1.1.2"))}); err != nil {
		t.Fatal(err)
	}
	if err := replace[gen.SluiceMapSlAff6V1].Put(gen.SluiceAff6Key{SvcId: 8, Client: gen.NetAddr6(client6)},
		gen.SluiceAff6Value{Addr: gen.NetAddr6(netip.MustParseAddr("fd00:2::1:2"))}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		src  netip.Addr
		want string
	}{
		{client4, "7:10.1.1.2"},
		{client6, "8:fd00:2::1:2"},
		{netip.MustParseAddr("fd00:1::9:3"), ""},
	} {
		if got := affinity(replace, Packet{Src: netip.AddrPortFrom(c.src, 40000)}); got != c.want {
			t.Errorf("client %v: %q, want %q", c.src, got, c.want)
		}
	}
}
