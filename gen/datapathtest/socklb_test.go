package datapathtest_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// socklbEnv: a node namespace whose loopback carries the backends
// (127.0.0.2-4), a child cgroup with the socket-LB programs attached, and the
// services in the maps.
type socklbEnv struct {
	d  *bpftest.Datapath
	ns *bpftest.NetNS
	cg *bpftest.Cgroup
}

func newSocklbEnv(t *testing.T) *socklbEnv {
	e := &socklbEnv{d: newDP(t), ns: bpftest.NewNetNS(t), cg: bpftest.NewCgroup(t)}
	for _, a := range []struct {
		prog *ebpf.Program
		at   ebpf.AttachType
	}{
		{e.d.Objs.SlConnect4, ebpf.AttachCGroupInet4Connect},
		{e.d.Objs.SlSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{e.d.Objs.SlRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		{e.d.Objs.SlGetpeername4, ebpf.AttachCgroupInet4GetPeername},
		{e.d.Objs.SlSockEgress, ebpf.AttachCGroupInetEgress},
		{e.d.Objs.SlConnect6, ebpf.AttachCGroupInet6Connect},
		{e.d.Objs.SlSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		{e.d.Objs.SlRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
		{e.d.Objs.SlGetpeername6, ebpf.AttachCgroupInet6GetPeername},
	} {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: e.cg.Path, Attach: a.at, Program: a.prog})
		if err != nil {
			t.Fatalf("attach %v: %v", a.prog, err)
		}
		t.Cleanup(func() { l.Close() })
	}
	return e
}

func fields(line string) map[string]string {
	out := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			out[k] = v
		}
	}
	return out
}

func TestSocketLBTCPConnectAndGetpeername(t *testing.T) {
	e := newSocklbEnv(t)
	b1, b2 := netip.MustParseAddrPort("127.0.0.2:8080"), netip.MustParseAddrPort("127.0.0.3:8080")
	bpftest.ServeTCP(t, e.ns, "b1", b1.String())
	bpftest.ServeTCP(t, e.ns, "b2", b2.String())
	e.d.AddService(bpftest.Service{ID: 1, Front: vipAP, Proto: protoTCP, Backends: []bpftest.Backend{{AP: b1}, {AP: b2}}})

	seen := map[string]bool{}
	for range 12 {
		out := e.cg.RunHelper(e.ns, "tcp", vipAP.String())
		if len(out) != 1 {
			t.Fatalf("helper said %q", out)
		}
		f := fields(out[0])
		if f["peer"] != vipAP.String() {
			t.Fatalf("getpeername gave %q, want the ClusterIP %v (%q)", f["peer"], vipAP, out[0])
		}
		if !strings.HasPrefix(f["answer"], "b") {
			t.Fatalf("no answer from a backend: %q", out[0])
		}
		seen[f["answer"]] = true
	}
	if !seen["b1"] || !seen["b2"] {
		t.Fatalf("12 connects reached %v, want both backends", seen)
	}
}

func TestSocketLBAffinityHoldsAcrossConnects(t *testing.T) {
	e := newSocklbEnv(t)
	var backends []bpftest.Backend
	for i := 2; i <= 4; i++ {
		ap := netip.MustParseAddrPort(fmt.Sprintf("127.0.0.%d:8080", i))
		bpftest.ServeTCP(t, e.ns, fmt.Sprintf("b%d", i), ap.String())
		backends = append(backends, bpftest.Backend{AP: ap})
	}
	e.d.AddService(bpftest.Service{ID: 1, Front: vipAP, Proto: protoTCP, Backends: backends, Affinity: 60})
	first := ""
	for i := range 10 {
		f := fields(e.cg.RunHelper(e.ns, "tcp", vipAP.String())[0])
		if i == 0 {
			first = f["answer"]
		} else if f["answer"] != first {
			t.Fatalf("connect %d reached %s, affinity says %s", i, f["answer"], first)
		}
	}
}

func TestSocketLBNoEndpointsRefuses(t *testing.T) {
	e := newSocklbEnv(t)
	e.d.AddService(bpftest.Service{ID: 1, Front: vipAP, Proto: protoTCP})
	out := e.cg.RunHelper(e.ns, "tcp", vipAP.String())
	if len(out) != 1 || !strings.Contains(out[0], "connection refused") {
		t.Fatalf("connect to a service without endpoints: %q, want connection refused", out)
	}
	if e.d.Counter(gen.SluiceCounterCNT_SOCK_REJECT_NO_ENDPOINTS) != 1 {
		t.Fatal("refusal not counted")
	}
}

func TestSocketLBUDPSendtoReplyComesFromService(t *testing.T) {
	e := newSocklbEnv(t)
	dns := netip.MustParseAddrPort("10.96.0.53:53")
	be := netip.MustParseAddrPort("127.0.0.2:5353")
	bpftest.ServeUDPEcho(t, e.ns, "dns", be.String())
	e.d.AddService(bpftest.Service{ID: 2, Front: dns, Proto: protoUDP, Backends: []bpftest.Backend{{AP: be}}})
	out := e.cg.RunHelper(e.ns, "udp-sendto", dns.String())
	f := fields(out[0])
	if f["from"] != dns.String() || f["answer"] != "dns" {
		t.Fatalf("reply %q: want it from the service address %v", out[0], dns)
	}
}

