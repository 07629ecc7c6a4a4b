package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The migration test: a dual-stack node where kube-proxy (nftables mode,
// driven by a real API server) serves 21 IPv4 and 6 IPv6 Services, with
// connections open through it — 30 pod -> ClusterIP TCP connections and 10
// external -> NodePort ones, 6 and 4 of each over IPv6, a pod's UDP session
// to a ClusterIP of each family and an external client's to a NodePort, each
// exchanging a message every 200 ms. Sluice's agent starts and programs the
// node; kube-proxy stops and `kube-proxy --cleanup` removes its rules.
// Later the reverse: kube-proxy starts again, the agent stops, and `sluice
// cleanup` hands the connections back and removes Sluice. Every connection
// must be answered throughout, by the backend it started with.
//
// SLUICE_TAKEOVER_RUNS=n runs it n times in a row (the "five runs").
func TestTakeoverFromKubeProxyAndBack(t *testing.T) {
	runs := 1
	if s := os.Getenv("SLUICE_TAKEOVER_RUNS"); s != "" {
		var err error
		if runs, err = strconv.Atoi(s); err != nil {
			t.Fatalf("SLUICE_TAKEOVER_RUNS=%q: %v", s, err)
		}
	}
	kubeProxy := kubeProxyBinary(t)
	for run := 1; run <= runs; run++ {
		t.Run(fmt.Sprintf("run-%d", run), func(t *testing.T) { migrate(t, kubeProxy) })
	}
}

func kubeProxyBinary(t *testing.T) string {
	t.Helper()
	bpftest.Require(t)
	path := os.Getenv("SLUICE_KUBE_PROXY")
	if path == "" {
		path = filepath.Join("..", "..", ".bin", "kube-proxy")
	}
	abs, err := filepath.Abs(path)
	if _, serr := os.Stat(abs); err != nil || serr != nil {
		if bpftest.Required() {
			t.Fatalf("kube-proxy binary %s: %v %v (.ci/install builds it)", path, err, serr)
		}
		t.Skipf("no kube-proxy binary at %s (.ci/install builds it)", path)
	}
	return abs
}

// migrationNode is the node: its namespace runs the API server, kube-proxy
// and the agent; pods sit behind slw* veths, the external client behind the
// data interface sldata0.
type migrationNode struct {
	node     *bpftest.NetNS
	clients  []*bpftest.NetNS
	external *bpftest.NetNS
	api      *apiservertest.Server
	dir      string
	pinDir   string
	log      *os.File
}

const (
	migrationNodeIP  = "10.210.0.1"
	migrationNodeIP6 = "fd00:210::1"
	tcpNodePort      = 30080
	tcpNodePort6     = 30081
	udpNodePort      = 30053
)

func newMigrationNode(t *testing.T) *migrationNode {
	m := &migrationNode{node: bpftest.NewNetNS(t), dir: t.TempDir()}
	for _, s := range []string{"net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
		"net.ipv6.conf.all.forwarding=1"} {
		m.node.Run("sysctl", "-qw", s)
	}
	var backends, backends6 []string
	for i := range 5 {
		ip, ip6 := fmt.Sprintf("10.20%d.0.2", i), fmt.Sprintf("fd00:20%d::2", i)
		iface := fmt.Sprintf("slw%d", i)
		pod := bpftest.NewPod(t, m.node, iface, netip.MustParsePrefix(ip+"/24"), netip.MustParseAddr(fmt.Sprintf("10.20%d.0.1", i)))
		// The pod's IPv6 address beside its IPv4 one, as a dual-stack CNI
		// gives it (nodad: usable at once).
		m.node.Run("ip", "-6", "addr", "add", fmt.Sprintf("fd00:20%d::1/64", i), "dev", iface, "nodad")
		pod.Run("ip", "-6", "addr", "add", ip6+"/64", "dev", "eth0", "nodad")
		pod.Run("ip", "-6", "route", "add", "default", "via", fmt.Sprintf("fd00:20%d::1", i))
		if i < 2 {
			m.clients = append(m.clients, pod)
			continue
		}
		name := fmt.Sprintf("b%d", i-1)
		bpftest.ServeTCP(t, pod, name, ":8080")
		bpftest.ServeUDPEcho(t, pod, name, ":5353")
		bpftest.ServeTCP(t, pod, name, "[::]:8080")
		bpftest.ServeUDPEcho(t, pod, name, "[::]:5353")
		backends, backends6 = append(backends, ip), append(backends6, ip6)
	}
	m.external = bpftest.NewPod(t, m.node, "sldata0", netip.MustParsePrefix("10.210.0.2/24"), netip.MustParseAddr(migrationNodeIP))
	m.node.Run("ip", "-6", "addr", "add", migrationNodeIP6+"/64", "dev", "sldata0", "nodad")
	m.external.Run("ip", "-6", "addr", "add", "fd00:210::2/64", "dev", "eth0", "nodad")
	m.external.Run("ip", "-6", "route", "add", "default", "via", migrationNodeIP6)
	m.pinDir = filepath.Join(bpftest.PinDir(t), "sluice")
	var err error
	if m.log, err = os.Create(filepath.Join(m.dir, "agent.log")); err != nil {
		t.Fatal(err)
	}

	m.api = apiservertest.StartIn(t, m.node, apiservertest.ServiceCIDR("10.96.0.0/16,fd00:96::/112"))
	ctx := context.Background()
	c := m.api.Client
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node"},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: migrationNodeIP},
			{Type: v1.NodeInternalIP, Address: migrationNodeIP6}}}}
	if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		name := fmt.Sprintf("web%d", i)
		spec := v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt(8080)}}}
		if i == 0 {
			spec.Type = v1.ServiceTypeNodePort
			spec.Ports[0].NodePort = tcpNodePort
		}
		m.createService(t, name, spec, v1.ProtocolTCP, 8080, backends)
	}
	m.createService(t, "dns", v1.ServiceSpec{Type: v1.ServiceTypeNodePort,
		Ports: []v1.ServicePort{{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP, TargetPort: intstr.FromInt(5353), NodePort: udpNodePort}}},
		v1.ProtocolUDP, 5353, backends)
	single6 := v1.IPFamilyPolicySingleStack
	for i := range 5 {
		spec := v1.ServiceSpec{IPFamilies: []v1.IPFamily{v1.IPv6Protocol}, IPFamilyPolicy: &single6,
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt(8080)}}}
		if i == 0 {
			spec.Type = v1.ServiceTypeNodePort
			spec.Ports[0].NodePort = tcpNodePort6
		}
		m.createService(t, fmt.Sprintf("web6-%d", i), spec, v1.ProtocolTCP, 8080, backends6)
	}
	m.createService(t, "dns6", v1.ServiceSpec{IPFamilies: []v1.IPFamily{v1.IPv6Protocol}, IPFamilyPolicy: &single6,
		Ports: []v1.ServicePort{{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP, TargetPort: intstr.FromInt(5353)}}},
		v1.ProtocolUDP, 5353, backends6)
	return m
}

