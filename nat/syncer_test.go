package nat_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
)

var nodeIP = netip.MustParseAddr("10.0.0.1")

type fixture struct {
	t    *testing.T
	dir  string
	set  *maps.Set
	s    *nat.Syncer
	node nat.Node
	// serviceCIDRs go into every apply's State.
	serviceCIDRs []netip.Prefix
}

func newFixture(t *testing.T, opts nat.Options) *fixture {
	dir := bpftest.PinDir(t)
	f := &fixture{t: t, dir: dir, node: nat.Node{Name: "node-a", Zone: "zone-a", NodePortIPs: []netip.Addr{nodeIP}, AllNodePortIPs: true}}
	f.open(opts)
	return f
}

// open (re)opens the pinned maps and a fresh syncer, as a restarted agent would.
func (f *fixture) open(opts nat.Options) {
	set, err := maps.Open(maps.OpenOptions{PinDir: f.dir})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { set.Close() })
	opts.Maps = set
	s, err := nat.NewSyncer(opts)
	if err != nil {
		f.t.Fatal(err)
	}
	f.set, f.s = set, s
}

func (f *fixture) apply(svcs []*nat.ServicePort, eps map[nat.ServicePortName][]nat.Endpoint) nat.Stats {
	f.t.Helper()
	st := nat.State{Node: f.node, Services: map[nat.ServicePortName]*nat.ServicePort{}, Endpoints: eps, ServiceCIDRs: f.serviceCIDRs}
	for _, s := range svcs {
		st.Services[s.Name] = s
	}
	stats, err := f.s.Apply(st)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, e := range stats.Errors {
		f.t.Logf("service error: %v", e)
	}
	return stats
}

