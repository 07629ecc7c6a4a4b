package ifacemgr_test

import (
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/maps"

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

// The XDP modes as the manager applies them: a veth runs the program in
// driver mode and is a redirect target; a bridge (no XDP in its
// driver) runs it in generic mode and is not. With driver mode required, the
// generic attachment is dropped and the device fails, saying why; removing
// the XDP program takes the veth out of the redirect targets.
func TestXDPModesAndRedirectDevices(t *testing.T) {
	e := newMgrEnv(t)
	veth := "data" + bpftest.UniqueName("v")
	dummy := "data" + bpftest.UniqueName("b")
	e.node.Run("ip", "link", "add", veth, "type", "veth", "peer", "name", "p"+veth[1:])
	e.node.Run("ip", "link", "add", dummy, "type", "bridge")
	for _, dev := range []string{veth, "p" + veth[1:], dummy} {
		e.node.Run("ip", "link", "set", dev, "up")
	}
	devices, err := maps.NewMap[uint32, uint32](e.d.Objs.SlXdpdevV1)
	if err != nil {
		t.Fatal(err)
	}
	progs := e.programs(e.d.Objs)
	progs.XDP = e.d.Objs.SlXdpAccel
	manager := func(driverOnly bool) *ifacemgr.Manager {
		m, err := ifacemgr.New(ifacemgr.Options{
			Netns: e.node.Path(), PinDir: e.pinDir, Programs: progs, IfState: e.ifstate,
			Classifier: ifacemgr.Classifier{DataIfaces: regexp.MustCompile("^data")},
			RetryBase:  10 * time.Millisecond, XDPDriverOnly: driverOnly, XDPDevices: devices,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		return m
	}
	modes := func(m *ifacemgr.Manager) map[string]ifacemgr.XDPMode {
		out := map[string]ifacemgr.XDPMode{}
		for _, s := range m.Statuses() {
			out[s.Name] = s.XDPMode
		}
		return out
	}
	targets := func() []uint32 {
		var out []uint32
		if err := devices.Iterate(func(k, _ uint32) bool { out = append(out, k); return true }); err != nil {
			t.Fatal(err)
		}
		slices.Sort(out)
		return out
	}
	vethIdx := uint32(e.ifindex(veth))

	m := manager(false)
	if res := m.Apply(); len(res.Failed) != 0 {
		t.Fatalf("best effort: %v", res.Failed)
	}
	if got := modes(m); got[veth] != ifacemgr.XDPDriver || got[dummy] != ifacemgr.XDPGeneric {
		t.Fatalf("best effort: modes %v, want %s driver and %s generic", got, veth, dummy)
	}
	if got := targets(); !slices.Equal(got, []uint32{vethIdx}) {
		t.Fatalf("redirect targets %v, want only the driver-mode veth %d", got, vethIdx)
	}
	read, err := ifacemgr.ReadInterfaces(e.pinDir, e.ifstate)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range read {
		if want := modes(m)[i.Name]; i.XDPMode != want {
			t.Errorf("ReadInterfaces: %s in %q mode, the manager says %q", i.Name, i.XDPMode, want)
		}
		if i.XDPProgram != "sl_xdp_accel" {
			t.Errorf("ReadInterfaces: %s runs XDP program %q, want sl_xdp_accel", i.Name, i.XDPProgram)
		}
	}
	m.Close()

	// A restart with driver mode required.
	m = manager(true)
	res := m.Apply()
	if err := res.Failed[dummy]; err == nil || !strings.Contains(err.Error(), "driver mode") {
		t.Fatalf("driver only: the bridge's failure is %v, want one naming driver mode", err)
	}
	if _, ok := res.Failed[veth]; ok || !slices.Contains(res.Ready, veth) {
		t.Fatalf("driver only: the veth is not ready: %v", res.Failed)
	}
	if out := e.node.Run("ip", "link", "show", dummy); strings.Contains(out, "xdp") {
		t.Fatalf("driver only: the generic-mode program stays on %s:\n%s", dummy, out)
	}
	// Not ready, but its TC programs are in place: it is still translated.
	if ids := e.progIDs(dummy, ebpf.AttachTCXIngress); !slices.Equal(ids, []ebpf.ProgramID{progID(t, e.d.Objs.SlFromHost)}) {
		t.Fatalf("driver only: %s's ingress programs %v, want sl_from_host", dummy, ids)
	}
	if got := targets(); !slices.Equal(got, []uint32{vethIdx}) {
		t.Fatalf("driver only: redirect targets %v, want %d", got, vethIdx)
	}

	// No XDP program any more: nothing to redirect to.
	noXDP := progs
	noXDP.XDP = nil
	m.SetPrograms(noXDP)
	if res := m.Apply(); res.Failed[veth] != nil {
		t.Fatal(res.Failed[veth])
	}
	if got := targets(); len(got) != 0 {
		t.Fatalf("without XDP: redirect targets %v remain", got)
	}
	if got := modes(m)[veth]; got != "" {
		t.Fatalf("without XDP: %s reported in %q mode", veth, got)
	}
}
