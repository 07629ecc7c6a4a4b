package ifacemgr_test

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/ifacemgr"
)

// The prefilter on a real veth in driver mode: a denied source cannot ping or
// reach a NodePort, but still reaches a failsafe port; other sources are
// untouched.
func TestXDPPrefilterOnAVeth(t *testing.T) {
	d := bpftest.NewDatapath(t, netip.MustParseAddr("192.0.2.1"))
	node, outside := bpftest.NewNetNS(t), bpftest.NewNetNS(t)
	v := bpftest.NewVeth(t, node, outside)
	node.Run("ip", "addr", "add", "192.0.2.1/24", "dev", v.Name)
	outside.Run("ip", "addr", "add", "192.0.2.2/24", "dev", v.PeerName)
	outside.Run("ip", "addr", "add", "192.0.2.3/24", "dev", v.PeerName)

	var mode ifacemgr.XDPMode
	err := node.Do(func() error {
		ifc, err := net.InterfaceByName(v.Name)
		if err != nil {
			return err
		}
		l, m, err := ifacemgr.AttachXDP(ifc.Index, d.Objs.SlXdpPrefilter)
		if err != nil {
			return err
		}
		mode = m
		t.Cleanup(func() { l.Close() })
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if mode != ifacemgr.XDPDriver {
		t.Fatalf("veth supports driver-mode XDP, got %s", mode)
	}
	d.Put(d.Objs.SlPrefilterV1, gen.SluicePrefilterKey{Prefixlen: 32, Addr: gen.NetAddr(netip.MustParseAddr("192.0.2.2"))}, gen.SluicePrefilterValue{})
	d.Put(d.Objs.SlFailsafeV1, gen.SluiceFailsafeKey{Proto: 6, Port: gen.NetPort(22)}, gen.SluiceFailsafeValue{})
	bpftest.ServeTCP(t, node, "ssh", ":22")
	bpftest.ServeTCP(t, node, "nodeport", ":30080")

	dial := func(src, dst string) error {
		return outside.Do(func() error {
			dialer := net.Dialer{Timeout: 500 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
			c, err := dialer.Dial("tcp4", dst)
			if err == nil {
				c.Close()
			}
			return err
		})
	}
	if err := dial("192.0.2.2", "192.0.2.1:30080"); err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("denied source reached a NodePort: %v", err)
	}
	if err := dial("192.0.2.2", "192.0.2.1:22"); err != nil {
		t.Fatalf("denied source locked out of the failsafe port: %v", err)
	}
	if err := dial("192.0.2.3", "192.0.2.1:30080"); err != nil {
		t.Fatalf("other source blocked: %v", err)
	}
	if d.Counter(gen.SluiceCounterCNT_XDP_DROP_DENIED) == 0 || d.Counter(gen.SluiceCounterCNT_XDP_PASS_FAILSAFE) == 0 {
		t.Fatal("prefilter counters did not count")
	}
}