// frontends reads the frontend map back, keyed "ip:port/proto".
func (f *fixture) frontends() map[string]gen.SluiceFeValue {
	m, err := maps.Frontends.In(f.set)
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]gen.SluiceFeValue{}
	err = m.Iterate(func(k gen.SluiceFeKey, v gen.SluiceFeValue) bool {
		out[fmt.Sprintf("%v:%d/%d", gen.AddrFromNet(k.Addr), gen.PortFromNet(k.Port), k.Proto)] = v
		return true
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

// backends reads the backends of one service id, by ordinal.
func (f *fixture) backends(id uint32) []string {
	m, err := maps.Backends.In(f.set)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for i := uint32(0); ; i++ {
		v, err := m.Get(gen.SluiceBeKey{SvcId: id, Ordinal: i})
		if errors.Is(err, maps.ErrKeyNotExist) {
			return out
		}
		if err != nil {
			f.t.Fatal(err)
		}
		s := netip.AddrPortFrom(gen.AddrFromNet(v.Addr), gen.PortFromNet(v.Port)).String()
		if v.Flags&gen.SluiceBeFlagsBE_LOCAL != 0 {
			s += " local"
		}
		out = append(out, s)
	}
}

func (f *fixture) srcRangeCount() int {
	m, err := maps.SrcRanges.In(f.set)
	if err != nil {
		f.t.Fatal(err)
	}
	n := 0
	m.Iterate(func(gen.SluiceSrcrangeKey, gen.SluiceSrcrangeValue) bool { n++; return true })
	return n
}

func svc(name, ip string, port uint16, mods ...func(*nat.ServicePort)) *nat.ServicePort {
	addr := netip.MustParseAddr(ip)
	s := &nat.ServicePort{Name: nat.ServicePortName{Namespace: "default", Name: name, Port: "p", IPv6: addr.Is6()},
		ClusterIP: addr, Port: port, Protocol: nat.TCP}
	for _, m := range mods {
		m(s)
	}
	return s
}

func eps(addrs ...string) []nat.Endpoint {
	var out []nat.Endpoint
	for _, a := range addrs {
		local := strings.HasSuffix(a, "@local")
		a = strings.TrimSuffix(a, "@local")
		out = append(out, nat.Endpoint{Addr: netip.MustParseAddrPort(a), Ready: true, Serving: true, Local: local})
	}
	return out
}

func wantEqual[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: %v, want %v", what, got, want)
	}
}

func TestSyncerProgramsServicesExactly(t *testing.T) {
	f := newFixture(t, nat.Options{})
	web := svc("web", "10.96.0.10", 80, func(s *nat.ServicePort) { s.NodePort = 30080 })
	dns := svc("dns", "10.96.0.53", 53, func(s *nat.ServicePort) { s.Protocol = nat.UDP; s.AffinityTimeout = 60 })
	e := map[nat.ServicePortName][]nat.Endpoint{
		web.Name: eps("10.2.0.8:8080", "10.2.0.7:8080@local"),
		dns.Name: eps("10.2.0.9:53"),
	}
	st := f.apply([]*nat.ServicePort{web, dns}, e)
	if len(st.Errors) != 0 || st.Services != 2 {
		t.Fatalf("stats %+v", st)
	}

	fe := f.frontends()
	webID, _ := f.s.ServiceID(web.Name)
	dnsID, _ := f.s.ServiceID(dns.Name)
	wantFE := map[string]gen.SluiceFeValue{
		// Both policies Cluster: kube-proxy keeps no local set, so no local count.
		"10.96.0.10:80/6":         {SvcId: webID, Count: 2},
		"10.0.0.1:30080/6":        {SvcId: webID, Count: 2, Flags: gen.SluiceFeFlagsFE_EXTERNAL},
		"255.255.255.255:30080/6": {SvcId: webID, Count: 2, Flags: gen.SluiceFeFlagsFE_EXTERNAL},
		"10.96.0.53:53/17":        {SvcId: dnsID, Count: 1, AffinityTimeout: 60},
		"10.96.0.10:0/1":          {}, // echo markers of the service IPs
		"10.96.0.53:0/1":          {},
	}
	if len(fe) != len(wantFE) {
		t.Fatalf("frontends %v, want %v", fe, wantFE)
	}
	for k, v := range wantFE {
		if fe[k] != v {
			t.Errorf("frontend %s: %+v, want %+v", k, fe[k], v)
		}
	}
	// Backends in a stable order.
	if got := f.backends(webID); !slices.Equal(got, []string{"10.2.0.7:8080 local", "10.2.0.8:8080"}) {
		t.Fatalf("web backends %v", got)
	}

	// Read back for people: names, addresses, backends.
	read, err := nat.ReadFrontends(f.set)
	if err != nil {
		t.Fatal(err)
	}
	if len(read) != 4 || read[0].Service != "default/dns:p" || read[1].Service != "default/web:p" ||
		read[1].Address.String() != "10.0.0.1:30080" || len(read[1].Backends) != 2 || read[3].Address.String() != "255.255.255.255:30080" {
		t.Fatalf("read back %+v", read)
	}
	// The NodePort wildcard is marked, and shown as every address is.
	if read[1].AllNodeAddresses || read[1].Shown().String() != "10.0.0.1:30080" ||
		!read[3].AllNodeAddresses || read[3].Shown().String() != "0.0.0.0:30080" {
		t.Fatalf("NodePorts read back as %v (all %v) and %v (all %v)", read[1].Shown(), read[1].AllNodeAddresses, read[3].Shown(), read[3].AllNodeAddresses)
	}

	// Nothing changed: nothing written.
	st = f.apply([]*nat.ServicePort{web, dns}, e)
	wantEqual(t, "writes with no change", st.Writes+st.Deletes, 0)

	// A new endpoint: one backend write and one frontend write per frontend
	// of the service (its count changed).
	e[web.Name] = eps("10.2.0.8:8080", "10.2.0.7:8080@local", "10.2.0.9:8080")
	st = f.apply([]*nat.ServicePort{web, dns}, e)
	wantEqual(t, "writes for one added endpoint", st.Writes, 1+3)
	wantEqual(t, "deletes for one added endpoint", st.Deletes, 0)

	// Removing the UDP service deletes everything of it and reports its backend.
	st = f.apply([]*nat.ServicePort{web}, e)
	if _, ok := f.frontends()["10.96.0.53:53/17"]; ok {
		t.Fatal("removed service's frontend still programmed")
	}
	if len(f.backends(dnsID)) != 0 {
		t.Fatal("removed service's backends still programmed")
	}
	if !slices.Contains(st.StaleUDP, nat.StaleBackend{ServiceID: dnsID, Backend: netip.MustParseAddrPort("10.2.0.9:53")}) {
		t.Fatalf("stale UDP %v", st.StaleUDP)
	}
	wantEqual(t, "deletes for a removed service", st.Deletes, 5) // frontend, marker, backend, name, ClusterIP's service network
}

func TestSyncerSourceRangesAndLoadBalancer(t *testing.T) {
	f := newFixture(t, nat.Options{})
	lb := svc("lb", "10.96.0.20", 443, func(s *nat.ServicePort) {
		s.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.10")}
		s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("10.0.0.0/8")}
		s.ExternalPolicy = nat.PolicyLocal
	})
	f.apply([]*nat.ServicePort{lb}, map[nat.ServicePortName][]nat.Endpoint{lb.Name: eps("10.2.0.7:8443@local")})
	id, _ := f.s.ServiceID(lb.Name)
	v := f.frontends()["203.0.113.10:443/6"]
	wantEqual(t, "LB flags", v.Flags, gen.SluiceFeFlagsFE_EXTERNAL|gen.SluiceFeFlagsFE_EXT_LOCAL|gen.SluiceFeFlagsFE_SRC_RANGES)
	wantEqual(t, "LB id", v.SvcId, id)
	wantEqual(t, "LB local backends", v.LocalCount, 1)
	// Two ranges, plus the LB IP itself because the node IP 10.0.0.1 is inside 10.0.0.0/8.
	m, _ := maps.SrcRanges.In(f.set)
	for _, cidr := range []string{"192.0.2.0/24", "10.0.0.0/8", "203.0.113.10/32"} {
		p := netip.MustParsePrefix(cidr)
		k := gen.SluiceSrcrangeKey{Prefixlen: 32 + uint32(p.Bits()), SvcId: gen.NetUint32(id), Src: gen.NetAddr(p.Addr())}
		if _, err := m.Get(k); err != nil {
			t.Errorf("source range %s: %v", cidr, err)
		}
	}
	wantEqual(t, "source range entries", f.srcRangeCount(), 3)
	// ClusterIP traffic is not subject to the ranges.
	wantEqual(t, "ClusterIP flags", f.frontends()["10.96.0.20:443/6"].Flags, gen.SluiceFeFlags(0))
}

