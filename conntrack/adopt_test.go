package conntrack_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/conntrack/netfilter"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

// Connections netfilter's NAT balanced (kube-proxy's way: DNAT in
// prerouting, and masquerade for a NodePort) go on with their backends after
// Sluice adopts them and netfilter's rules are gone — even though Sluice's
// own Service sends new flows elsewhere. Three connections: a pod's TCP to a
// ClusterIP (which Sluice tracked untranslated before the Service was
// programmed: adoption replaces that entry), a pod's UDP socket to the same
// ClusterIP (passed to netfilter while adopting), and an external client's
// TCP to a NodePort, SNATed by netfilter to the node's address.
func TestAdoptedConnectionsOutliveNetfilter(t *testing.T) {
	dp := bpftest.NewDatapath(t, nodeIP)
	topo := bpftest.NewTopology(t, dp, "client", "b1", "b2")
	b1, b2 := topo.PodIP["b1"], topo.PodIP["b2"]
	for name, ns := range map[string]*bpftest.NetNS{"b1": topo.Pods["b1"], "b2": topo.Pods["b2"]} {
		bpftest.ServeTCP(t, ns, name, ":8080")
		bpftest.ServeUDPEcho(t, ns, name, ":5353")
	}
	vip := netip.MustParseAddrPort("10.96.0.10:80")
	dns := netip.MustParseAddrPort("10.96.0.10:53")
	nodePort := netip.AddrPortFrom(topo.NodeIP, 30080)
	setFlags(t, dp, gen.SluiceConfigFlagsCFG_ADOPTING)

	// The other proxy's rules: everything to b1.
	rules := filepath.Join(t.TempDir(), "other-proxy.nft")
	if err := os.WriteFile(rules, []byte(fmt.Sprintf(`table ip other-proxy {
	chain pre { type nat hook prerouting priority dstnat;
		ip daddr 10.96.0.10 tcp dport 80 dnat to %[1]s:8080
		ip daddr 10.96.0.10 udp dport 53 dnat to %[1]s:5353
		ip daddr %[2]s tcp dport 30080 meta mark set 0x4000 dnat to %[1]s:8080
	}
	chain post { type nat hook postrouting priority srcnat;
		meta mark 0x4000 masquerade
	}
}
`, b1, topo.NodeIP)), 0o644); err != nil {
		t.Fatal(err)
	}
	topo.Node.Run("nft", "-f", rules)
	topo.Node.Run("sh", "-c", "echo 1 > /proc/sys/net/netfilter/nf_conntrack_tcp_loose || true")

	podTCP := dialLines(t, topo.Pods["client"], vip)
	extTCP := dialLines(t, topo.External, nodePort)
	var udp *net.UDPConn
	if err := topo.Pods["client"].Do(func() (err error) { udp, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 5300}); return err }); err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	ask := func(q string) string {
		t.Helper()
		if _, err := udp.WriteToUDPAddrPort([]byte(q), dns); err != nil {
			t.Fatal(err)
		}
		udp.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 512)
		n, from, err := udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("udp %q: %v", q, err)
		}
		if from != dns {
			t.Fatalf("udp %q answered from %v, want the Service's address", q, from)
		}
		return strings.Fields(string(buf[:n]))[0]
	}
	check := func(when string) {
		t.Helper()
		for name, c := range map[string]*lineConn{"pod -> ClusterIP": podTCP, "external -> NodePort": extTCP} {
			if got := c.talk(t, when); got != "b1" {
				t.Fatalf("%s, %s: answered by %s, the connection was with b1", when, name, got)
			}
		}
		if got := ask(when); got != "b1" {
			t.Fatalf("%s, pod -> ClusterIP UDP: answered by %s, the session was with b1", when, got)
		}
	}
	check("before-the-services")

	// Sluice's Services send new flows to b2 only.
	dp.AddService(bpftest.Service{ID: 1, Front: vip, Proto: bpftest.ProtoTCP, Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(b2, 8080), Local: true}}})
	dp.AddService(bpftest.Service{ID: 2, Front: dns, Proto: bpftest.ProtoUDP, Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(b2, 5353), Local: true}}})
	dp.AddService(bpftest.Service{ID: 3, Front: netip.MustParseAddrPort("255.255.255.255:30080"), Proto: bpftest.ProtoTCP,
		Flags: gen.SluiceFeFlagsFE_EXTERNAL, Backends: []bpftest.Backend{{AP: netip.AddrPortFrom(b2, 8080), Local: true}}})
	check("services-programmed")

	var nfc *netfilter.Conn
	if err := topo.Node.Do(func() (err error) { nfc, err = netfilter.Dial(); return err }); err != nil {
		t.Fatal(err)
	}
	defer nfc.Close()
	flows, err := nfc.Translated()
	if err != nil {
		t.Fatal(err)
	}
	a := adopter(t, dp)
	adopted := 0
	for _, f := range flows {
		err := a.Adopt(conntrack.Adoption{Proto: f.Proto, Client: f.Client, Frontend: f.Frontend, Backend: f.Backend, Source: f.Source})
		if err != nil {
			t.Fatalf("adopt %v: %v", f, err)
		}
		// Adopting twice finds the flow tracked, and writes nothing.
		if err := a.Adopt(conntrack.Adoption{Proto: f.Proto, Client: f.Client, Frontend: f.Frontend, Backend: f.Backend, Source: f.Source}); !errors.Is(err, conntrack.ErrTracked) {
			t.Fatalf("adopt %v again: %v, want ErrTracked", f, err)
		}
		if err := nfc.Delete(f); err != nil {
			t.Fatal(err)
		}
		adopted++
	}
	if adopted != 3 {
		t.Fatalf("netfilter translated %d flows, want 3: %v", adopted, flows)
	}
	setFlags(t, dp, 0)
	// The other proxy leaves, and its rules with it.
	topo.Node.Run("nft", "delete", "table", "ip", "other-proxy")
	for i := range 5 {
		check(fmt.Sprintf("after-the-other-proxy-%d", i))
	}

	// New connections go where Sluice's Services say.
	if got := dialLines(t, topo.Pods["client"], vip).talk(t, "new"); got != "b2" {
		t.Fatalf("a new connection answered by %s, want b2", got)
	}
	// A flow to something that is no Service is not Sluice's to adopt.
	err = a.Adopt(conntrack.Adoption{Proto: 6, Client: netip.MustParseAddrPort("10.200.0.2:40000"), Frontend: netip.MustParseAddrPort("10.96.0.99:80"),
		Backend: netip.AddrPortFrom(b1, 8080), Source: netip.MustParseAddrPort("10.200.0.2:40000")})
	if !errors.Is(err, conntrack.ErrNotAService) {
		t.Fatalf("adopting a flow to no Service: %v", err)
	}
}

