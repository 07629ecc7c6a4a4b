package ifacemgr_test

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/ifacemgr"
)

// A steady UDP stream through a ClusterIP keeps flowing while the programs on
// its interfaces are replaced again and again: replacement is in place.
func TestReplaceUnderTrafficLosesNothing(t *testing.T) {
	e := newMgrEnv(t)
	client, backend := bpftest.NewNetNS(t), bpftest.NewNetNS(t)
	for i, ns := range []*bpftest.NetNS{client, backend} {
		v := bpftest.NewVeth(t, e.node, ns)
		e.node.Run("ip", "addr", "add", fmt.Sprintf("10.3%d.0.1/24", i), "dev", v.Name)
		ns.Run("ip", "addr", "add", fmt.Sprintf("10.3%d.0.2/24", i), "dev", v.PeerName)
		ns.Run("ip", "route", "add", "default", "via", fmt.Sprintf("10.3%d.0.1", i))
	}
	e.node.Run("sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0")
	vip, be := netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("10.31.0.2:5353")
	e.d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: bpftest.ProtoUDP, Backends: []bpftest.Backend{{AP: be, Local: true}}})
	bpftest.ServeUDPEcho(t, backend, "b", ":5353")

	m := e.manager(e.programs(e.d.Objs))
	if res := m.Apply(); len(res.Ready) != 2 {
		t.Fatalf("%+v", res)
	}
	// A second instance of the programs, sharing the maps: what an upgrade loads.
	other, err := gen.Load(gen.LoadOptions{Maps: map[string]*ebpf.Map{
		gen.SluiceMapSlFeV1: e.d.Objs.SlFeV1, gen.SluiceMapSlBeV1: e.d.Objs.SlBeV1, gen.SluiceMapSlCtV2: e.d.Objs.SlCtV2,
		gen.SluiceMapSlConfigV1: e.d.Objs.SlConfigV1, gen.SluiceMapSlHostipV1: e.d.Objs.SlHostipV1,
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	var conn *net.UDPConn
	if err := client.Do(func() (err error) { conn, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(vip)); return err }); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	replaced := make(chan int)
	go func() {
		n := 0
		for i := range 20 {
			sets := []*gen.SluiceObjects{other, e.d.Objs}
			m.SetPrograms(e.programs(sets[i%2]))
			n += m.Apply().Attached
			time.Sleep(5 * time.Millisecond)
		}
		replaced <- n
	}()
	const datagrams = 400
	lost := 0
	buf := make([]byte, 64)
	for i := range datagrams {
		fmt.Fprintf(conn, "%d", i)
		conn.SetReadDeadline(time.Now().Add(time.Second))
		if n, err := conn.Read(buf); err != nil || string(buf[:n]) != fmt.Sprintf("b %d", i) {
			lost++
		}
		time.Sleep(250 * time.Microsecond)
	}
	if n := <-replaced; n != 20*4 {
		t.Fatalf("%d hooks replaced, want 80 (20 rounds x 2 interfaces x 2 hooks)", n)
	}
	if lost != 0 {
		t.Fatalf("%d of %d datagrams lost across the replacements", lost, datagrams)
	}
}

func TestDottedInterfaceName(t *testing.T) {
	e := newMgrEnv(t)
	e.node.Run("ip", "link", "add", "slv.10", "type", "veth", "peer", "name", "slvpeer10")
	m, err := ifacemgr.New(ifacemgr.Options{Netns: e.node.Path(), PinDir: e.pinDir, Programs: e.programs(e.d.Objs),
		Classifier: ifacemgr.Classifier{WorkloadPrefixes: []string{"slv."}, DataIfaces: regexp.MustCompile("^$")}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if res := m.Apply(); len(res.Failed) != 0 || res.Attached != 2 {
		t.Fatalf("%+v", res)
	}
	if n, err := m.CleanupStale(); err != nil || n != 0 {
		t.Fatalf("clean-up took a live dotted pin for stale: %d %v", n, err)
	}
}