func TestSyncerNodeIPChangeRederivesNodePorts(t *testing.T) {
	f := newFixture(t, nat.Options{})
	web := svc("web", "10.96.0.10", 80, func(s *nat.ServicePort) { s.NodePort = 30080 })
	plain := svc("plain", "10.96.0.11", 80)
	e := map[nat.ServicePortName][]nat.Endpoint{web.Name: eps("10.2.0.7:8080"), plain.Name: eps("10.2.0.8:8080")}
	f.apply([]*nat.ServicePort{web, plain}, e)

	f.node.NodePortIPs = []netip.Addr{netip.MustParseAddr("10.0.0.2")}
	st := f.apply([]*nat.ServicePort{web, plain}, e)
	fe := f.frontends()
	if _, ok := fe["10.0.0.1:30080/6"]; ok {
		t.Fatal("NodePort still on the old node IP")
	}
	if _, ok := fe["10.0.0.2:30080/6"]; !ok {
		t.Fatal("NodePort not on the new node IP")
	}
	// One NodePort entry moved, one host IP replaced: nothing else touched.
	wantEqual(t, "writes", st.Writes, 2)
	wantEqual(t, "deletes", st.Deletes, 2)
}

func TestSyncerRestartWritesNothingAndKeepsIDs(t *testing.T) {
	f := newFixture(t, nat.Options{})
	var svcs []*nat.ServicePort
	e := map[nat.ServicePortName][]nat.Endpoint{}
	for i := range 50 {
		s := svc(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.1.%d", i), 80, func(s *nat.ServicePort) { s.NodePort = uint16(30000 + i) })
		svcs = append(svcs, s)
		e[s.Name] = eps(fmt.Sprintf("10.2.1.%d:8080", i), fmt.Sprintf("10.2.2.%d:8080@local", i))
	}
	f.apply(svcs, e)
	ids := map[nat.ServicePortName]uint32{}
	for _, s := range svcs {
		ids[s.Name], _ = f.s.ServiceID(s.Name)
	}

	// A new syncer over the same pins, the state presented in another order.
	f.open(nat.Options{})
	slices.Reverse(svcs)
	st := f.apply(svcs, e)
	wantEqual(t, "writes after restart", st.Writes, 0)
	wantEqual(t, "deletes after restart", st.Deletes, 0)
	for _, s := range svcs {
		if id, _ := f.s.ServiceID(s.Name); id != ids[s.Name] {
			t.Fatalf("%s: id %d after restart, was %d", s.Name, id, ids[s.Name])
		}
	}

	// Services deleted while the agent was down are removed by the first Apply.
	f.open(nat.Options{})
	st = f.apply(svcs[:10], e)
	if st.Deletes == 0 || len(f.frontends()) != 10*3+10 {
		t.Fatalf("after restart with 40 services gone: %d deletes, %d frontends", st.Deletes, len(f.frontends()))
	}
}

func TestSyncerRemoteNodePortExpansionWaitsForRoutes(t *testing.T) {
	routes := map[netip.Addr]netip.Addr{netip.MustParseAddr("10.3.0.5"): netip.MustParseAddr("10.0.0.3")}
	var triggered atomic.Int32
	opts := nat.Options{
		Routes:  func(ep netip.Addr) (netip.Addr, bool) { n, ok := routes[ep]; return n, ok },
		Trigger: func() { triggered.Add(1) },
	}
	f := newFixture(t, opts)
	s := svc("itl", "10.96.0.30", 80, func(s *nat.ServicePort) { s.NodePort = 30030; s.InternalPolicy = nat.PolicyLocal })
	e := map[nat.ServicePortName][]nat.Endpoint{s.Name: eps("10.2.0.5:8080@local", "10.3.0.5:8080", "10.4.0.5:8080")}
	f.apply([]*nat.ServicePort{s}, e)

	fe := f.frontends()
	if _, ok := fe["255.255.255.255:30030/6"]; ok {
		t.Fatal("internal-local NodePort programmed the wildcard")
	}
	remote, ok := fe["10.0.0.3:30030/6"]
	if !ok {
		t.Fatalf("no entry for the remote node: %v", fe)
	}
	if got := f.backends(remote.SvcId); !slices.Equal(got, []string{"10.3.0.5:8080"}) {
		t.Fatalf("remote node entry holds %v", got)
	}
	if _, ok := fe["10.0.0.4:30030/6"]; ok {
		t.Fatal("entry for a node the routes do not know")
	}

	// The route to 10.4.0.5 arrives: the caller is asked to sync, and the next
	// Apply of the unchanged state fills the entry in.
	routes[netip.MustParseAddr("10.4.0.5")] = netip.MustParseAddr("10.0.0.4")
	f.s.RoutesChanged()
	wantEqual(t, "triggers", triggered.Load(), int32(1))
	f.apply([]*nat.ServicePort{s}, e)
	late, ok := f.frontends()["10.0.0.4:30030/6"]
	if !ok {
		t.Fatal("entry still missing after routes arrived")
	}
	if got := f.backends(late.SvcId); !slices.Equal(got, []string{"10.4.0.5:8080"}) {
		t.Fatalf("late node entry holds %v", got)
	}
}

func TestSyncerBadServiceDoesNotStopOthers(t *testing.T) {
	f := newFixture(t, nat.Options{})
	good := svc("good", "10.96.0.40", 80)
	bad := svc("bad", "10.96.0.41", 0) // port 0
	clash := svc("clash", "10.96.0.40", 80)
	clash.Name.Name = "zz-clash"
	st := f.apply([]*nat.ServicePort{good, bad}, map[nat.ServicePortName][]nat.Endpoint{good.Name: eps("10.2.0.1:80")})
	if len(st.Errors) != 1 || !strings.Contains(st.Errors[0].Error(), "default/bad:p") {
		t.Fatalf("errors %v", st.Errors)
	}
	if _, ok := f.frontends()["10.96.0.40:80/6"]; !ok {
		t.Fatal("good service not programmed")
	}
	st = f.apply([]*nat.ServicePort{good, clash}, map[nat.ServicePortName][]nat.Endpoint{good.Name: eps("10.2.0.1:80")})
	if len(st.Errors) != 1 || !strings.Contains(st.Errors[0].Error(), "claimed by services default/good:p and default/zz-clash:p") {
		t.Fatalf("frontend clash errors %v", st.Errors)
	}
}

func TestSyncerFullMapKeepsProgrammedServices(t *testing.T) {
	set, s := syncerWithCapacity(t, maps.Backends.Name, 4)
	a := svc("a", "10.96.0.50", 80)
	b := svc("b", "10.96.0.51", 80)
	e := map[nat.ServicePortName][]nat.Endpoint{a.Name: eps("10.2.0.1:80", "10.2.0.2:80"), b.Name: eps("10.2.0.3:80", "10.2.0.4:80", "10.2.0.5:80")}
	node := nat.Node{NodePortIPs: []netip.Addr{nodeIP}}
	if _, err := s.Apply(nat.State{Node: node, Services: map[nat.ServicePortName]*nat.ServicePort{a.Name: a}, Endpoints: e}); err != nil {
		t.Fatal(err)
	}
	st, err := s.Apply(nat.State{Node: node, Services: map[nat.ServicePortName]*nat.ServicePort{a.Name: a, b.Name: b}, Endpoints: e})
	if err != nil || len(st.Errors) != 1 || !errors.Is(st.Errors[0], maps.ErrFull) ||
		!strings.Contains(st.Errors[0].Error(), "sl_be_v1 is full (4 entries)") || !strings.Contains(st.Errors[0].Error(), "default/b") {
		t.Fatalf("apply into a full backend map: %v, errors %v: want the service that does not fit named, the sync done", err, st.Errors)
	}
	if !slices.Contains(st.FullMaps, maps.Backends.Name) {
		t.Fatalf("stats do not name the full map: %+v", st)
	}
	fm, _ := maps.Frontends.In(set)
	if _, err := fm.Get(gen.SluiceFeKey{Addr: gen.NetAddr(a.ClusterIP), Port: gen.NetPort(80), Proto: 6}); err != nil {
		t.Fatalf("programmed service lost: %v", err)
	}
	if _, err := fm.Get(gen.SluiceFeKey{Addr: gen.NetAddr(b.ClusterIP), Port: gen.NetPort(80), Proto: 6}); err == nil {
		t.Fatal("frontend of the service whose backends did not fit was written")
	}
}

func TestSyncerOneChangeAmong10000ServicesIsOConstant(t *testing.T) {
	f := newFixture(t, nat.Options{})
	svcs, e := scale(10_000, 10)
	st := f.apply(svcs, e)
	wantEqual(t, "initial writes", st.Writes, 10_000*(1+1+10+1+1)+1) // frontend, echo marker, 10 backends, name, ClusterIP's service network; the host IP
	e[svcs[1234].Name] = slices.Clone(e[svcs[1234].Name])
	e[svcs[1234].Name][3].Addr = netip.MustParseAddrPort("10.250.0.1:8080")
	st = f.apply(svcs, e)
	if st.Writes+st.Deletes > 3 {
		t.Fatalf("one endpoint changed: %d writes, %d deletes", st.Writes, st.Deletes)
	}
}

func scale(n, perService int) ([]*nat.ServicePort, map[nat.ServicePortName][]nat.Endpoint) {
	svcs := make([]*nat.ServicePort, n)
	e := map[nat.ServicePortName][]nat.Endpoint{}
	for i := range n {
		s := svc(fmt.Sprintf("s%d", i), netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String(), 80)
		svcs[i] = s
		for j := range perService {
			e[s.Name] = append(e[s.Name], nat.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(100 + j), byte(i >> 8), byte(i)}), 8080), Ready: true, Serving: true})
		}
	}
	return svcs, e
}

