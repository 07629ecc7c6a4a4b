package nat_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
	"github.com/sluice-net/sluice/nat/maglev"
)

// maglevNode is one node: its own pinned maps, programs and syncer.
type maglevNode struct {
	*fixture
	dp *bpftest.Datapath
}

func newMaglevNode(t *testing.T, nodeIP netip.Addr, size int, on bool) *maglevNode {
	return startMaglevNode(t, bpftest.PinDir(t), nodeIP, size, on)
}

// startMaglevNode starts a node on the pins in dir, as a (re)started agent.
func startMaglevNode(t *testing.T, dir string, nodeIP netip.Addr, size int, on bool) *maglevNode {
	f := &fixture{t: t, dir: dir, node: nat.Node{Name: nodeIP.String(), NodePortIPs: []netip.Addr{nodeIP}, AllNodePortIPs: true}}
	f.openMaglev(size, on)
	objs, err := gen.Load(gen.LoadOptions{Maps: f.set.All(), MaglevTableSize: uint32(size)})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	t.Cleanup(func() { objs.Close() })
	opts := nat.Options{Maps: f.set}
	if on {
		opts.Maglev = &nat.MaglevOptions{Tables: objs.SlMaglevV1, TableSize: size}
	}
	if f.s, err = nat.NewSyncer(opts); err != nil {
		t.Fatal(err)
	}
	d := &bpftest.Datapath{TB: t, Objs: objs}
	// The node's address, the source of SNATed flows, and its host IP.
	if nodeIP.Is4() {
		d.Put(objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP)})
	} else {
		d.SetNodeIP6(nodeIP)
	}
	return &maglevNode{fixture: f, dp: d}
}

// openMaglev (re)opens the pinned maps as an agent with (on) or without
// Maglev tables of size slots does; the syncer comes after the programs.
func (f *fixture) openMaglev(size int, on bool) {
	opts := maps.OpenOptions{PinDir: f.dir}
	if on {
		opts.MaglevTableSize = uint32(size)
	}
	set, err := maps.Open(opts)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { set.Close() })
	f.set = set
}

