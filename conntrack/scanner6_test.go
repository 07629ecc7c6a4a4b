package conntrack_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

// IPv6 flows are scanned, listed and flushed as IPv4 ones are, in their own
// map, beside IPv4 flows.
func TestIPv6FlowsExpireGoStaleAndList(t *testing.T) {
	var (
		client6 = netip.MustParseAddrPort("[fd00:1::5]:41234")
		vip6    = netip.MustParseAddrPort("[fd00:96::10]:80")
		dns6    = netip.MustParseAddrPort("[fd00:96::53]:53")
		be6     = netip.MustParseAddrPort("[fd00:2::7]:8080")
		udpBE6  = netip.MustParseAddrPort("[fd00:2::9]:5353")
	)
	dp := bpftest.NewDatapath(t, nodeIP)
	dp.SetNodeIP6(netip.MustParseAddr("fd00::1"))
	dp.AddService(bpftest.Service{ID: 1, Front: vipAP, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: be1AP}}})
	dp.AddService(bpftest.Service{ID: 11, Front: vip6, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: be6}}})
	dp.AddService(bpftest.Service{ID: 12, Front: dns6, Proto: bpftest.ProtoUDP, Backends: []bpftest.Backend{{AP: udpBE6}}})
	ct, _ := maps.NewMap[gen.SluiceCtKey, gen.SluiceCtValue](dp.Objs.SlCtV2)
	ct6, _ := maps.NewMap[conntrack.Key, conntrack.Entry](dp.Objs.SlCt6V1)
	fe, _ := maps.NewMap[gen.SluiceFeKey, gen.SluiceFeValue](dp.Objs.SlFeV1)
	be, _ := maps.NewMap[gen.SluiceBeKey, gen.SluiceBeValue](dp.Objs.SlBeV1)
	hip, _ := maps.NewMap[gen.SluiceHostipKey, gen.SluiceHostipValue](dp.Objs.SlHostipV1)
	fe6, _ := maps.NewMap[gen.SluiceFe6Key, gen.SluiceFeValue](dp.Objs.SlFe6V1)
	be6m, _ := maps.NewMap[gen.SluiceBeKey, gen.SluiceBe6Value](dp.Objs.SlBe6V1)
	hip6, _ := maps.NewMap[gen.SluiceHostip6Key, gen.SluiceHostipValue](dp.Objs.SlHostip6V1)
	var offset time.Duration
	sc, err := conntrack.NewScanner(conntrack.Options{Conntrack: ct, Conntrack6: ct6,
		Scanners: []conntrack.EntryScanner{
			&conntrack.Liveness{Timeouts: conntrack.DefaultTimeouts()},
			&conntrack.StaleNAT{Frontends: fe, Backends: be, HostIPs: hip, Frontends6: fe6, Backends6: be6m, HostIPs6: hip6},
		},
		Clock: func() time.Duration { return conntrack.Monotonic() + offset },
	})
	if err != nil {
		t.Fatal(err)
	}
	run := func(frame []byte) { dp.RunOK(dp.Objs.SlFromWl, frame) }
	// An established IPv6 flow, a SYN that was never answered, a UDP flow,
	// and an established IPv4 flow.
	run(bpftest.TCPPacket(client6, vip6, bpftest.SYN))
	run(bpftest.TCPPacket(be6, client6, bpftest.SYN|bpftest.ACK))
	run(bpftest.TCPPacket(client6, vip6, bpftest.ACK))
	lone := netip.AddrPortFrom(client6.Addr(), 41999)
	run(bpftest.TCPPacket(lone, vip6, bpftest.SYN))
	run(bpftest.UDPPacket(client6, dns6, []byte("q")))
	run(bpftest.TCPPacket(clientAP, vipAP, bpftest.SYN))
	run(bpftest.TCPPacket(be1AP, clientAP, bpftest.SYN|bpftest.ACK))

	flows, err := conntrack.ListFlows(ct, ct6, conntrack.Monotonic())
	if err != nil || len(flows) != 4 {
		t.Fatalf("%d flows (%v), want 4: %v", len(flows), err, flows)
	}
	var text []string
	for _, f := range flows {
		text = append(text, f.String())
	}
	all := strings.Join(text, "\n")
	for _, want := range []string{
		"tcp [fd00:1::5]:41234 -> [fd00:96::10]:80 (nat [fd00:2::7]:8080) established",
		"udp [fd00:1::5]:41234 -> [fd00:96::53]:53 (nat [fd00:2::9]:5353) active",
		"tcp 10.1.0.5:41234 -> 10.96.0.10:80 (nat 10.2.0.7:8080) established",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("listing lacks %q:\n%s", want, all)
		}
	}

	// The UDP backend leaves its service: its flow goes stale.
	if err := be6m.Delete(gen.SluiceBeKey{SvcId: 12}); err != nil {
		t.Fatal(err)
	}
	if err := fe6.Delete(bpftest.FeKey6(dns6, bpftest.ProtoUDP)); err != nil {
		t.Fatal(err)
	}
	st, err := sc.Scan()
	if err != nil {
		t.Fatal(err)
	}
	if st.Deleted[conntrack.ReasonStaleNAT] != 1 || st.Entries != 8 || st.Capacity != ct.MaxEntries()+ct6.MaxEntries() {
		t.Fatalf("scan %+v", st)
	}
	// A minute later the unanswered SYN has expired; the established flows
	// of both families are kept.
	offset = time.Minute
	if st, err = sc.Scan(); err != nil || st.Deleted[conntrack.ReasonExpired] != 1 {
		t.Fatalf("scan %+v %v", st, err)
	}
	if _, ok := dp.CT6(bpftest.CtKey6(lone, vip6, bpftest.ProtoTCP)); ok {
		t.Fatal("the unanswered IPv6 SYN's flow was kept")
	}
	if _, ok := dp.CT6(bpftest.CtKey6(client6, vip6, bpftest.ProtoTCP)); !ok {
		t.Fatal("the established IPv6 flow was deleted")
	}
	// Flushing a backend reaches IPv6 UDP flows.
	run(bpftest.UDPPacket(client6, vip6, []byte("q"))) // no UDP frontend: a direct, tracked flow
	dp.AddService(bpftest.Service{ID: 12, Front: dns6, Proto: bpftest.ProtoUDP, Backends: []bpftest.Backend{{AP: udpBE6}}})
	run(bpftest.UDPPacket(client6, dns6, []byte("q")))
	n, err := sc.FlushBackends([]conntrack.Backend{{ServiceID: 12, Addr: udpBE6}})
	if err != nil || n != 1 {
		t.Fatalf("flushed %d (%v), want 1", n, err)
	}
	if _, ok := dp.CT6(bpftest.CtKey6(client6, dns6, bpftest.ProtoUDP)); ok {
		t.Fatal("flushed flow still there")
	}
}