// With State.Changed, Apply looks only at the named services: an unnamed change
// is not seen (that is the contract), named additions and removals are.
func TestSyncerChangeSet(t *testing.T) {
	f := newFixture(t, nat.Options{})
	a, b := svc("a", "10.96.0.60", 80), svc("b", "10.96.0.61", 80)
	e := map[nat.ServicePortName][]nat.Endpoint{a.Name: eps("10.2.0.1:80"), b.Name: eps("10.2.0.2:80")}
	f.apply([]*nat.ServicePort{a}, e)
	st := nat.State{Node: f.node, Services: map[nat.ServicePortName]*nat.ServicePort{a.Name: a, b.Name: b}, Endpoints: e,
		Changed: map[nat.ServicePortName]bool{b.Name: true}}
	stats, err := f.s.Apply(st)
	if err != nil || stats.Writes != 5 { // b's frontend, marker, backend, name, ClusterIP's service network
		t.Fatalf("adding b through the change set: %+v %v", stats, err)
	}
	delete(st.Services, a.Name)
	st.Changed = map[nat.ServicePortName]bool{a.Name: true}
	if _, err := f.s.Apply(st); err != nil {
		t.Fatal(err)
	}
	fe := f.frontends()
	if _, ok := fe["10.96.0.60:80/6"]; ok {
		t.Fatal("a still programmed after its removal was named")
	}
	if _, ok := fe["10.96.0.61:80/6"]; !ok {
		t.Fatal("b lost")
	}
}

