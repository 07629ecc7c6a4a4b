package datapathtest_test

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// The IPv6 twins of clash_test.go's full-map test and of the SNAT settings
// test (the clash rules themselves run per family in clash_test.go).

func TestIPv6FullConntrackRefusesNewFlowsNeverEvictsEstablished(t *testing.T) {
	spec, err := gen.Spec()
	if err != nil {
		t.Fatal(err)
	}
	ctSpec := spec.Maps[gen.SluiceMapSlCt6V1].Copy()
	ctSpec.MaxEntries = 64
	ct, err := ebpf.NewMap(ctSpec)
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	d := bpftest.NewDatapathWithMaps(t, nodeIP, map[string]*ebpf.Map{gen.SluiceMapSlCt6V1: ct})
	d.SetNodeIP6(node6)
	d.AddService(web6())
	dns := netip.MustParseAddrPort("[fd00:96::53]:53")
	d.AddService(bpftest.Service{ID: 2, Front: dns, Proto: protoUDP, Backends: []bpftest.Backend{{AP: be1v6}}})
	d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(client6, vip6, bpftest.SYN))
	d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(be1v6, client6, bpftest.SYN|bpftest.ACK))
	refused := 0
	for port := range uint16(200) {
		src := netip.AddrPortFrom(netip.MustParseAddr("fd00:1::77"), 20000+port)
		if ret, _ := d.Run(d.Objs.SlFromWl, bpftest.UDPPacket(src, dns, []byte("q"))); ret == actShot {
			refused++
		}
	}
	if refused == 0 || d.Counter(gen.SluiceCounterCNT_DROP_CT_FULL) != uint64(refused) {
		t.Fatalf("%d new flows refused, %d counted as conntrack-full", refused, d.Counter(gen.SluiceCounterCNT_DROP_CT_FULL))
	}
	out := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(client6, vip6, bpftest.ACK))
	wantAP(t, "established flow after the flood", out.Dst, be1v6)
	r := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(be1v6, client6, bpftest.ACK))
	wantAP(t, "its reply", r.Src, vip6)
}

func TestIPv6MasqueradeAllAndClusterCIDR(t *testing.T) {
	d := newDP6(t)
	d.AddService(web6())
	// The IPv6 pod CIDR: ClusterIP traffic from outside it, arriving on a
	// data interface, is SNATed to the node's IPv6 address.
	d.Put(d.Objs.SlConfig6V1, uint32(0), gen.SluiceConfig6{NodeIp: gen.NetAddr6(node6),
		ClusterNet: gen.NetAddr6(netip.MustParseAddr("fd00::")), ClusterMask: gen.NetAddr6(netip.MustParseAddr("ffff::"))})
	out := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(ext6, vip6, bpftest.SYN))
	if out.Src.Addr() != node6 {
		t.Fatalf("off-cluster client to a ClusterIP: source %v, want the node's IPv6 address", out.Src)
	}
	inCluster := netip.MustParseAddrPort("[fd00:9::1]:1234")
	if out := d.RunOK(d.Objs.SlFromHost, bpftest.TCPPacket(inCluster, vip6, bpftest.SYN)); out.Src != inCluster {
		t.Fatalf("in-cluster client SNATed to %v", out.Src)
	}
	// --masquerade-all (a flag of sl_config_v1, for both families).
	d.Put(d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP), Flags: gen.SluiceConfigFlagsCFG_MASQUERADE_ALL})
	if out := d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(netip.MustParseAddrPort("[fd00:1::9]:999"), vip6, bpftest.SYN)); out.Src.Addr() != node6 {
		t.Fatalf("masquerade-all: source %v", out.Src)
	}
}