// tables counts the Maglev tables pinned.
func (f *fixture) tables() int {
	f.t.Helper()
	n := 0
	var id, inner uint32
	it := f.set.Map(gen.SluiceMapSlMaglevV1).Iterate()
	for it.Next(&id, &inner) {
		n++
	}
	if err := it.Err(); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// pick sends a SYN from client to the NodePort and returns the backend chosen.
func (n *maglevNode) pick(client, nodePort netip.AddrPort) netip.AddrPort {
	n.t.Helper()
	return n.dp.RunOK(n.dp.Objs.SlFromHost, bpftest.TCPPacket(client, nodePort, bpftest.SYN)).Dst
}

// maglevEndpoints are n endpoints, the first local ones local to this node.
func maglevEndpoints(n, localFrom, localTo int, v6 bool) []nat.Endpoint {
	var out []nat.Endpoint
	for i := range n {
		a := netip.AddrFrom4([4]byte{10, 2, byte(i / 200), byte(1 + i%200)})
		if v6 {
			a = netip.MustParseAddr(fmt.Sprintf("fd00:2::%x", i+1))
		}
		out = append(out, nat.Endpoint{Addr: netip.AddrPortFrom(a, 8080), Ready: true, Serving: true,
			Local: i >= localFrom && i < localTo})
	}
	return out
}

// Two nodes with the same Service, each with other endpoints local (so their
// backend ordinals differ), pick the same backend for every flow from
// outside, whichever node the flow reaches; one backend leaving moves about
// 1/N of the flows; the flows spread evenly. Without Maglev the nodes agree
// on about 1/N of the flows only, which is what shows the test can fail.
func TestMaglevEveryNodePicksTheSameBackend(t *testing.T) {
	for _, fam := range []struct {
		name         string
		clusterIP    string
		nodeA, nodeB netip.Addr
		client       func(i int) netip.Addr
		v6           bool
	}{
		{"IPv4", "10.96.0.10", netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"),
			func(i int) netip.Addr { return netip.AddrFrom4([4]byte{192, 0, 2, byte(i % 250)}) }, false},
		{"IPv6", "fd00:96::10", netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"),
			func(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("2001:db8::%x", i%250+1)) }, true},
	} {
		t.Run(fam.name, func(t *testing.T) {
			const n, flows = 10, 2000
			web := svc("web", fam.clusterIP, 80, func(s *nat.ServicePort) { s.NodePort = 30080 })
			nodes := map[string]*maglevNode{}
			for _, c := range []struct {
				name string
				ip   netip.Addr
				lo   int
				on   bool
			}{{"A", fam.nodeA, 0, true}, {"B", fam.nodeB, 5, true}, {"A random", fam.nodeA, 0, false}} {
				node := newMaglevNode(t, c.ip, maglev.DefaultSize, c.on)
				node.apply([]*nat.ServicePort{web}, map[nat.ServicePortName][]nat.Endpoint{web.Name: maglevEndpoints(n, c.lo, c.lo+3, fam.v6)})
				nodes[c.name] = node
			}
			a, b, random := nodes["A"], nodes["B"], nodes["A random"]
			flow := func(i int) netip.AddrPort { return netip.AddrPortFrom(fam.client(i), uint16(20000+i)) }
			npA, npB := netip.AddrPortFrom(fam.nodeA, 30080), netip.AddrPortFrom(fam.nodeB, 30080)

			first := map[int]netip.AddrPort{}
			perBackend := map[netip.AddrPort]int{}
			agreeRandom := 0
			for i := range flows {
				first[i] = a.pick(flow(i), npA)
				if got := b.pick(flow(i), npB); got != first[i] {
					t.Fatalf("flow %d: node A picked %v, node B %v", i, first[i], got)
				}
				perBackend[first[i]]++
				if random.pick(flow(i), npA) == first[i] {
					agreeRandom++
				}
			}
			t.Logf("random picks agree with Maglev's on %d of %d flows", agreeRandom, flows)
			if agreeRandom > flows/3 {
				t.Fatalf("random picks agree on %d of %d flows: the test cannot tell Maglev from random", agreeRandom, flows)
			}
			most := 0
			for _, c := range perBackend {
				most = max(most, c)
			}
			if len(perBackend) != n || float64(most) > 1.3*flows/n {
				t.Fatalf("%d flows over %d backends: %v", flows, len(perBackend), perBackend)
			}

			// One backend leaves, on both nodes; new flows from the same
			// clients (their old conntrack entries removed, as a client's
			// new connection from the same port would be after them).
			gone := maglevEndpoints(n, 0, 3, fam.v6)[7].Addr
			for node, lo := range map[*maglevNode]int{a: 0, b: 5} {
				left := maglevEndpoints(n, lo, lo+3, fam.v6)
				left = append(left[:7], left[8:]...)
				node.apply([]*nat.ServicePort{web}, map[nat.ServicePortName][]nat.Endpoint{web.Name: left})
				node.dp.ClearConntrack()
			}
			moved, others := 0, 0
			for i := range flows {
				got := a.pick(flow(i), npA)
				if got2 := b.pick(flow(i), npB); got2 != got {
					t.Fatalf("after a backend left, flow %d: node A picked %v, node B %v", i, got, got2)
				}
				if got == gone {
					t.Fatalf("flow %d went to the backend that left", i)
				}
				if got != first[i] {
					moved++
					if first[i] != gone {
						others++
					}
				}
			}
			t.Logf("one of %d backends left: %d of %d flows moved, %d of them from the backends that stayed", n, moved, flows, others)
			// The leaver's flows all move; of the others, Maglev moves a
			// few (6% of 1/N at this size: nat/maglev's test).
			if others > flows/40 {
				t.Fatalf("%d flows of the backends that stayed moved", others)
			}
		})
	}
}

