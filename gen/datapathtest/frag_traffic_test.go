package datapathtest_test

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// UDP datagrams above the MTU (DNS with EDNS, NFS, video) leave the client
// as fragments: through a ClusterIP they must reach the backend whole, and
// the backend's fragmented answer must reach the client from the Service.
func TestRealFragmentedUDPThroughAClusterIP(t *testing.T) {
	d := newDP(t)
	topo := bpftest.NewTopology(t, d, "client", "b1")
	bpftest.ServeUDPEcho(t, topo.Pods["b1"], "b1", ":5353")
	dns := netip.MustParseAddrPort("10.96.0.10:53")
	d.AddService(bpftest.Service{ID: 1, Front: dns, Proto: protoUDP,
		Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(topo.PodIP["b1"], 5353), Local: true}}})
	d.Put(d.Objs.SlFeV1, gen.SluiceFeKey{Addr: gen.NetAddr(dns.Addr()), Proto: protoICMP}, gen.SluiceFeValue{})

	for _, size := range []int{3000, 5000, 8000} {
		query := bytes.Repeat([]byte{byte(size / 1000)}, size)
		answer, err := exchangeDatagram(topo.Pods["client"], "udp4", dns.String(), query)
		if err != nil {
			logCounters(t, d)
			t.Fatalf("%d-byte datagram through the ClusterIP: %v", size, err)
		}
		if want := append([]byte("b1 "), query...); !bytes.Equal(answer, want) {
			t.Fatalf("%d-byte datagram: answer of %d bytes, want the %d-byte echo", size, len(answer), len(want))
		}
	}
	if d.Counter(gen.SluiceCounterCNT_FRAGMENT_TRANSLATED) == 0 {
		t.Fatal("no fragment was translated: the datagrams were not fragmented")
	}
	if n := d.Counter(gen.SluiceCounterCNT_DROP_FRAGMENT_UNKNOWN); n != 0 {
		t.Fatalf("%d fragments dropped as unknown", n)
	}
}
