package datapathtest_test

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// A conntrack table resized on an upgrade (maps.Migration): the old programs
// keep starting flows in the old table until the hooks run the new ones, and
// the agent copies those flows only once every hook has switched. Meanwhile
// a packet of such a flow reaches a new program whose table lacks it: without
// the bridge (sl_ctprev_v1) a segment of the established connection went up
// the node's stack untranslated, which answered it with a reset (a new
// connection failed in test/cluster/migrate.sh's rolling upgrade). With the
// old table in the bridge, the new program takes the flow's pair from it and
// translates the packet as the old one would have.
func TestResizedConntrackBridgesFlowsTheOldProgramsStarted(t *testing.T) {
	for _, fam := range []struct {
		name                  string
		node, client, backend netip.AddrPort
		table, bridge         string
		ctEntries             func(*bpftest.Datapath) int
	}{
		{"IPv4", netip.MustParseAddrPort("10.0.0.1:30085"), netip.MustParseAddrPort("198.51.100.9:50000"),
			netip.MustParseAddrPort("10.3.0.4:8080"), gen.SluiceMapSlCtV2, gen.SluiceMapSlCtprevV1,
			func(d *bpftest.Datapath) int { return d.CTCount() }},
		{"IPv6", netip.MustParseAddrPort("[fd00:1::1]:30085"), netip.MustParseAddrPort("[2001:db8:9::9]:50000"),
			netip.MustParseAddrPort("[fd00:3::4]:8080"), gen.SluiceMapSlCt6V1, gen.SluiceMapSlCtprev6V1,
			func(d *bpftest.Datapath) int { return d.CT6Count() }},
	} {
		t.Run(fam.name, func(t *testing.T) {
			svc := bpftest.Service{ID: 9, Front: fam.node, Proto: protoTCP, Backends: []bpftest.Backend{{AP: fam.backend}},
				Flags: gen.SluiceFeFlagsFE_EXTERNAL}
			setUp := func(d *bpftest.Datapath) {
				if fam.node.Addr().Is6() {
					d.SetNodeIP6(fam.node.Addr())
				}
				d.AddService(svc)
			}
			// The old programs, on their own table of another size.
			spec, err := gen.Spec()
			if err != nil {
				t.Fatal(err)
			}
			tableSpec := spec.Maps[fam.table].Copy()
			tableSpec.MaxEntries = 1024
			oldTable, err := ebpf.NewMap(tableSpec)
			if err != nil {
				t.Fatal(err)
			}
			defer oldTable.Close()
			old := bpftest.NewDatapathWithMaps(t, nodeIP, map[string]*ebpf.Map{fam.table: oldTable})
			setUp(old)
			syn := old.RunOK(old.Objs.SlFromHost, bpftest.TCPPacket(fam.client, fam.node, bpftest.SYN))
			wantAP(t, "the old programs' SYN", syn.Dst, fam.backend)
			snat := syn.Src
			if snat.Addr() != fam.node.Addr() {
				t.Fatalf("SYN SNATed to %v, want the node's address", snat)
			}

			d := newDP(t)
			setUp(d)
			ack := bpftest.TCPPacket(fam.client, fam.node, bpftest.ACK)
			// Without the bridge, the new programs know nothing of the flow.
			if _, out := d.Run(d.Objs.SlFromHost, ack); !bytes.Equal(out, ack) {
				t.Fatal("without the bridge, the new programs translated a segment of a flow they do not know: the test shows nothing")
			}
			bridge := map[string]*ebpf.Map{gen.SluiceMapSlCtprevV1: d.Objs.SlCtprevV1, gen.SluiceMapSlCtprev6V1: d.Objs.SlCtprev6V1}[fam.bridge]
			if err := bridge.Put(uint32(0), oldTable); err != nil {
				t.Fatal(err)
			}
			defer bridge.Delete(uint32(0))

			// The backend's SYN-ACK reaches the new programs first: back to
			// the client from the NodePort.
			reply := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(fam.backend, snat, bpftest.SYN|bpftest.ACK))
			wantAP(t, "reply source", reply.Src, fam.node)
			wantAP(t, "reply destination", reply.Dst, fam.client)
			// The client's segments go to the same backend from the same
			// SNAT port.
			out := d.RunOK(d.Objs.SlFromHost, ack)
			wantAP(t, "the client's ACK, destination", out.Dst, fam.backend)
			wantAP(t, "the client's ACK, source", out.Src, snat)
			if n := fam.ctEntries(d); n != 2 {
				t.Fatalf("%d conntrack entries in the new table, want the flow's pair", n)
			}
			// Once the slot is empty (the migration finished), a flow only
			// the old table holds is unknown again: the bridge is the
			// only way in.
			if err := bridge.Delete(uint32(0)); err != nil {
				t.Fatal(err)
			}
			other := netip.AddrPortFrom(fam.client.Addr(), fam.client.Port()+1)
			old.RunOK(old.Objs.SlFromHost, bpftest.TCPPacket(other, fam.node, bpftest.SYN))
			late := bpftest.TCPPacket(other, fam.node, bpftest.ACK)
			if _, out := d.Run(d.Objs.SlFromHost, late); !bytes.Equal(out, late) {
				t.Fatal("with the bridge empty, the new programs still found a flow of the old table")
			}
		})
	}
}
