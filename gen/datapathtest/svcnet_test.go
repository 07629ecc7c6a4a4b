package datapathtest_test

import (
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// putServiceNet writes pfx into sl_svcnet_v1 as the NAT syncer does
// (nat/svcnet.go): one trie for both families, IPv4 mapped.
func putServiceNet(d *bpftest.Datapath, pfx netip.Prefix, kind gen.SluiceSvcnetKind) {
	d.Put(d.Objs.SlSvcnetV1, gen.SvcnetKeyOf(pfx), gen.SluiceSvcnetValue{Kind: kind})
}

// TestUnservedServiceAddressesAreRefused: a new flow to a port of a
// ClusterIP that no Service defines is rejected at once (RST, port
// unreachable), and one to an address of a ServiceCIDR that no Service holds
// is dropped, as kube-proxy nftables' cluster-ips-check does; both from a pod
// and from outside. So are packets without ports (echo requests, GRE) toward
// the range. The defined port is served, and an address outside the ranges
// passes as before.
func TestUnservedServiceAddressesAreRefused(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			d := f.newDP(t)
			d.AddService(bpftest.Service{ID: 1, Front: f.vip, Proto: protoTCP, Backends: []bpftest.Backend{{AP: f.be1}}})
			rangeBits, outside := 12, netip.MustParseAddr("10.112.0.1") // 10.96.0.0/12 ends at 10.111.255.255
			if f.vip.Addr().Is6() {
				rangeBits, outside = 112, netip.MustParseAddr("fd00:96::1:1")
			}
			putServiceNet(d, netip.PrefixFrom(f.vip.Addr(), rangeBits).Masked(), gen.SluiceSvcnetKindSVCNET_RANGE)
			putServiceNet(d, netip.PrefixFrom(f.vip.Addr(), f.vip.Addr().BitLen()), gen.SluiceSvcnetKindSVCNET_CLUSTER_IP)
			undefined := netip.AddrPortFrom(f.vip.Addr(), 81)
			unallocated := netip.AddrPortFrom(f.vip.Addr().Next(), 80)

			// An undefined port: TCP gets a RST from the ClusterIP.
			ret, out := d.Run(d.Objs.SlFromWl, bpftest.TCPPacket(f.client, undefined, bpftest.SYN))
			if ret != actRedirect {
				t.Fatalf("SYN to %v: verdict %d, want the RST sent back", undefined, ret)
			}
			rst, err := bpftest.Decode(out)
			if err != nil {
				t.Fatal(err)
			}
			if rst.TCP == nil || !rst.TCP.RST {
				t.Fatalf("answer to a SYN to %v: %v, want a RST", undefined, rst.Packet)
			}
			wantAP(t, "RST source", rst.Src, undefined)
			wantAP(t, "RST destination", rst.Dst, f.client)
			// UDP gets a port unreachable.
			ret, out = d.Run(d.Objs.SlFromWl, bpftest.UDPPacket(f.client, undefined, []byte("query")))
			if ret != actRedirect {
				t.Fatalf("datagram to %v: verdict %d, want a port unreachable sent back", undefined, ret)
			}
			unreach, err := bpftest.Decode(out)
			if err != nil {
				t.Fatal(err)
			}
			if f.vip.Addr().Is6() {
				if unreach.ICMP6 == nil || unreach.ICMP6.TypeCode != layers.CreateICMPv6TypeCode(1, 4) {
					t.Fatalf("answer %v, want ICMPv6 port unreachable", unreach.Packet)
				}
			} else if unreach.ICMP == nil || unreach.ICMP.TypeCode != layers.CreateICMPv4TypeCode(3, 3) {
				t.Fatalf("answer %v, want ICMP port unreachable", unreach.Packet)
			}
			if n := d.Counter(gen.SluiceCounterCNT_REJECT_UNDEFINED_PORT); n != 2 {
				t.Errorf("undefined-port rejects counted %d, want 2", n)
			}

			// An unallocated address of the range: dropped, from a pod
			// and from outside, with nothing tracked.
			for _, hook := range []struct {
				name string
				run  func() uint32
			}{
				{"from a pod", func() uint32 {
					r, _ := d.Run(d.Objs.SlFromWl, bpftest.TCPPacket(f.client, unallocated, bpftest.SYN))
					return r
				}},
				{"from outside", func() uint32 {
					r, _ := d.Run(d.Objs.SlFromHost, bpftest.TCPPacket(f.client, unallocated, bpftest.SYN))
					return r
				}},
				{"UDP from a pod", func() uint32 {
					r, _ := d.Run(d.Objs.SlFromWl, bpftest.UDPPacket(f.client, unallocated, []byte("q")))
					return r
				}},
			} {
				if ret := hook.run(); ret != actShot {
					t.Errorf("%s to %v: verdict %d, want dropped", hook.name, unallocated, ret)
				}
			}
			if n := d.Counter(gen.SluiceCounterCNT_DROP_UNALLOCATED_SERVICE_IP); n != 3 {
				t.Errorf("unallocated drops counted %d, want 3", n)
			}
			if n := d.CTCount() + d.CT6Count(); n != 0 {
				t.Errorf("%d conntrack entries after refused flows, want none", n)
			}

			// Without ports (an echo request, GRE): dropped toward the
			// range, the ClusterIP's GRE too; outside it they pass.
			echo, echoType := layers.IPProtocolICMPv4, uint8(8)
			if f.vip.Addr().Is6() {
				echo, echoType = layers.IPProtocolICMPv6, 128
			}
			for _, c := range []struct {
				what string
				spec bpftest.PacketSpec
				want uint32
			}{
				{"echo request to an unallocated address", bpftest.PacketSpec{Src: f.client, Dst: unallocated, Proto: echo, ICMPType: echoType, ICMPID: 7}, actShot},
				{"GRE to an unallocated address", bpftest.PacketSpec{Src: f.client, Dst: unallocated, Proto: layers.IPProtocolGRE, Payload: make([]byte, 24)}, actShot},
				{"GRE to the ClusterIP", bpftest.PacketSpec{Src: f.client, Dst: f.vip, Proto: layers.IPProtocolGRE, Payload: make([]byte, 24)}, actShot},
				{"echo request outside the range", bpftest.PacketSpec{Src: f.client, Dst: netip.AddrPortFrom(outside, 0), Proto: echo, ICMPType: echoType, ICMPID: 7}, actOK},
				{"GRE outside the range", bpftest.PacketSpec{Src: f.client, Dst: netip.AddrPortFrom(outside, 0), Proto: layers.IPProtocolGRE, Payload: make([]byte, 24)}, actOK},
			} {
				if ret, _ := d.Run(d.Objs.SlFromWl, bpftest.Build(c.spec)); ret != c.want {
					t.Errorf("%s: verdict %d, want %d", c.what, ret, c.want)
				}
			}
			if n := d.Counter(gen.SluiceCounterCNT_DROP_UNALLOCATED_SERVICE_IP); n != 6 {
				t.Errorf("unallocated drops counted %d after the portless packets, want 6", n)
			}

			// The defined port is served; an address outside the range
			// passes, tracked as any flow.
			wantAP(t, "the defined port", d.RunOK(d.Objs.SlFromWl, bpftest.TCPPacket(f.client, f.vip, bpftest.SYN)).Dst, f.be1)
			out2 := netip.AddrPortFrom(outside, 80)
			if ret, _ := d.Run(d.Objs.SlFromWl, bpftest.TCPPacket(f.client, out2, bpftest.SYN)); ret != actOK {
				t.Errorf("SYN to %v outside the range: verdict %d, want passed", out2, ret)
			}
			if n := d.Counter(gen.SluiceCounterCNT_DROP_UNALLOCATED_SERVICE_IP) + d.Counter(gen.SluiceCounterCNT_REJECT_UNDEFINED_PORT); n != 8 {
				t.Errorf("refusals counted %d after served flows, want still 8", n)
			}
			if t.Failed() {
				logCounters(t, d)
			}
		})
	}
}