func TestSyncerRemovesStaleAffinity(t *testing.T) {
	var now atomic.Int64
	now.Store(int64(1000 * time.Second))
	f := newFixture(t, nat.Options{Clock: func() time.Duration { return time.Duration(now.Load()) }})
	a := svc("a", "10.96.0.70", 80, func(s *nat.ServicePort) { s.AffinityTimeout = 100 })
	b := svc("b", "10.96.0.71", 80, func(s *nat.ServicePort) { s.AffinityTimeout = 100 })
	e := map[nat.ServicePortName][]nat.Endpoint{a.Name: eps("10.2.0.1:80", "10.2.0.2:80"), b.Name: eps("10.2.0.3:80")}
	f.apply([]*nat.ServicePort{a, b}, e)
	idA, _ := f.s.ServiceID(a.Name)
	idB, _ := f.s.ServiceID(b.Name)
	aff, err := maps.Affinity.In(f.set)
	if err != nil {
		t.Fatal(err)
	}
	entry := func(id uint32, client, backend string, age time.Duration) gen.SluiceAffKey {
		k := gen.SluiceAffKey{SvcId: id, Client: gen.NetAddr(netip.MustParseAddr(client))}
		be := netip.MustParseAddrPort(backend)
		v := gen.SluiceAffValue{Ts: uint64(time.Duration(now.Load()) - age), Addr: gen.NetAddr(be.Addr()), Port: gen.NetPort(be.Port())}
		if err := aff.Put(k, v, 0); err != nil {
			t.Fatal(err)
		}
		return k
	}
	toGone := entry(idA, "10.1.0.1", "10.2.0.2:80", time.Second)
	toKept := entry(idA, "10.1.0.2", "10.2.0.1:80", time.Second)
	ofB := entry(idB, "10.1.0.3", "10.2.0.3:80", time.Second)
	expired := entry(idB, "10.1.0.4", "10.2.0.3:80", 200*time.Second) // of an unchanged service

	// a loses 10.2.0.2: the entry pinning a client to it goes.
	e[a.Name] = eps("10.2.0.1:80")
	st := f.apply([]*nat.ServicePort{a, b}, e)
	if _, err := aff.Get(toGone); err == nil {
		t.Fatal("affinity to a removed backend kept")
	}
	for _, k := range []gen.SluiceAffKey{toKept, ofB} {
		if _, err := aff.Get(k); err != nil {
			t.Fatalf("live affinity entry removed: %v", err)
		}
	}
	if st.AffinityDeleted < 1 {
		t.Fatalf("stats %+v", st)
	}
	// Expired entries go at the periodic clean-up.
	if n, err := f.s.CleanAffinity(); err != nil || n != 1 {
		t.Fatalf("clean-up removed %d: %v", n, err)
	}
	if _, err := aff.Get(expired); err == nil {
		t.Fatal("expired entry kept")
	}
	// b removed: its entries go.
	f.apply([]*nat.ServicePort{a}, e)
	if _, err := aff.Get(ofB); err == nil {
		t.Fatal("affinity of a removed service kept")
	}
}

