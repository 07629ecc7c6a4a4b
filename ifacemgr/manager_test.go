package ifacemgr_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/ifacemgr"
	"github.com/sluice-net/sluice/maps"
)

type mgrEnv struct {
	t       *testing.T
	d       *bpftest.Datapath
	node    *bpftest.NetNS
	pinDir  string
	ifstate *maps.Map[gen.SluiceIfstateKey, gen.SluiceIfstateValue]
}

func newMgrEnv(t *testing.T) *mgrEnv {
	e := &mgrEnv{t: t, d: bpftest.NewDatapath(t, netip.MustParseAddr("10.0.0.1")), node: bpftest.NewNetNS(t)}
	e.pinDir = filepath.Join(bpftest.PinDir(t), "links")
	var err error
	if e.ifstate, err = maps.NewMap[gen.SluiceIfstateKey, gen.SluiceIfstateValue](e.d.Objs.SlIfstateV1); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *mgrEnv) programs(o *gen.SluiceObjects) ifacemgr.Programs {
	return ifacemgr.Programs{FromWorkload: o.SlFromWl, ToWorkload: o.SlToWl, FromHost: o.SlFromHost, ToHost: o.SlToHost,
		FromHostL3: o.SlFromHostL3, ToHostL3: o.SlToHostL3}
}