func (m *migrationNode) createService(t *testing.T, name string, spec v1.ServiceSpec, proto v1.Protocol, port int32, backends []string) {
	t.Helper()
	ctx := context.Background()
	if _, err := m.api.Client.CoreV1().Services("default").Create(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pname, ready, nodeName := spec.Ports[0].Name, true, "node"
	var eps []discovery.Endpoint
	for _, be := range backends {
		eps = append(eps, discovery.Endpoint{Addresses: []string{be}, NodeName: &nodeName,
			Conditions: discovery.EndpointConditions{Ready: &ready}})
	}
	addressType := discovery.AddressTypeIPv4
	if netip.MustParseAddr(backends[0]).Is6() {
		addressType = discovery.AddressTypeIPv6
	}
	slice := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: addressType, Endpoints: eps,
		Ports: []discovery.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}}}
	if _, err := m.api.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// clusterIP is a Service's address, with port.
func (m *migrationNode) clusterIP(t *testing.T, name string, port uint16) netip.AddrPort {
	t.Helper()
	svc, err := m.api.Client.CoreV1().Services("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), port)
}

// clusterIPs are the Services' addresses: web0..web19 on port 80, then dns
// on 53; web6-0..web6-4 and dns6, the IPv6 ones.
func (m *migrationNode) clusterIPs(t *testing.T) (web []netip.AddrPort, dns netip.AddrPort, web6 []netip.AddrPort, dns6 netip.AddrPort) {
	t.Helper()
	for i := range 20 {
		web = append(web, m.clusterIP(t, fmt.Sprintf("web%d", i), 80))
	}
	for i := range 5 {
		web6 = append(web6, m.clusterIP(t, fmt.Sprintf("web6-%d", i), 80))
	}
	return web, m.clusterIP(t, "dns", 53), web6, m.clusterIP(t, "dns6", 53)
}

// startKubeProxy runs kube-proxy in nftables mode until stopped (or the test
// ends) and waits until it serves the last Service of each family.
func (m *migrationNode) startKubeProxy(t *testing.T, bin string, last, last6 netip.AddrPort) *os.Process {
	t.Helper()
	p := apiservertest.StartProcess(t, m.node, filepath.Join(m.dir, fmt.Sprintf("kube-proxy-%d.log", time.Now().UnixNano())),
		bin, "--kubeconfig", m.api.Kubeconfig, "--hostname-override", "node", "--proxy-mode", "nftables",
		"--conntrack-max-per-core=0", "--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249",
		"--v=0", "--iptables-min-sync-period=0s")
	var out []byte
	for table, addr := range map[string]netip.Addr{"ip": last.Addr(), "ip6": last6.Addr()} {
		waitFor(t, 30*time.Second, fmt.Sprintf("kube-proxy programs %v", addr), func() bool {
			out, _ = m.node.Command("nft", "list", "table", table, "kube-proxy").CombinedOutput()
			return strings.Contains(string(out), addr.String())
		}, func() string { return string(out) })
	}
	return p
}

func stopProcess(p *os.Process) {
	_ = p.Signal(syscall.SIGTERM)
	for range 100 {
		if p.Signal(syscall.Signal(0)) != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = p.Kill()
}

// session is one long-lived connection or UDP socket sending a line every
// 200 ms. It records the backend of its first answer and every fault: an
// error, a missing answer, an answer from another backend.
type session struct {
	name    string
	backend string
	mu      sync.Mutex
	answers int
	faults  []string
}

func (s *session) record(answer string, err error, at string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.faults = append(s.faults, fmt.Sprintf("%s: %v", at, err))
		return
	}
	who := strings.Fields(answer + " ?")[0]
	if s.backend == "" {
		s.backend = who
	} else if who != s.backend {
		s.faults = append(s.faults, fmt.Sprintf("%s: answered by %s, the session was with %s", at, who, s.backend))
	}
	s.answers++
}

func (s *session) result() (backend string, answers int, faults []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.backend, s.answers, append([]string(nil), s.faults...)
}

// phase names the moment of the migration, for the faults.
type phase struct {
	mu   sync.Mutex
	name string
}

func (p *phase) set(s string) { p.mu.Lock(); p.name = s; p.mu.Unlock() }
func (p *phase) get() string  { p.mu.Lock(); defer p.mu.Unlock(); return p.name }

func startTCPSession(t *testing.T, ctx context.Context, wg *sync.WaitGroup, ns *bpftest.NetNS, to netip.AddrPort, name string, ph *phase) *session {
	t.Helper()
	var c net.Conn
	if err := ns.Do(func() (err error) { c, err = net.DialTimeout("tcp", to.String(), 2*time.Second); return err }); err != nil {
		t.Fatalf("%s: dial %v: %v", name, to, err)
	}
	s := &session{name: name}
	r := bufio.NewReader(c)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer c.Close()
		for i := 0; ctx.Err() == nil; i++ {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			_, err := fmt.Fprintf(c, "%s-%d\n", name, i)
			var answer string
			if err == nil {
				answer, err = r.ReadString('\n')
			}
			s.record(answer, err, ph.get())
			if err != nil {
				return // a broken connection stays broken
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return s
}

func startUDPSession(t *testing.T, ctx context.Context, wg *sync.WaitGroup, ns *bpftest.NetNS, to netip.AddrPort, name string, ph *phase) *session {
	t.Helper()
	var c *net.UDPConn
	network := "udp4"
	if to.Addr().Is6() {
		network = "udp6"
	}
	if err := ns.Do(func() (err error) { c, err = net.ListenUDP(network, nil); return err }); err != nil {
		t.Fatal(err)
	}
	s := &session{name: name}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer c.Close()
		buf := make([]byte, 512)
		for i := 0; ctx.Err() == nil; i++ {
			msg := fmt.Sprintf("%s-%d", name, i)
			_, err := c.WriteToUDPAddrPort([]byte(msg), to)
			var answer string
			if err == nil {
				// A lost datagram is retried once, as a resolver would.
				c.SetReadDeadline(time.Now().Add(time.Second))
				var n int
				var from netip.AddrPort
				n, from, err = c.ReadFromUDPAddrPort(buf)
				if err == nil && from != to {
					err = fmt.Errorf("answer from %v, want %v", from, to)
				}
				answer = string(buf[:n])
			}
			s.record(answer, err, ph.get())
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return s
}

func migrate(t *testing.T, kubeProxyBin string) {
	m := newMigrationNode(t)
	web, dns, web6, dns6 := m.clusterIPs(t)
	kp := m.startKubeProxy(t, kubeProxyBin, dns, dns6)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	ph := &phase{name: "kube-proxy"}
	var podTCP, extTCP, udp, pod6TCP, ext6TCP []*session
	for i := range 30 {
		podTCP = append(podTCP, startTCPSession(t, ctx, &wg, m.clients[i%2], web[i%20], fmt.Sprintf("pod-tcp-%d", i), ph))
	}
	for i := range 6 {
		pod6TCP = append(pod6TCP, startTCPSession(t, ctx, &wg, m.clients[i%2], web6[i%5], fmt.Sprintf("pod-tcp6-%d", i), ph))
	}
	nodePort := netip.MustParseAddrPort(fmt.Sprintf("%s:%d", migrationNodeIP, tcpNodePort))
	for i := range 10 {
		extTCP = append(extTCP, startTCPSession(t, ctx, &wg, m.external, nodePort, fmt.Sprintf("ext-tcp-%d", i), ph))
	}
	nodePort6 := netip.AddrPortFrom(netip.MustParseAddr(migrationNodeIP6), tcpNodePort6)
	for i := range 4 {
		ext6TCP = append(ext6TCP, startTCPSession(t, ctx, &wg, m.external, nodePort6, fmt.Sprintf("ext-tcp6-%d", i), ph))
	}
	udp = append(udp, startUDPSession(t, ctx, &wg, m.clients[0], dns, "pod-udp", ph),
		startUDPSession(t, ctx, &wg, m.external, netip.MustParseAddrPort(fmt.Sprintf("%s:%d", migrationNodeIP, udpNodePort)), "ext-udp", ph),
		startUDPSession(t, ctx, &wg, m.clients[1], dns6, "pod-udp6", ph))
	time.Sleep(time.Second)
	sessions := slices.Concat(podTCP, extTCP, pod6TCP, ext6TCP, udp)
	initial := map[string]string{}
	for _, s := range sessions {
		b, n, faults := s.result()
		if n == 0 || len(faults) > 0 {
			t.Fatalf("%s through kube-proxy alone: %d answers, faults %v", s.name, n, faults)
		}
		initial[s.name] = b
	}

	// kube-proxy -> Sluice.
	ph.set("sluice-starting")
	metricsAddr := "127.0.0.1:19249"
	agent := startAgentProc(t, m.node.Name, m.log, "--kubeconfig", m.api.Kubeconfig, "--hostname-override", "node",
		"--bpf-pin-dir", m.pinDir, "--workload-iface-prefixes", "slw", "--data-ifaces", "^sldata", "--cgroup=",
		"--healthz-bind-address=", "--metrics-bind-address="+metricsAddr, "--min-sync-period=0s")
	agent.waitProgrammed(t, m.pinDir, dns.String(), 6)
	agent.waitProgrammed(t, m.pinDir, dns6.Addr().String(), 6)
	waitLog(t, agent, "pass=2")
	ph.set("sluice-with-kube-proxy")
	time.Sleep(time.Second)
	ph.set("kube-proxy-stopping")
	stopProcess(kp)
	ph.set("kube-proxy-cleanup")
	if out, err := m.node.Command(kubeProxyBin, "--cleanup").CombinedOutput(); err != nil {
		t.Fatalf("kube-proxy --cleanup: %v\n%s", err, out)
	}
	if out, _ := m.node.Command("nft", "list", "ruleset").CombinedOutput(); strings.Contains(string(out), "kube-proxy") {
		t.Fatalf("kube-proxy --cleanup left its rules:\n%s", out)
	}
	ph.set("sluice-alone")
	mark := answered(sessions)
	time.Sleep(3 * time.Second) // longer than a request's deadline
	takeoverTable := tally("kube-proxy -> Sluice", initial, mark, podTCP, extTCP, pod6TCP, ext6TCP, udp)
	t.Log(takeoverTable)
	adopted := takeoverMetric(t, m.node, metricsAddr, "adopted")

	// Sluice -> kube-proxy.
	ph.set("kube-proxy-starting-beside-sluice")
	kp = m.startKubeProxy(t, kubeProxyBin, dns, dns6)
	defer stopProcess(kp)
	ph.set("agent-stopping")
	agent.stop()
	ph.set("sluice-cleanup")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", m.node.Name, self, "cleanup", "--bpf-pin-dir", m.pinDir)
	cmd.Env = append(os.Environ(), "SLUICE_AS_BINARY=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sluice cleanup: %v\n%s", err, out)
	}
	t.Logf("sluice cleanup: %s", strings.TrimSpace(string(out)))
	ph.set("kube-proxy-alone")
	mark = answered(sessions)
	time.Sleep(3 * time.Second)
	handBackTable := tally("Sluice -> kube-proxy", initial, mark, podTCP, extTCP, pod6TCP, ext6TCP, udp)
	cancel()
	wg.Wait()

	t.Logf("\n| switch | pod->ClusterIP TCP | external->NodePort TCP | pod->IPv6 ClusterIP TCP | external->IPv6 NodePort TCP | UDP sessions |\n|---|---|---|---|---|---|\n%s\n%s", takeoverTable, handBackTable)
	for _, s := range sessions {
		b, n, faults := s.result()
		if len(faults) > 0 || b != initial[s.name] {
			t.Errorf("%s (%d answers, backend %s, was %s): %s", s.name, n, b, initial[s.name], strings.Join(faults, "; "))
		}
	}
	// 30 + 10 + 6 + 4 TCP and 3 UDP, each netfilter's, adopted.
	if adopted < 53 {
		t.Errorf("sluice_takeover_flows_total{result=\"adopted\"} = %v, want at least 53\n%s", adopted, agent.logs())
	}
	if !strings.Contains(string(out), "handed ") {
		t.Errorf("sluice cleanup did not report the hand-back:\n%s", out)
	}
	if t.Failed() {
		t.Logf("agent log:\n%s", agent.logs())
	}
}

// answered is how many answers each session had so far.
func answered(sessions []*session) map[*session]int {
	m := map[*session]int{}
	for _, s := range sessions {
		_, m[s], _ = s.result()
	}
	return m
}

// tally is one row of the table: sessions alive on their first backend, by
// kind (a column each): no fault, and answered at least 5 times since mark
// (3 s at one message every 200 ms), so that a session stuck in a request
// counts as lost even before its deadline.
func tally(name string, initial map[string]string, mark map[*session]int, kinds ...[]*session) string {
	count := func(ss []*session) string {
		ok := 0
		for _, s := range ss {
			if b, n, faults := s.result(); len(faults) == 0 && b == initial[s.name] && n-mark[s] >= 5 {
				ok++
			}
		}
		return fmt.Sprintf("%d/%d", ok, len(ss))
	}
	row := "| " + name + " |"
	for _, ss := range kinds {
		row += " " + count(ss) + " |"
	}
	return row
}

func waitLog(t *testing.T, p *agentProc, what string) {
	t.Helper()
	waitFor(t, 20*time.Second, fmt.Sprintf("the agent logs %q", what), func() bool { return strings.Contains(p.logs(), what) }, p.logs)
}

// takeoverMetric reads sluice_takeover_flows_total{result} from the agent.
func takeoverMetric(t *testing.T, ns *bpftest.NetNS, addr, result string) float64 {
	t.Helper()
	series := fmt.Sprintf("sluice_takeover_flows_total{result=%q}", result)
	v, ok := metricValue(t, ns, addr, series)
	if !ok {
		t.Fatalf("no %s in /metrics", series)
	}
	return v
}

// metricValue reads one series (name and labels, as /metrics prints them)
// from the agent's /metrics at addr, reached from ns.
func metricValue(t *testing.T, ns *bpftest.NetNS, addr, series string) (float64, bool) {
	t.Helper()
	body, err := ns.Command("curl", "-sS", "http://"+addr+"/metrics").Output()
	if err != nil {
		t.Errorf("curl %s/metrics: %v", addr, err)
		return 0, false
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f, true
		}
	}
	return 0, false
}