// A table exists exactly while its service has cluster endpoints; external
// frontends carry FE_MAGLEV, a ClusterIP only with MaglevOptions.ClusterIP.
func TestMaglevTablesFollowServices(t *testing.T) {
	for _, clusterIP := range []bool{false, true} {
		t.Run(fmt.Sprintf("ClusterIP=%v", clusterIP), func(t *testing.T) {
			node := newMaglevNode(t, netip.MustParseAddr("10.0.0.1"), 251, true)
			var err error
			node.s, err = nat.NewSyncer(nat.Options{Maps: node.set,
				Maglev: &nat.MaglevOptions{Tables: node.dp.Objs.SlMaglevV1, TableSize: 251, ClusterIP: clusterIP}})
			if err != nil {
				t.Fatal(err)
			}
			web := svc("web", "10.96.0.10", 80, func(s *nat.ServicePort) {
				s.NodePort = 30080
				s.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.7")}
			})
			node.apply([]*nat.ServicePort{web}, map[nat.ServicePortName][]nat.Endpoint{web.Name: eps("10.2.0.1:8080", "10.2.0.2:8080")})
			if n := node.tables(); n != 1 {
				t.Fatalf("%d tables for one service", n)
			}
			for key, fe := range node.frontends() {
				if fe.SvcId == 0 {
					continue // a service IP's echo marker
				}
				want := fe.Flags&gen.SluiceFeFlagsFE_EXTERNAL != 0 || clusterIP
				if got := fe.Flags&gen.SluiceFeFlagsFE_MAGLEV != 0; got != want {
					t.Errorf("frontend %s: FE_MAGLEV %v, want %v", key, got, want)
				}
			}
			node.apply([]*nat.ServicePort{web}, map[nat.ServicePortName][]nat.Endpoint{web.Name: nil})
			if n := node.tables(); n != 0 {
				t.Fatalf("%d tables for a service without endpoints", n)
			}
			node.apply([]*nat.ServicePort{web}, map[nat.ServicePortName][]nat.Endpoint{web.Name: eps("10.2.0.1:8080")})
			node.apply(nil, nil)
			if n := node.tables(); n != 0 {
				t.Fatalf("%d tables after the service was deleted", n)
			}
		})
	}
}

