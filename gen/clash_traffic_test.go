package gen_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// A pod client alternating Service and direct connections to the same
// backends, behind servers that close first, at full rate with its ephemeral
// ports narrowed so that they are reused across destinations: every
// connection must succeed at once. A tuple clash shows as a SYN the backend
// drops (PAWS against its TIME_WAIT, or a segment of another connection) and
// the client retransmits a second later.
func TestRealClientsReusingPortsAcrossServiceAndDirect(t *testing.T) {
	d := newDP(t)
	names := []string{"b1", "b2", "b3"}
	topo := bpftest.NewTopology(t, d, append([]string{"client"}, names...)...)
	var backends []bpftest.Backend
	for _, n := range names {
		bpftest.ServeCloseFirst(t, topo.Pods[n], n, ":8080")
		backends = append(backends, bpftest.Backend{AP: netip.AddrPortFrom(topo.PodIP[n], 8080), Local: true})
	}
	vip := netip.MustParseAddrPort("10.96.0.10:80")
	d.AddService(bpftest.Service{ID: 1, Front: vip, Proto: protoTCP, Backends: backends})
	client := topo.Pods["client"]
	client.Run("sysctl", "-qw", "net.ipv4.ip_local_port_range=40000 40063")

	stats := clientStats{ns: client, backends: names, topo: topo}
	stats.snapshot(t)
	targets := []string{vip.String()}
	for _, b := range backends {
		targets = append(targets, b.AP.String())
	}
	res := runClients(t, client, targets, 4, 5*time.Second)
	retrans, paws := stats.delta(t)
	t.Logf("%d connections in %v (%.0f/s), %d failed, %d SYN retransmits, %d PAWS TIME_WAIT rejects, %d tuples remapped, %d reopened",
		res.ok+res.failed, res.elapsed, float64(res.ok)/res.elapsed.Seconds(), res.failed, retrans, paws,
		d.Counter(gen.SluiceCounterCNT_TUPLE_REMAPPED), d.Counter(gen.SluiceCounterCNT_TUPLE_REUSED))
	if t.Failed() || res.failed != 0 || retrans != 0 || paws != 0 {
		logCounters(t, d)
	}
	if res.failed != 0 {
		t.Errorf("%d connections failed; first error: %v", res.failed, res.firstErr)
	}
	if retrans != 0 {
		t.Errorf("client retransmitted %d SYNs", retrans)
	}
	if paws != 0 {
		t.Errorf("backends rejected %d SYNs against TIME_WAIT (PAWS)", paws)
	}
	if res.ok < 1000 {
		t.Errorf("only %d connections in %v", res.ok, res.elapsed)
	}
	if d.Counter(gen.SluiceCounterCNT_TUPLE_REMAPPED) == 0 {
		t.Error("no tuple was remapped: the test did not make ports clash")
	}
}

type clientStats struct {
	ns       *bpftest.NetNS
	backends []string
	topo     *bpftest.Topology
	retrans  uint64
	paws     uint64
}

func (s *clientStats) read(t *testing.T) (retrans, paws uint64) {
	t.Helper()
	c, err := bpftest.Netstat(s.ns, "TcpExt", "TCPSynRetrans")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range s.backends {
		v, err := bpftest.Netstat(s.topo.Pods[b], "TcpExt", "PAWSTimewait")
		if err != nil {
			t.Fatal(err)
		}
		paws += v["PAWSTimewait"]
	}
	return c["TCPSynRetrans"], paws
}

func (s *clientStats) snapshot(t *testing.T) { s.retrans, s.paws = s.read(t) }

func (s *clientStats) delta(t *testing.T) (retrans, paws uint64) {
	r, p := s.read(t)
	return r - s.retrans, p - s.paws
}

type clientResult struct {
	ok, failed int
	firstErr   error
	elapsed    time.Duration
}

// runClients runs workers in ns that connect to the targets in turn, read
// the server's line and close, until the duration is over.
func runClients(t *testing.T, ns *bpftest.NetNS, targets []string, workers int, duration time.Duration) clientResult {
	t.Helper()
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(duration)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := ns.Do(func() error {
				for i := w; time.Now().Before(deadline); i++ {
					if err := connectOnce(targets[i%len(targets)]); err != nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err)
						continue
					}
					ok.Add(1)
				}
				return nil
			})
			if err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
		}()
	}
	wg.Wait()
	r := clientResult{ok: int(ok.Load()), failed: int(failed.Load()), elapsed: time.Since(start)}
	if e, _ := firstErr.Load().(error); e != nil {
		r.firstErr = e
	}
	return r
}

func connectOnce(target string) error {
	c, err := net.DialTimeout("tcp4", target, 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	// Read to the end: the server closes first, the client after it.
	answer, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("%s: %w", target, err)
	}
	if !bytes.HasSuffix(answer, []byte("\n")) {
		return fmt.Errorf("%s: answer %q", target, answer)
	}
	return nil
}