// A Service too big for a map (more loadBalancerSourceRanges than the map has
// room for) is refused on its own, with an error naming it and the map; every
// other Service, including one created after it, is programmed.
func TestServiceTooBigForAMapIsRefusedAlone(t *testing.T) {
	set, s := syncerWithCapacity(t, gen.SluiceMapSlSrcrangeV1, 100)
	big := svc("big", "10.96.0.20", 80, func(s *nat.ServicePort) {
		s.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.20")}
		for i := range 150 {
			s.LoadBalancerSourceRanges = append(s.LoadBalancerSourceRanges, netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, byte(i), 0}), 24))
		}
	})
	small := svc("small", "10.96.0.21", 80)
	node := nat.Node{Name: "node-a", NodePortIPs: []netip.Addr{nodeIP}, AllNodePortIPs: true}
	endpoints := map[nat.ServicePortName][]nat.Endpoint{big.Name: eps("10.2.0.1:8080"), small.Name: eps("10.2.0.2:8080")}
	stats, err := s.Apply(nat.State{Node: node, Services: map[nat.ServicePortName]*nat.ServicePort{big.Name: big, small.Name: small}, Endpoints: endpoints})
	if err != nil {
		t.Fatalf("one oversized Service failed the whole sync: %v", err)
	}
	if len(stats.Errors) != 1 || !strings.Contains(stats.Errors[0].Error(), "default/big") ||
		!strings.Contains(stats.Errors[0].Error(), gen.SluiceMapSlSrcrangeV1) || !slices.Contains(stats.FullMaps, gen.SluiceMapSlSrcrangeV1) {
		t.Fatalf("errors %v, full maps %v: want one error naming the Service and the map", stats.Errors, stats.FullMaps)
	}
	fe, err := maps.Frontends.In(set)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fe.Get(gen.SluiceFeKey{Addr: gen.NetAddr(small.ClusterIP), Port: gen.NetPort(80), Proto: 6}); err != nil {
		t.Fatalf("the other Service was not programmed: %v", err)
	}
	if _, err := fe.Get(gen.SluiceFeKey{Addr: gen.NetAddr(big.ClusterIP), Port: gen.NetPort(80), Proto: 6}); err == nil {
		t.Fatal("the oversized Service was programmed in part")
	}
	// A Service created later is programmed too, and the big one stays out.
	later := svc("later", "10.96.0.22", 80)
	endpoints[later.Name] = eps("10.2.0.3:8080")
	stats, err = s.Apply(nat.State{Node: node, Services: map[nat.ServicePortName]*nat.ServicePort{big.Name: big, small.Name: small, later.Name: later}, Endpoints: endpoints})
	if err != nil || len(stats.Errors) != 1 {
		t.Fatalf("second sync: %v, errors %v", err, stats.Errors)
	}
	if _, err := fe.Get(gen.SluiceFeKey{Addr: gen.NetAddr(later.ClusterIP), Port: gen.NetPort(80), Proto: 6}); err != nil {
		t.Fatalf("a Service created after the oversized one was not programmed: %v", err)
	}
}

