package datapathtest_test

import (
	"net/netip"
	"testing"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

const (
	actOK       = bpftest.ActOK
	actShot     = bpftest.ActShot
	actRedirect = bpftest.ActRedirect
	protoICMP   = bpftest.ProtoICMP
	protoTCP    = bpftest.ProtoTCP
	protoUDP    = bpftest.ProtoUDP
)

var (
	clientAP = netip.MustParseAddrPort("10.1.0.5:41234")
	vipAP    = netip.MustParseAddrPort("10.96.0.10:80")
	be1AP    = netip.MustParseAddrPort("10.2.0.7:8080")
	be2AP    = netip.MustParseAddrPort("10.2.0.8:8080")
	nodeIP   = netip.MustParseAddr("10.0.0.1")
	extAP    = netip.MustParseAddrPort("198.51.100.9:50000")
)

func newDP(tb testing.TB) *bpftest.Datapath { return bpftest.NewDatapath(tb, nodeIP) }

func wantAP(tb testing.TB, what string, got, want netip.AddrPort) {
	tb.Helper()
	if got != want {
		tb.Fatalf("%s: %v, want %v", what, got, want)
	}
}

// logCounters logs the datapath counters that are not zero, by enum counter
// value (bpf/include/counters.h), to explain a failure.
func logCounters(tb testing.TB, d *bpftest.Datapath) {
	tb.Helper()
	for c := gen.SluiceCounter(0); c < gen.SluiceCounterCNT_MAX; c++ {
		if n := d.Counter(c); n != 0 {
			tb.Logf("datapath counter %d: %d", c, n)
		}
	}
}

// families are the addresses the per-family tests use.
var families = []struct {
	name                  string
	newDP                 func(testing.TB) *bpftest.Datapath
	client, vip, be1, be2 netip.AddrPort
}{
	{"IPv4", newDP, clientAP, vipAP, be1AP, be2AP},
	{"IPv6", newDP6, client6, vip6, be1v6, be2v6},
}