func (e *mgrEnv) manager(p ifacemgr.Programs) *ifacemgr.Manager {
	e.t.Helper()
	m, err := ifacemgr.New(ifacemgr.Options{
		Netns: e.node.Path(), PinDir: e.pinDir, Programs: p, IfState: e.ifstate, Sysctls: true,
		Classifier: ifacemgr.Classifier{WorkloadPrefixes: []string{"slv"}, DataIfaces: regexp.MustCompile("^data")},
		RetryBase:  10 * time.Millisecond, ResyncInterval: 50 * time.Millisecond,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(m.Close)
	return m
}

// progIDs lists the programs attached to a hook of an interface of the node.
func (e *mgrEnv) progIDs(iface string, at ebpf.AttachType) []ebpf.ProgramID {
	e.t.Helper()
	var ids []ebpf.ProgramID
	err := e.node.Do(func() error {
		ifc, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: ifc.Index, Attach: at})
		if err != nil {
			return err
		}
		for _, p := range res.Programs {
			ids = append(ids, p.ID)
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

func progID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

func (e *mgrEnv) ifindex(name string) int {
	var idx int
	if err := e.node.Do(func() error {
		ifc, err := net.InterfaceByName(name)
		if ifc != nil {
			idx = ifc.Index
		}
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	return idx
}

func (e *mgrEnv) pins() []string {
	entries, _ := os.ReadDir(e.pinDir)
	var names []string
	for _, x := range entries {
		names = append(names, x.Name())
	}
	return names
}

func (e *mgrEnv) hasIfState(ifindex int) bool {
	_, err := e.ifstate.Get(gen.SluiceIfstateKey{Ifindex: uint32(ifindex)})
	return err == nil
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// The manager runs with its netlink subscriptions: interfaces that appear get
// their programs, vanish and leave nothing, come back and are handled.
func TestInterfacesComeAndGo(t *testing.T) {
	e := newMgrEnv(t)
	m := e.manager(e.programs(e.d.Objs))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx)
	fromWl := progID(t, e.d.Objs.SlFromWl)

	pod := bpftest.NewNetNS(t)
	v := bpftest.NewVeth(t, e.node, pod)
	eventually(t, "programs on a new interface", func() bool {
		return slices.Contains(e.progIDs(v.Name, ebpf.AttachTCXIngress), fromWl)
	})
	idx := e.ifindex(v.Name)
	eventually(t, "interface-state entry", func() bool { return e.hasIfState(idx) })
	st, _ := e.ifstate.Get(gen.SluiceIfstateKey{Ifindex: uint32(idx)})
	if st.Flags != gen.SluiceIfstateFlagsIFS_WORKLOAD|gen.SluiceIfstateFlagsIFS_READY || st.IngressPolicy != ifacemgr.NoPolicy {
		t.Fatalf("interface state %+v", st)
	}
	// The per-interface settings were made.
	if out := e.node.Run("sysctl", "-n", "net.ipv4.conf."+v.Name+".accept_local"); strings.TrimSpace(out) != "1" {
		t.Fatalf("accept_local on %s = %q", v.Name, out)
	}

	// Deleted: its state and pins go.
	e.node.Run("ip", "link", "del", v.Name)
	eventually(t, "state and pins of a deleted interface gone", func() bool {
		return !e.hasIfState(idx) && len(e.pins()) == 0
	})

	// Re-created with the same name: a new ifindex, handled afresh.
	e.node.Run("ip", "link", "add", v.Name, "type", "veth", "peer", "name", "p"+v.Name[1:])
	e.node.Run("ip", "link", "set", v.Name, "up")
	eventually(t, "programs on the re-created interface", func() bool {
		i := e.ifindex(v.Name)
		return i != idx && e.hasIfState(i) && slices.Contains(e.progIDs(v.Name, ebpf.AttachTCXIngress), fromWl)
	})

	// Renamed to another workload name: pins follow the new name.
	idx = e.ifindex(v.Name)
	renamed := "slvren" + v.Name[len(v.Name)-4:]
	e.node.Run("ip", "link", "set", v.Name, "down")
	e.node.Run("ip", "link", "set", v.Name, "name", renamed)
	e.node.Run("ip", "link", "set", renamed, "up")
	eventually(t, "pins under the new name only", func() bool {
		p := e.pins()
		return len(p) == 2 && strings.HasSuffix(p[0], "_"+renamed) && strings.HasSuffix(p[1], "_"+renamed)
	})
	if ids := e.progIDs(renamed, ebpf.AttachTCXIngress); len(ids) != 1 {
		t.Fatalf("renamed interface has %d ingress programs, want exactly ours", len(ids))
	}
	// Renamed out of the workload prefixes: left alone.
	e.node.Run("ip", "link", "set", renamed, "down")
	e.node.Run("ip", "link", "set", renamed, "name", "other0")
	eventually(t, "programs removed from an interface no longer managed", func() bool {
		return len(e.progIDs("other0", ebpf.AttachTCXIngress)) == 0 && !e.hasIfState(idx) && len(e.pins()) == 0
	})
}

func TestForeignProgramSurvivesAttachAndDetach(t *testing.T) {
	e := newMgrEnv(t)
	v := bpftest.NewVeth(t, e.node, bpftest.NewNetNS(t))
	// Someone else's program on the same hook, attached first: one that
	// lets every packet pass.
	other, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "foreign", Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}}) // TC_ACT_UNSPEC: the next program decides
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := e.node.Do(func() error {
		l, err := link.AttachTCX(link.TCXOptions{Interface: e.ifindex(v.Name), Program: other, Attach: ebpf.AttachTCXIngress})
		if err == nil {
			t.Cleanup(func() { l.Close() })
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	foreign := progID(t, other)

	m := e.manager(e.programs(e.d.Objs))
	if res := m.Apply(); len(res.Failed) != 0 {
		t.Fatal(res.Failed)
	}
	ids := e.progIDs(v.Name, ebpf.AttachTCXIngress)
	if len(ids) != 2 || ids[0] != progID(t, e.d.Objs.SlFromWl) || ids[1] != foreign {
		t.Fatalf("ingress programs %v: want ours first, then the foreign one", ids)
	}
	if err := m.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if ids := e.progIDs(v.Name, ebpf.AttachTCXIngress); len(ids) != 1 || ids[0] != foreign {
		t.Fatalf("after cleanup %v: want only the foreign program", ids)
	}
	if len(e.pins()) != 0 || e.hasIfState(e.ifindex(v.Name)) {
		t.Fatal("cleanup left pins or state")
	}
}

func TestRestartKeepsWhatIsRightAndFixesWhatIsWrong(t *testing.T) {
	e := newMgrEnv(t)
	var vs []bpftest.Veth
	for range 3 {
		vs = append(vs, bpftest.NewVeth(t, e.node, bpftest.NewNetNS(t)))
	}
	// The agent's programs use the pinned maps: a restarted agent loads new
	// instances of the same code on the same maps.
	set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	objs1, err := gen.Load(gen.LoadOptions{Maps: set.All()})
	if err != nil {
		t.Fatal(err)
	}
	defer objs1.Close()
	m1 := e.manager(e.programs(objs1))
	if res := m1.Apply(); res.Attached != 6 || len(res.Ready) != 3 {
		t.Fatalf("first start: %+v", res)
	}
	before := e.progIDs(vs[0].Name, ebpf.AttachTCXIngress)
	m1.Close()

	// A new process: programs loaded again (same code, new instances), same pins.
	objs2, err := gen.Load(gen.LoadOptions{Maps: set.All()})
	if err != nil {
		t.Fatal(err)
	}
	defer objs2.Close()
	m2 := e.manager(e.programs(objs2))
	// Something went wrong meanwhile: one attachment is gone.
	brokenPin := filepath.Join(e.pinDir, fmt.Sprintf("%d_egress_%s", e.ifindex(vs[1].Name), vs[1].Name))
	l, err := link.LoadPinnedLink(brokenPin, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Unpin()
	l.Close()
	if len(e.progIDs(vs[1].Name, ebpf.AttachTCXEgress)) != 0 {
		t.Fatal("could not break the attachment")
	}

	res := m2.Apply()
	if res.Attached != 1 || len(res.Ready) != 3 || len(res.Failed) != 0 {
		t.Fatalf("restart: %+v, want exactly the broken hook re-attached", res)
	}
	if after := e.progIDs(vs[0].Name, ebpf.AttachTCXIngress); !slices.Equal(after, before) {
		t.Fatalf("a right attachment was touched: %v -> %v", before, after)
	}
}

func TestFailingAttachIsRetriedAndReported(t *testing.T) {
	e := newMgrEnv(t)
	v := bpftest.NewVeth(t, e.node, bpftest.NewNetNS(t))
	bad := e.programs(e.d.Objs)
	bad.FromWorkload = e.d.Objs.SlXdpPrefilter // not a TC program: the kernel refuses it
	m := e.manager(bad)
	res := m.Apply()
	if err := res.Failed[v.Name]; err == nil || !strings.Contains(err.Error(), v.Name) {
		t.Fatalf("failed attach not reported: %+v", res)
	}
	if st := m.Statuses(); len(st) != 1 || st[0].Ready || st[0].Err == nil {
		t.Fatalf("status %+v", st)
	}
	// Once its retry time has come, the fixed programs go on.
	m.SetPrograms(e.programs(e.d.Objs))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		res := m.Apply()
		if len(res.Failed) == 0 && slices.Contains(res.Ready, v.Name) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("retry: %+v", res)
		}
	}
}

func TestLegacyTCAttach(t *testing.T) {
	e := newMgrEnv(t)
	v := bpftest.NewVeth(t, e.node, bpftest.NewNetNS(t))
	m, err := ifacemgr.New(ifacemgr.Options{Netns: e.node.Path(), PinDir: e.pinDir,
		Programs: e.programs(e.d.Objs), LegacyTC: true,
		Classifier: ifacemgr.Classifier{WorkloadPrefixes: []string{"slv"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if res := m.Apply(); res.Attached != 2 || len(res.Failed) != 0 {
		t.Fatalf("%+v", res)
	}
	out := e.node.Run("tc", "filter", "show", "dev", v.Name, "ingress")
	if !strings.Contains(out, "sluice-ingress") || !strings.Contains(out, "direct-action") {
		t.Fatalf("no cls_bpf filter: %s", out)
	}
	if res := m.Apply(); res.Attached != 0 {
		t.Fatalf("second apply re-attached: %+v", res)
	}
	if err := m.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if out := e.node.Run("tc", "filter", "show", "dev", v.Name, "ingress"); strings.Contains(out, "sluice") {
		t.Fatalf("filter left after cleanup: %s", out)
	}
}

// A device whose packets carry no Ethernet header (TUN here; ipip and
// WireGuard are alike) gets the L3 builds of the host programs, decided by
// its link type, not its name; an Ethernet device of the same class keeps the
// Ethernet builds. Without L3 programs the device is refused, never given
// programs that misparse it.
func TestDevicesWithoutEthernetGetTheL3Programs(t *testing.T) {
	e := newMgrEnv(t)
	tunnel := "data" + bpftest.UniqueName("t")
	eth := "data" + bpftest.UniqueName("e")
	e.node.Run("ip", "tuntap", "add", "dev", tunnel, "mode", "tun")
	e.node.Run("ip", "link", "add", eth, "type", "veth", "peer", "name", "p"+eth[1:])
	for _, dev := range []string{tunnel, eth} {
		e.node.Run("ip", "link", "set", dev, "up")
	}

	m := e.manager(e.programs(e.d.Objs))
	if res := m.Apply(); len(res.Failed) != 0 {
		t.Fatalf("apply: %v", res.Failed)
	}
	if ids := e.progIDs(tunnel, ebpf.AttachTCXIngress); !slices.Equal(ids, []ebpf.ProgramID{progID(t, e.d.Objs.SlFromHostL3)}) {
		t.Fatalf("TUN device ingress programs %v, want sl_from_host_l3", ids)
	}
	if ids := e.progIDs(tunnel, ebpf.AttachTCXEgress); !slices.Equal(ids, []ebpf.ProgramID{progID(t, e.d.Objs.SlToHostL3)}) {
		t.Fatalf("TUN device egress programs %v, want sl_to_host_l3", ids)
	}
	if ids := e.progIDs(eth, ebpf.AttachTCXIngress); !slices.Equal(ids, []ebpf.ProgramID{progID(t, e.d.Objs.SlFromHost)}) {
		t.Fatalf("Ethernet device ingress programs %v, want sl_from_host", ids)
	}

	// A manager without L3 programs refuses the device and says why.
	e2 := newMgrEnv(t)
	e2.node.Run("ip", "tuntap", "add", "dev", tunnel, "mode", "tun")
	e2.node.Run("ip", "link", "set", tunnel, "up")
	noL3 := e2.programs(e2.d.Objs)
	noL3.FromHostL3, noL3.ToHostL3 = nil, nil
	res := e2.manager(noL3).Apply()
	if err := res.Failed[tunnel]; err == nil || !strings.Contains(err.Error(), "Ethernet header") {
		t.Fatalf("TUN device without L3 programs: %v", res.Failed)
	}
	if ids := e2.progIDs(tunnel, ebpf.AttachTCXIngress); len(ids) != 0 {
		t.Fatalf("TUN device got programs %v", ids)
	}
}

// Programs with the same code but other maps are not adopted: after a map pin
// was removed and the agent restarted, the attached programs still read the
// orphaned map while the agent writes a new one. Every hook is moved to the
// programs that use the agent's maps.
func TestRestartReplacesProgramsReadingOtherMaps(t *testing.T) {
	e := newMgrEnv(t)
	v := bpftest.NewVeth(t, e.node, bpftest.NewNetNS(t))
	m1 := e.manager(e.programs(e.d.Objs))
	if res := m1.Apply(); res.Attached != 2 {
		t.Fatalf("first start: %+v", res)
	}
	m1.Close()
	fresh, err := gen.Load(gen.LoadOptions{}) // the same code on maps of its own
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	m2 := e.manager(e.programs(fresh))
	if res := m2.Apply(); res.Attached != 2 || len(res.Failed) != 0 {
		t.Fatalf("restart on other maps: %+v, want both hooks moved", res)
	}
	if ids := e.progIDs(v.Name, ebpf.AttachTCXIngress); !slices.Equal(ids, []ebpf.ProgramID{progID(t, fresh.SlFromWl)}) {
		t.Fatalf("ingress runs %v, want the program on the agent's maps", ids)
	}
}

// A link pin removed behind the manager's back detaches its hook without a
// netlink event: the periodic check finds it and attaches the program again.
func TestRemovedLinkPinIsRepaired(t *testing.T) {
	e := newMgrEnv(t)
	m := e.manager(e.programs(e.d.Objs))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx)
	v := bpftest.NewVeth(t, e.node, bpftest.NewNetNS(t))
	fromWl := progID(t, e.d.Objs.SlFromWl)
	eventually(t, "programs attached", func() bool { return slices.Contains(e.progIDs(v.Name, ebpf.AttachTCXIngress), fromWl) })
	pin := filepath.Join(e.pinDir, fmt.Sprintf("%d_ingress_%s", e.ifindex(v.Name), v.Name))
	if err := os.Remove(pin); err != nil {
		t.Fatal(err)
	}
	// Without the pin the link is gone (nothing else holds it); the repair
	// attaches and pins it again.
	eventually(t, "the hook repaired and pinned again", func() bool {
		_, err := os.Stat(pin)
		return err == nil && slices.Contains(e.progIDs(v.Name, ebpf.AttachTCXIngress), fromWl)
	})
}

// The routing generation is 0 until Run follows the node's routes, then
// moves with every route change (a pod's address routed elsewhere), so that
// what was derived from the routes is known to stand while it does not.
func TestRoutingGenerationMovesWithRoutes(t *testing.T) {
	e := newMgrEnv(t)
	// No resync within the test: only events move the generation.
	m, err := ifacemgr.New(ifacemgr.Options{Netns: e.node.Path(), PinDir: e.pinDir, Programs: e.programs(e.d.Objs), IfState: e.ifstate,
		Classifier: ifacemgr.Classifier{WorkloadPrefixes: []string{"slv"}}, ResyncInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	if g := m.RoutingGeneration(); g != 0 {
		t.Fatalf("generation %d before Run follows anything", g)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx)
	eventually(t, "Run following the routes", func() bool { return m.RoutingGeneration() != 0 })
	pod := bpftest.NewNetNS(t)
	v := bpftest.NewVeth(t, e.node, pod)
	e.node.Run("ip", "link", "set", v.Name, "up")
	eventually(t, "the new interface handled", func() bool { return e.hasIfState(e.ifindex(v.Name)) })
	// The new link's own routes (IPv6 link-local, after address
	// detection) come and go for a while: wait until nothing moves it.
	before := m.RoutingGeneration()
	eventually(t, "the routes settled", func() bool {
		time.Sleep(300 * time.Millisecond)
		now := m.RoutingGeneration()
		settled := now == before
		before = now
		return settled
	})
	e.node.Run("ip", "route", "add", "10.250.0.7/32", "dev", v.Name)
	eventually(t, "a route added moves the generation", func() bool { return m.RoutingGeneration() != before })
	before = m.RoutingGeneration()
	e.node.Run("ip", "route", "del", "10.250.0.7/32", "dev", v.Name)
	eventually(t, "a route deleted moves the generation", func() bool { return m.RoutingGeneration() != before })
}