// innerTables maps each service id to the id of the table map it has.
func (f *fixture) innerTables() map[uint32]uint32 {
	f.t.Helper()
	out := map[uint32]uint32{}
	var id, inner uint32
	it := f.set.Map(gen.SluiceMapSlMaglevV1).Iterate()
	for it.Next(&id, &inner) {
		out[id] = inner
	}
	if err := it.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// A table is built and written again only when its Service's cluster
// backends change: a node address change plans every Service again, and
// must not rebuild 16,381 slots per Service (4 s of CPU at 10,000 Services
// × 100 backends) nor replace their maps.
func TestMaglevTablesReusedWhileBackendsStay(t *testing.T) {
	node := newMaglevNode(t, netip.MustParseAddr("10.0.0.1"), 251, true)
	web := svc("web", "10.96.0.10", 80, func(s *nat.ServicePort) { s.NodePort = 30080 })
	endpoints := map[nat.ServicePortName][]nat.Endpoint{web.Name: eps("10.2.0.1:8080", "10.2.0.2:8080")}
	if st := node.apply([]*nat.ServicePort{web}, endpoints); st.MaglevTablesBuilt != 1 {
		t.Fatalf("%d tables built for one Service", st.MaglevTablesBuilt)
	}
	before := node.innerTables()
	if len(before) != 1 {
		t.Fatalf("tables %v, want one", before)
	}

	// Another node address: every Service is planned again.
	node.node.NodePortIPs = append(node.node.NodePortIPs, netip.MustParseAddr("10.0.0.2"))
	st := node.apply([]*nat.ServicePort{web}, endpoints)
	if after := node.innerTables(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("tables %v after a node address change, were %v: rebuilt", after, before)
	}
	if st.Writes == 0 {
		t.Fatal("the new node address's frontends were not written")
	}
	if st.MaglevTablesBuilt != 0 {
		t.Fatalf("%d tables built after a node address change, want 0 (reused)", st.MaglevTablesBuilt)
	}
	if got := node.pick(netip.MustParseAddrPort("198.51.100.9:40000"), netip.MustParseAddrPort("10.0.0.2:30080")); !got.IsValid() {
		t.Fatal("no pick through the new address")
	}

	// A backend more: a new table.
	endpoints[web.Name] = eps("10.2.0.1:8080", "10.2.0.2:8080", "10.2.0.3:8080")
	if st := node.apply([]*nat.ServicePort{web}, endpoints); st.MaglevTablesBuilt != 1 {
		t.Fatalf("%d tables built after a backend joined, want 1", st.MaglevTablesBuilt)
	}
	after := node.innerTables()
	for id, inner := range before {
		if after[id] == inner {
			t.Fatalf("service id %d kept table map %d after its backends changed", id, inner)
		}
	}
}

// The tables are pinned: a restarted agent's programs pick from them at once,
// and its syncer rewrites them (and drops those of services gone meanwhile).
// Started with another size, or without Maglev, it starts from no tables.
func TestMaglevTablesSurviveARestart(t *testing.T) {
	node := newMaglevNode(t, netip.MustParseAddr("10.0.0.1"), 251, true)
	a, b := svc("a", "10.96.0.10", 80, func(s *nat.ServicePort) { s.NodePort = 30080 }), svc("b", "10.96.0.11", 80, func(s *nat.ServicePort) { s.NodePort = 30081 })
	all := map[nat.ServicePortName][]nat.Endpoint{a.Name: maglevEndpoints(5, 0, 0, false), b.Name: eps("10.2.0.9:8080")}
	node.apply([]*nat.ServicePort{a, b}, all)
	np := netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), 30080)
	client := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), uint16(30000+i))
	}
	var before []netip.AddrPort
	for i := range 50 {
		before = append(before, node.pick(client(i), np))
	}

	// The restart: new map handles and programs; no sync yet.
	node.set.Close()
	node = startMaglevNode(t, node.dir, netip.MustParseAddr("10.0.0.1"), 251, true)
	if n := node.tables(); n != 2 {
		t.Fatalf("%d tables pinned after the restart, want 2", n)
	}
	node.dp.ClearConntrack()
	for i := range 50 {
		if got := node.pick(client(i), np); got != before[i] {
			t.Fatalf("before the first sync after the restart, flow %d went to %v, not %v", i, got, before[i])
		}
	}
	// The first sync rewrites a's table and drops b's: b is gone.
	node.apply([]*nat.ServicePort{a}, map[nat.ServicePortName][]nat.Endpoint{a.Name: all[a.Name]})
	if n := node.tables(); n != 1 {
		t.Fatalf("%d tables after the first sync, want 1", n)
	}
	node.dp.ClearConntrack()
	for i := range 50 {
		if got := node.pick(client(i), np); got != before[i] {
			t.Fatalf("after the first sync, flow %d went to %v, not %v", i, got, before[i])
		}
	}

	for _, restart := range []struct {
		name string
		size int
		on   bool
	}{{"another size", 4093, true}, {"Maglev off", 0, false}} {
		node.set.Close()
		node = startMaglevNode(t, node.dir, netip.MustParseAddr("10.0.0.1"), restart.size, restart.on)
		if n := node.tables(); n != 0 {
			t.Fatalf("restarted with %s: %d tables pinned", restart.name, n)
		}
	}
}

