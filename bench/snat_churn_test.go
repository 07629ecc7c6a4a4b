package bench

import (
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
)

// snatChurnTestPhase is how long each phase of
// TestSNATChurnThroughANearlyFullTable dials.
const snatChurnTestPhase = 10 * time.Second

// TestSNATChurnThroughANearlyFullTable is the CI version of
// BenchmarkSNATChurn's first two phases (issue 46): the agent against a real
// API server, a client outside the cluster CIDR (every flow masqueraded to
// the node) dialling as fast as it can with 4 workers, servers that close
// first, 16 Services in turn for 10 s and then one Service for 10 s.
//
// A node that has churned like this for a minute holds the guards of its
// backends' TIME_WAIT tuples in most of its conntrack table. 20 s of traffic
// does not fill the built-in table (it takes about a minute at this rate),
// so the test starts from one the last minute left: 88% of it guards of
// flows that ended 50 to 55 s ago (to backends nothing dials now). The
// table is then under pressure within a second, and stays there.
//
// What must hold: no connection fails, no dial finds the client's own ports
// exhausted, no flow is refused for want of a SNAT port or a conntrack
// slot, and no backend rejects a SYN against its TIME_WAIT (PAWS). The
// last is what a scanner that drops the test's own guards under pressure
// breaks: a client port reused toward another Service (another timestamp
// offset in the client's kernel) then lands on the tuple a backend still
// holds. The guards the scanner must drop are the oldest: the prefilled
// ones.
func TestSNATChurnThroughANearlyFullTable(t *testing.T) {
	bpftest.Require(t)
	if _, _, err := apiservertest.Binaries(); err != nil {
		t.Skip(err)
	}
	sluice, kubeProxy := proxyBinaries(t)
	e, client := newSNATChurnEnv(t, true)
	e.startProxy(t, "sluice", sluice, kubeProxy, "--cluster-cidr=10.200.0.0/13", "--metrics-bind-address=127.0.0.1:10249")
	ips := e.createChurnServices(t, 16, e.backendIPs)
	services := addrs(ips, 80)

	ct, err := ebpf.LoadPinnedMap(filepath.Join(e.pinDir, gen.SluiceMapSlCtV2), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	fillers := fillWithOldGuards(t, ct, 0.88)
	t.Logf("conntrack table: %d entries, %d of them old guards", ct.MaxEntries(), fillers)

	scanBefore := e.metricValues(t, scannerSeries...)
	for _, phase := range []struct {
		name    string
		targets []string
	}{
		{"16 Services", services},
		{"one Service", services[:1]},
	} {
		retransBefore, backendsBefore := e.synRetrans(), backendDrops(t, e.backends)
		snatBefore := counter(t, e.pinDir, gen.SluiceCounterCNT_DROP_SNAT_PORTS)
		fullBefore := counter(t, e.pinDir, gen.SluiceCounterCNT_DROP_CT_FULL)
		res := bpftest.RunClients(client, phase.targets, 4, snatChurnTestPhase)
		backends := backendDrops(t, e.backends)
		paws := backends["PAWSTimewait"] - backendsBefore["PAWSTimewait"]
		snat := counter(t, e.pinDir, gen.SluiceCounterCNT_DROP_SNAT_PORTS) - snatBefore
		full := counter(t, e.pinDir, gen.SluiceCounterCNT_DROP_CT_FULL) - fullBefore
		t.Logf("%s: %d connections (%.0f/s), %d failed, %.0f SYN retransmits, %d listen overflows, %d PAWS rejects, %d refused for want of a SNAT port, %d for a full table",
			phase.name, res.OK+res.Failed, res.Rate(), res.Failed, e.synRetrans()-retransBefore,
			backends["ListenOverflows"]-backendsBefore["ListenOverflows"], paws, snat, full)
		for what, n := range map[string]uint64{
			"connections failed": uint64(res.Failed), "dials the client's kernel refused for want of a port": uint64(res.NoLocalPort),
			"SYNs rejected against TIME_WAIT (PAWS)": paws, "flows refused for want of a SNAT port": snat,
			"flows refused for a full conntrack table": full,
		} {
			if n != 0 {
				t.Errorf("%s: %s: %d (first error: %v)", phase.name, what, n, res.FirstErr)
			}
		}
		if res.OK == 0 {
			t.Fatalf("%s: no connection succeeded", phase.name)
		}
	}

	// The table was under pressure (flows cut to their guards), and the
	// room for the test's guards came from the old ones.
	scan := e.metricValues(t, scannerSeries...)
	cut := scan[scannerSeries[1]] - scanBefore[scannerSeries[1]]
	dropped := scan[scannerSeries[0]] - scanBefore[scannerSeries[0]]
	left := countOldGuards(t, ct)
	t.Logf("scanner: %.0f flows cut to their guard, %.0f guards dropped early, %d of %d old guards left, %.0f entries",
		cut, dropped, left, fillers, scan[scannerSeries[2]])
	if cut == 0 {
		t.Error("no flow was cut to its guard: the table never came under pressure, and the test tested nothing")
	}
	if left == fillers {
		t.Error("no old guard was dropped")
	}
}

// oldGuardBackend is the address of the prefilled guards' backend, which
// no Service has: nothing the test dials clashes with them.
var oldGuardBackend = netip.MustParseAddr("10.207.200.1")

// fillWithOldGuards fills ct to fill of its capacity with the guards of
// flows whose server closed first 50 to 55 s ago, oldest first: reverse
// entries alone, from oldGuardBackend's ports to the node's, the state the
// scanner leaves a flow in under pressure. It returns how many it wrote.
func fillWithOldGuards(t *testing.T, ct *ebpf.Map, fill float64) int {
	n := int(fill * float64(ct.MaxEntries()))
	now := gen.Monotonic()
	keys := make([]gen.SluiceCtKey, n)
	values := make([]gen.SluiceCtValue, n)
	for i := range n {
		keys[i] = oldGuardKey(i)
		seen := uint64(now - 55*time.Second + time.Duration(i)*5*time.Second/time.Duration(n))
		values[i] = gen.SluiceCtValue{
			Created: seen - uint64(time.Second), LastSeen: seen, Type: gen.SluiceCtTypeCT_REVERSE,
			// SYN, ACK and FIN seen from the server, its FIN first.
			TcpSeen: 0x02 | 0x10 | 0x01 | uint32(gen.SluiceCtSeenCT_SEEN_FIN_FIRST|gen.SluiceCtSeenCT_SEEN_PACKET),
			// The forward entry the scanner already dropped.
			Peer: bpftest.CtKey(netip.AddrPortFrom(netip.MustParseAddr("10.199.0.2"), uint16(i%50000+1024)),
				netip.MustParseAddrPort("10.96.255.1:80"), bpftest.ProtoTCP),
		}
	}
	if _, err := ct.BatchUpdate(keys, values, nil); err != nil {
		t.Fatalf("prefill the conntrack table with %d old guards: %v", n, err)
	}
	return n
}

// oldGuardKey is the i-th prefilled guard's key: oldGuardBackend:8080 to
// the node's port 1024 + i/64 from one of 64 node addresses.
func oldGuardKey(i int) gen.SluiceCtKey {
	node := netip.AddrFrom4([4]byte{10, 198, 0, byte(i % 64)})
	return bpftest.CtKey(netip.AddrPortFrom(oldGuardBackend, 8080), netip.AddrPortFrom(node, uint16(1024+i/64)), bpftest.ProtoTCP)
}

// countOldGuards counts the prefilled guards still in ct.
func countOldGuards(t *testing.T, ct *ebpf.Map) int {
	backend := gen.NetAddr(oldGuardBackend)
	var k gen.SluiceCtKey
	var v gen.SluiceCtValue
	n := 0
	it := ct.Iterate()
	for it.Next(&k, &v) {
		if k.Saddr == backend {
			n++
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