func setFlags(t *testing.T, dp *bpftest.Datapath, flags gen.SluiceConfigFlags) {
	t.Helper()
	var cfg gen.SluiceConfig
	if err := dp.Objs.SlConfigV1.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Flags = flags
	dp.Put(dp.Objs.SlConfigV1, uint32(0), cfg)
}

func adopter(t *testing.T, dp *bpftest.Datapath) *conntrack.Adopter {
	t.Helper()
	ct, err1 := maps.NewMap[gen.SluiceCtKey, gen.SluiceCtValue](dp.Objs.SlCtV2)
	fe, err2 := maps.NewMap[gen.SluiceFeKey, gen.SluiceFeValue](dp.Objs.SlFeV1)
	be, err3 := maps.NewMap[gen.SluiceBeKey, gen.SluiceBeValue](dp.Objs.SlBeV1)
	host, err4 := maps.NewMap[gen.SluiceHostipKey, gen.SluiceHostipValue](dp.Objs.SlHostipV1)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		t.Fatal(err)
	}
	return &conntrack.Adopter{Conntrack: ct, Frontends: fe, Backends: be, HostIPs: host}
}

// lineConn is a long-lived connection to a bpftest.ServeTCP server.
type lineConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialLines(t *testing.T, ns *bpftest.NetNS, to netip.AddrPort) *lineConn {
	t.Helper()
	var c net.Conn
	if err := ns.Do(func() (err error) { c, err = net.DialTimeout("tcp4", to.String(), 2*time.Second); return err }); err != nil {
		t.Fatalf("dial %v: %v", to, err)
	}
	t.Cleanup(func() { c.Close() })
	return &lineConn{c: c, r: bufio.NewReader(c)}
}

// talk sends line and returns the name of the backend that answered it.
func (l *lineConn) talk(t *testing.T, line string) string {
	t.Helper()
	l.c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintln(l.c, line); err != nil {
		t.Fatalf("send %q: %v", line, err)
	}
	answer, err := l.r.ReadString('\n')
	if err != nil {
		t.Fatalf("%q: no answer: %v", line, err)
	}
	return strings.Fields(answer)[0]
}
