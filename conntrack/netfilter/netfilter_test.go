package netfilter_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/sluice-net/sluice/conntrack/netfilter"
	"github.com/sluice-net/sluice/gen/bpftest"
)

func dial(t *testing.T) *netfilter.Conn {
	t.Helper()
	bpftest.Require(t)
	ns := bpftest.NewNetNS(t)
	var c *netfilter.Conn
	if err := ns.Do(func() (err error) { c, err = netfilter.Dial(); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A flow created with its translation is listed back as netfilter holds it,
// with both NATs; creating it twice is refused as ErrExists; deleting it
// removes it, and deleting it again is no error. Both families; a flow
// without DNAT is not listed as translated.
func TestCreateListDelete(t *testing.T) {
	c := dial(t)
	flows := []netfilter.Flow{
		{Proto: netfilter.ProtoTCP, Client: ap("198.51.100.7:40001"), Frontend: ap("10.0.0.1:30080"),
			Backend: ap("10.244.1.5:8080"), Source: ap("10.0.0.1:61001"), TCPState: netfilter.TCPEstablished},
		{Proto: netfilter.ProtoUDP, Client: ap("10.244.1.9:5300"), Frontend: ap("10.96.0.10:53"),
			Backend: ap("10.244.1.5:5353"), Source: ap("10.244.1.9:5300")},
		{Proto: netfilter.ProtoTCP, Client: ap("[fd00:244::9]:40002"), Frontend: ap("[fd00:96::10]:80"),
			Backend: ap("[fd00:244::5]:8080"), Source: ap("[fd00:244::9]:40002"), TCPState: netfilter.TCPEstablished},
	}
	untranslated := netfilter.Flow{Proto: netfilter.ProtoUDP, Client: ap("10.244.1.9:5301"), Frontend: ap("10.244.1.5:5353"),
		Backend: ap("10.244.1.5:5353"), Source: ap("10.244.1.9:5301")}
	for _, f := range append(slices.Clone(flows), untranslated) {
		if err := c.Create(f, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.Translated()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(flows) {
		t.Fatalf("%d translated flows listed, want %d: %v", len(got), len(flows), got)
	}
	for _, want := range flows {
		i := slices.IndexFunc(got, func(f netfilter.Flow) bool { return f.Client == want.Client })
		if i < 0 {
			t.Fatalf("%v not listed: %v", want, got)
		}
		f := got[i]
		if f.Frontend != want.Frontend || f.Backend != want.Backend || f.Source != want.Source || f.Proto != want.Proto {
			t.Fatalf("listed %v, created %v", f, want)
		}
		if !f.Assured || !f.Established() || f.Timeout < 50*time.Minute {
			t.Fatalf("%v: assured %v, established %v, timeout %v", f, f.Assured, f.Established(), f.Timeout)
		}
	}

	// The same original tuple, or another flow answering on the same reply
	// tuple, is refused.
	if err := c.Create(flows[0], time.Hour); !errors.Is(err, netfilter.ErrExists) {
		t.Fatalf("created twice: %v", err)
	}
	clash := flows[0]
	clash.Client = ap("198.51.100.8:40001")
	if err := c.Create(clash, time.Hour); !errors.Is(err, netfilter.ErrExists) {
		t.Fatalf("a second flow on the reply tuple %v -> %v: %v", clash.Backend, clash.Source, err)
	}

	for _, f := range flows {
		if err := c.Delete(f); err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(f); err != nil {
			t.Fatalf("deleting a flow netfilter no longer tracks: %v", err)
		}
	}
	if got, err := c.Translated(); err != nil || len(got) != 0 {
		t.Fatalf("after the deletes: %v, %v", got, err)
	}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
