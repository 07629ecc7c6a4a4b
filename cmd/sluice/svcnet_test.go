package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

// serviceProbe is one new flow toward a service address, from a pod or from
// the node itself.
type serviceProbe struct {
	name     string
	fromNode bool   // a node socket, in the socket-LB cgroup
	network  string // tcp4 or udp4
	to       netip.AddrPort
}

// TestUnservedServiceAddressesBesideKubeProxy runs the same new flows to
// service addresses that serve nothing with no proxy, with kube-proxy
// (nftables) and with Sluice, on one node in one run: to a port of a
// ClusterIP that no Service defines, and to an address of the ServiceCIDR
// (the API server's 10.96.0.0/16, a ServiceCIDR object) that no Service
// holds. The network beyond the node answers every address of the range, so
// a flow that escapes the node is seen as answered. Sluice must do what
// kube-proxy does, flow by flow.
func TestUnservedServiceAddressesBesideKubeProxy(t *testing.T) {
	kubeProxy := kubeProxyBinary(t)
	m := newMigrationNode(t)
	web, dns, _, dns6 := m.clusterIPs(t)
	unallocated := netip.MustParseAddr("10.96.255.254")
	svcs, err := m.api.Client.CoreV1().Services("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs.Items {
		if s.Spec.ClusterIP == unallocated.String() {
			t.Fatalf("%s/%s was given %v, the address this test takes for unallocated", s.Namespace, s.Name, unallocated)
		}
	}
	// Beyond the node: a router that takes every address of the range
	// for its own (AnyIP) and answers on the ports probed.
	m.node.Run("ip", "route", "add", "default", "via", "10.210.0.2")
	m.external.Run("ip", "route", "add", "local", "10.96.0.0/16", "dev", "lo")
	bpftest.ServeTCP(t, m.external, "beyond", ":80")
	bpftest.ServeTCP(t, m.external, "beyond", ":81")
	// A UDP answer must come from the address asked: one server per address.
	for _, a := range []netip.Addr{unallocated, dns.Addr()} {
		bpftest.ServeUDPEcho(t, m.external, "beyond", netip.AddrPortFrom(a, 54).String())
	}

	// The node's probes run in the cgroup the agent's socket LB serves.
	cg := bpftest.NewCgroup(t)
	cgroups := t.TempDir()
	if err := unix.Mount("cgroup2", cgroups, "cgroup2", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(cgroups, unix.MNT_DETACH)

	undefinedTCP := netip.AddrPortFrom(web[0].Addr(), 81)
	probes := []serviceProbe{
		{"pod, TCP, defined port", false, "tcp4", web[0]},
		{"pod, TCP, undefined port of a ClusterIP", false, "tcp4", undefinedTCP},
		{"pod, UDP, undefined port of a ClusterIP", false, "udp4", netip.AddrPortFrom(dns.Addr(), 54)},
		{"pod, TCP, unallocated address", false, "tcp4", netip.AddrPortFrom(unallocated, 80)},
		{"pod, UDP, unallocated address", false, "udp4", netip.AddrPortFrom(unallocated, 54)},
		{"pod, echo request, unallocated address", false, "ping", netip.AddrPortFrom(unallocated, 0)},
		// A known difference: Sluice answers echo requests to a
		// ClusterIP itself (IPVS mode does too); kube-proxy nftables
		// rejects them.
		{"pod, echo request, a ClusterIP", false, "ping", netip.AddrPortFrom(web[0].Addr(), 0)},
		{"node, TCP, undefined port of a ClusterIP", true, "tcp4", undefinedTCP},
		{"node, TCP, unallocated address", true, "tcp4", netip.AddrPortFrom(unallocated, 80)},
	}
	runAll := func() []string {
		out := make([]string, len(probes))
		for i, p := range probes {
			out[i] = m.probe(t, cg, p)
		}
		return out
	}

	none := runAll()

	kp := m.startKubeProxy(t, kubeProxy, dns, dns6)
	var rules []byte
	waitFor(t, 30*time.Second, "kube-proxy drops the ServiceCIDR's unallocated addresses", func() bool {
		rules, _ = m.node.Command("nft", "list", "chain", "ip", "kube-proxy", "cluster-ips-check").CombinedOutput()
		return strings.Contains(string(rules), "10.96.0.0/16")
	}, func() string { return string(rules) })
	withKubeProxy := runAll()
	stopProcess(kp)
	if out, err := m.node.Command(kubeProxy, "--cleanup").CombinedOutput(); err != nil {
		t.Fatalf("kube-proxy --cleanup: %v\n%s", err, out)
	}
	// Each proxy starts from a node without the other's flows.
	m.node.Run("conntrack", "-F")

	agent := startAgentProc(t, m.node.Name, m.log, "--kubeconfig", m.api.Kubeconfig, "--hostname-override", "node",
		"--bpf-pin-dir", m.pinDir, "--workload-iface-prefixes", "slw", "--data-ifaces", "^sldata",
		"--cgroup", filepath.Join(cgroups, filepath.Base(cg.Path)),
		"--healthz-bind-address=", "--metrics-bind-address=127.0.0.1:19250", "--min-sync-period=0s")
	agent.waitProgrammed(t, m.pinDir, dns.String(), 6)
	waitServiceNet(t, m.pinDir, netip.MustParsePrefix("10.96.0.0/16"))
	withSluice := runAll()
	// Which backend answers is the proxies' random choice.
	for _, outcomes := range [][]string{withKubeProxy, withSluice} {
		for i, o := range outcomes {
			if o != "answered by beyond" && strings.HasPrefix(o, "answered by b") {
				outcomes[i] = "answered by a backend"
			}
		}
	}

	table := "\n| flow | no proxy | kube-proxy nftables | Sluice |\n|---|---|---|---|\n"
	for i, p := range probes {
		table += fmt.Sprintf("| %s (%v) | %s | %s | %s |\n", p.name, p.to, none[i], withKubeProxy[i], withSluice[i])
	}
	t.Log(table)
	// Without a proxy the unserved flows leave the node: the setup can tell.
	for i, p := range probes {
		if !strings.HasPrefix(none[i], "answered") {
			t.Errorf("%s with no proxy: %s, want it answered beyond the node", p.name, none[i])
		}
		if p.name == "pod, echo request, a ClusterIP" {
			if withSluice[i] != "answered" {
				t.Errorf("%s: Sluice %s, want answered by the datapath", p.name, withSluice[i])
			}
			continue
		}
		if withSluice[i] != withKubeProxy[i] {
			t.Errorf("%s: Sluice %s, kube-proxy %s", p.name, withSluice[i], withKubeProxy[i])
		}
	}
	if withKubeProxy[0] != "answered by a backend" || withKubeProxy[1] != "refused" || withKubeProxy[3] != "dropped" {
		t.Errorf("kube-proxy did not serve, reject and drop as this test expects:%s", table)
	}
	// What Sluice refused shows in its metrics, by reason.
	for event, want := range map[string]float64{"reject_undefined_port": 2, "drop_unallocated_service_ip": 2, "sock_reject_undefined_port": 1} {
		if got := datapathEvents(t, m.node, "127.0.0.1:19250", event); got < want {
			t.Errorf(`sluice_datapath_events_total{event=%q} = %v, want at least %v`, event, got, want)
		}
	}
	if t.Failed() {
		t.Logf("agent log:\n%s", agent.logs())
	}
}

// probe makes p's flow once and says what came of it: "answered by <name>",
// "refused", "dropped" (no answer within the deadline), "unreachable", or the
// error.
func (m *migrationNode) probe(t *testing.T, cg *bpftest.Cgroup, p serviceProbe) string {
	t.Helper()
	if p.fromNode {
		dir, err := os.Open(cg.Path)
		if err != nil {
			t.Fatal(err)
		}
		defer dir.Close()
		cmd := exec.Command("ip", "netns", "exec", m.node.Name, "timeout", "2", "bash", "-c",
			fmt.Sprintf(`exec 3<>/dev/tcp/%s/%d && echo probe >&3 && head -n1 <&3`, p.to.Addr(), p.to.Port()))
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return "answered by " + strings.Fields(string(out) + " ?")[0]
		case strings.Contains(string(out), "refused"):
			return "refused"
		case errors.As(err, &exit) && exit.ExitCode() == 124:
			return "dropped"
		case strings.Contains(string(out), "unreachable"):
			return "unreachable"
		}
		return fmt.Sprintf("%v: %s", err, out)
	}
	pod := m.clients[0]
	if p.network == "ping" {
		out, err := pod.Command("ping", "-n", "-c1", "-W1", p.to.Addr().String()).CombinedOutput()
		switch {
		case err == nil && strings.Contains(string(out), "from "+p.to.Addr().String()):
			return "answered"
		case strings.Contains(string(out), "Unreachable"):
			return "unreachable"
		case strings.Contains(string(out), "0 received"):
			return "dropped"
		}
		return fmt.Sprintf("%v: %s", err, out)
	}
	var answer string
	err := pod.Do(func() error {
		c, err := net.DialTimeout(p.network, p.to.String(), 1500*time.Millisecond)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(1500 * time.Millisecond))
		if _, err := fmt.Fprintln(c, "probe"); err != nil {
			return err
		}
		buf := make([]byte, 256)
		n, err := c.Read(buf)
		answer = string(buf[:n])
		return err
	})
	switch {
	case err == nil:
		return "answered by " + strings.Fields(answer + " ?")[0]
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, os.ErrDeadlineExceeded), isTimeout(err):
		return "dropped"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	}
	return err.Error()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// waitServiceNet waits until the agent's pins hold pfx as a ServiceCIDR.