// Two Services claiming one frontend (an externalIP:port the API server
// accepts twice): the older has it, whatever the order they arrive in; when
// it goes, the other one is programmed at once, without a restart.
func TestFrontendConflictOlderWinsAndSurvivorTakesOver(t *testing.T) {
	now := time.Now()
	old := svc("old", "10.96.0.60", 80, func(s *nat.ServicePort) {
		s.ExternalIPs = []netip.Addr{netip.MustParseAddr("203.0.113.7")}
		s.Created = now.Add(-time.Hour)
	})
	young := svc("young", "10.96.0.61", 80, func(s *nat.ServicePort) {
		s.ExternalIPs = []netip.Addr{netip.MustParseAddr("203.0.113.7")}
		s.Created = now
	})
	e := map[nat.ServicePortName][]nat.Endpoint{old.Name: eps("10.2.0.1:80"), young.Name: eps("10.2.0.2:80")}
	shared := "203.0.113.7:80/6"
	for _, order := range [][]*nat.ServicePort{{young, old}, {old, young}} {
		f := newFixture(t, nat.Options{})
		// One at a time, in this order: the second one claims a taken frontend.
		f.apply(order[:1], e)
		st := f.apply(order, e)
		if len(st.Errors) != 1 || !strings.Contains(st.Errors[0].Error(), "default/old:p is older and has it") {
			t.Fatalf("order %s first: errors %v", order[0].Name, st.Errors)
		}
		if got := f.backends(f.frontends()[shared].SvcId); !slices.Equal(got, []string{"10.2.0.1:80"}) {
			t.Fatalf("order %s first: the shared frontend goes to %v, want the older Service's backend", order[0].Name, got)
		}
		// The older one is deleted: the younger takes the frontend over.
		st = f.apply([]*nat.ServicePort{young}, e)
		if len(st.Errors) != 0 {
			t.Fatalf("after the older Service went: errors %v", st.Errors)
		}
		if got := f.backends(f.frontends()[shared].SvcId); !slices.Equal(got, []string{"10.2.0.2:80"}) {
			t.Fatalf("order %s first: after the older Service went, the frontend goes to %v", order[0].Name, got)
		}
	}
}