// A connected UDP socket pinned to a backend that leaves its service: the next
// send fails, and the client's new socket reaches a live backend.
func TestSocketLBConnectedUDPBackendRemoved(t *testing.T) {
	e := newSocklbEnv(t)
	dns := netip.MustParseAddrPort("10.96.0.53:53")
	b1, b2 := netip.MustParseAddrPort("127.0.0.2:5353"), netip.MustParseAddrPort("127.0.0.3:5353")
	bpftest.ServeUDPEcho(t, e.ns, "b1", b1.String())
	bpftest.ServeUDPEcho(t, e.ns, "b2", b2.String())
	e.d.AddService(bpftest.Service{ID: 2, Front: dns, Proto: protoUDP, Backends: []bpftest.Backend{{AP: b1}}})

	h := e.cg.StartHelper(e.ns, "udp-connected", dns.String())
	if line, err := h.Line(); err != nil || line != "answer=b1 1" {
		t.Fatalf("first answer %q %v", line, err)
	}
	// The sync replaces b1 by b2.
	e.d.Put(e.d.Objs.SlBeV1, gen.SluiceBeKey{SvcId: 2}, gen.SluiceBeValue{Addr: gen.NetAddr(b2.Addr()), Port: gen.NetPort(b2.Port())})
	fmt.Fprintln(h.Stdin)
	if line, err := h.Line(); err != nil || !strings.HasPrefix(line, "send-error=") || !strings.Contains(line, "operation not permitted") {
		t.Fatalf("send on the socket pinned to the removed backend: %q %v, want it to fail", line, err)
	}
	if line, err := h.Line(); err != nil || line != "answer=b2 3" {
		t.Fatalf("after reconnecting: %q %v, want b2", line, err)
	}
	if e.d.Counter(gen.SluiceCounterCNT_SOCK_STALE_BACKEND) != 1 {
		t.Fatal("stale backend not counted")
	}
}

func TestSocketLBHostNamespaceOnly(t *testing.T) {
	e := newSocklbEnv(t)
	b1 := netip.MustParseAddrPort("127.0.0.2:8080")
	bpftest.ServeTCP(t, e.ns, "b1", b1.String())
	e.d.AddService(bpftest.Service{ID: 1, Front: vipAP, Proto: protoTCP, Backends: []bpftest.Backend{{AP: b1}}})
	other := bpftest.NewNetNS(t)
	setHost := func(ns *bpftest.NetNS) {
		cookie, err := bpftest.NetnsCookie(ns)
		if err != nil {
			t.Fatal(err)
		}
		e.d.Put(e.d.Objs.SlConfigV1, uint32(0), gen.SluiceConfig{NodeIp: gen.NetAddr(nodeIP),
			HostNetnsCookie: cookie, Flags: gen.SluiceConfigFlagsCFG_SOCKLB_HOST_ONLY})
	}
	setHost(other) // the client's namespace is a "pod": not balanced at the socket
	if out := e.cg.RunHelper(e.ns, "tcp", vipAP.String()); !strings.Contains(out[0], "network is unreachable") {
		t.Fatalf("socket LB applied outside the host namespace: %q", out)
	}
	setHost(e.ns)
	if f := fields(e.cg.RunHelper(e.ns, "tcp", vipAP.String())[0]); f["answer"] != "b1" {
		t.Fatalf("socket LB not applied in the host namespace: %v", f)
	}
}

// loadBalancerSourceRanges hold on the socket path: a host socket is balanced
// at connect() only if the node's address is inside the ranges; otherwise it
// is left to the TC path, which judges the packet's real source.
func TestSocketLBHonoursSourceRanges(t *testing.T) {
	e := newSocklbEnv(t)
	b1 := netip.MustParseAddrPort("127.0.0.2:8080")
	bpftest.ServeTCP(t, e.ns, "b1", b1.String())
	lb := netip.MustParseAddrPort("203.0.113.80:80")
	e.d.AddService(bpftest.Service{ID: 1, Front: lb, Proto: protoTCP, Backends: []bpftest.Backend{{AP: b1}},
		Flags: gen.SluiceFeFlagsFE_EXTERNAL | gen.SluiceFeFlagsFE_SRC_RANGES})
	allow := func(p netip.Prefix) {
		e.d.Put(e.d.Objs.SlSrcrangeV1, gen.SluiceSrcrangeKey{Prefixlen: uint32(32 + p.Bits()), SvcId: gen.NetUint32(1),
			Src: gen.NetAddr(p.Addr())}, gen.SluiceSrcrangeValue{})
	}
	allow(netip.MustParsePrefix("192.0.2.0/24")) // not the node
	if out := e.cg.RunHelper(e.ns, "tcp", lb.String()); !strings.Contains(out[0], "network is unreachable") {
		t.Fatalf("a host socket outside the source ranges was balanced: %q", out)
	}
	allow(netip.PrefixFrom(nodeIP, 32))
	if f := fields(e.cg.RunHelper(e.ns, "tcp", lb.String())[0]); f["answer"] != "b1" {
		t.Fatalf("a host socket inside the source ranges was not balanced: %v", f)
	}
}