func waitServiceNet(t *testing.T, pinDir string, pfx netip.Prefix) {
	t.Helper()
	set, err := maps.Open(maps.OpenOptions{PinDir: pinDir, NoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	nets, err := maps.ServiceNets.In(set)
	if err != nil {
		t.Fatal(err)
	}
	key := gen.SvcnetKeyOf(pfx)
	var seen []string
	waitFor(t, 15*time.Second, fmt.Sprintf("the agent knows the ServiceCIDR %v", pfx), func() bool {
		seen = seen[:0]
		found := false
		nets.Iterate(func(k gen.SluiceSvcnetKey, v gen.SluiceSvcnetValue) bool {
			seen = append(seen, fmt.Sprintf("%v:%d", k.Prefix(), v.Kind))
			found = found || (k == key && v.Kind == gen.SluiceSvcnetKindSVCNET_RANGE)
			return true
		})
		return found
	}, func() string { slices.Sort(seen); return strings.Join(seen, " ") })
}

// datapathEvents reads sluice_datapath_events_total{event} from the agent's
// /metrics (0 when the series is absent).
func datapathEvents(t *testing.T, ns *bpftest.NetNS, addr, event string) float64 {
	t.Helper()
	v, _ := metricValue(t, ns, addr, fmt.Sprintf("sluice_datapath_events_total{event=%q}", event))
	return v
}