// internalTrafficPolicy Local without external destinations keeps no
// cluster set: no table, whatever its endpoints.
func TestMaglevNoTableWithoutAClusterSet(t *testing.T) {
	node := newMaglevNode(t, netip.MustParseAddr("10.0.0.1"), 251, true)
	var err error
	node.s, err = nat.NewSyncer(nat.Options{Maps: node.set,
		Maglev: &nat.MaglevOptions{Tables: node.dp.Objs.SlMaglevV1, TableSize: 251, ClusterIP: true}})
	if err != nil {
		t.Fatal(err)
	}
	local := svc("local", "10.96.0.12", 80, func(s *nat.ServicePort) { s.InternalPolicy = nat.PolicyLocal })
	stats := node.apply([]*nat.ServicePort{local}, map[nat.ServicePortName][]nat.Endpoint{local.Name: eps("10.2.0.1:8080", "10.2.0.2:8080")})
	if len(stats.Errors) != 0 || node.tables() != 0 {
		t.Fatalf("errors %v, %d tables", stats.Errors, node.tables())
	}
}

func TestMaglevTableSizeMustBeAPrime(t *testing.T) {
	node := newMaglevNode(t, netip.MustParseAddr("10.0.0.1"), 251, false)
	_, err := nat.NewSyncer(nat.Options{Maps: node.set, Maglev: &nat.MaglevOptions{Tables: node.dp.Objs.SlMaglevV1, TableSize: 1000}})
	if err == nil || !strings.Contains(err.Error(), "not a prime") {
		t.Fatalf("table size 1000: %v", err)
	}
}

// A full table map refuses a service's table: the Apply reports it degraded,
// naming the map, and programs everything else; that service picks at random.
func TestMaglevTablesMapFull(t *testing.T) {
	f := &fixture{t: t, dir: bpftest.PinDir(t), node: nat.Node{Name: "n", NodePortIPs: []netip.Addr{nodeIP}, AllNodePortIPs: true}}
	set, err := maps.Open(maps.OpenOptions{PinDir: f.dir, MaglevTableSize: 251, Capacity: map[string]uint32{gen.SluiceMapSlMaglevV1: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	objs, err := gen.Load(gen.LoadOptions{Maps: set.All(), MaglevTableSize: 251})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	t.Cleanup(func() { objs.Close() })
	f.set = set
	if f.s, err = nat.NewSyncer(nat.Options{Maps: set, Maglev: &nat.MaglevOptions{Tables: objs.SlMaglevV1, TableSize: 251}}); err != nil {
		t.Fatal(err)
	}
	a, b := svc("a", "10.96.0.10", 80, func(s *nat.ServicePort) { s.NodePort = 30080 }), svc("b", "10.96.0.11", 80, func(s *nat.ServicePort) { s.NodePort = 30081 })
	st := nat.State{Node: f.node, Services: map[nat.ServicePortName]*nat.ServicePort{a.Name: a, b.Name: b},
		Endpoints: map[nat.ServicePortName][]nat.Endpoint{a.Name: eps("10.2.0.1:8080"), b.Name: eps("10.2.0.2:8080")}}
	stats, err := f.s.Apply(st)
	var full *maps.FullError
	if err != nil || !errors.As(errors.Join(stats.Degraded...), &full) || full.Map != gen.SluiceMapSlMaglevV1 ||
		!slices.Contains(stats.FullMaps, gen.SluiceMapSlMaglevV1) {
		t.Fatalf("Apply with the table map full: %v, degraded %v (full maps %v)", err, stats.Degraded, stats.FullMaps)
	}
	if n := f.tables(); n != 1 {
		t.Fatalf("%d tables in a map of 1", n)
	}
	d := &bpftest.Datapath{TB: t, Objs: objs}
	d.Put(objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP)})
	for _, port := range []uint16{30080, 30081} {
		out := d.RunOK(objs.SlFromHost, bpftest.TCPPacket(netip.MustParseAddrPort("192.0.2.1:5555"), netip.AddrPortFrom(nodeIP, port), bpftest.SYN))
		if !out.Dst.Addr().IsPrivate() {
			t.Fatalf("NodePort %d: SYN left for %v, not a backend", port, out.Dst)
		}
	}
	// The next Apply tries again, and says so again, as long as it is full.
	if stats, err := f.s.Apply(st); err != nil || !errors.As(errors.Join(stats.Degraded...), &full) {
		t.Fatalf("second Apply: %v, degraded %v", err, stats.Degraded)
	}
}