// A ClusterIP that is one of the node's addresses would take the node's own
// ports (its port 22 answered with resets when the Service has no
// endpoints): the Service is refused.
func TestClusterIPOfTheNodeIsRefused(t *testing.T) {
	f := newFixture(t, nat.Options{})
	s := svc("sshy", "10.96.0.70", 22)
	e := map[nat.ServicePortName][]nat.Endpoint{}
	st := f.apply([]*nat.ServicePort{svc("onnode", nodeIP.String(), 22)}, e)
	if len(st.Errors) != 1 || !strings.Contains(st.Errors[0].Error(), "is an address of this node") {
		t.Fatalf("errors %v", st.Errors)
	}
	if _, ok := f.frontends()[nodeIP.String()+":22/6"]; ok {
		t.Fatal("a frontend on the node's own address was programmed")
	}
	f.apply([]*nat.ServicePort{s}, e)
	if _, ok := f.frontends()["10.96.0.70:22/6"]; !ok {
		t.Fatal("an ordinary Service was not programmed")
	}
}

// syncerWithCapacity opens the maps with one map's capacity changed, and a
// syncer on them.
func syncerWithCapacity(t *testing.T, name string, capacity uint32) (*maps.Set, *nat.Syncer) {
	t.Helper()
	set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(t), Capacity: map[string]uint32{name: capacity}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	s, err := nat.NewSyncer(nat.Options{Maps: set})
	if err != nil {
		t.Fatal(err)
	}
	return set, s
}
