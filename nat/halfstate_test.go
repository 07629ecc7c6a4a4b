package nat_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
)

// While one goroutine applies random changes to services, another sends packets
// through the datapath to every service; no packet may ever find a frontend
// whose backend is missing.
func TestNoHalfStateUnderConcurrentChanges(t *testing.T) {
	f := newFixture(t, nat.Options{})
	objs, err := gen.Load(gen.LoadOptions{Maps: f.set.All()})
	if err != nil {
		t.Fatalf("%+v", err)
	}
	defer objs.Close()
	counters, err := maps.Counters.In(f.set)
	if err != nil {
		t.Fatal(err)
	}

	const nServices = 40
	rng := rand.New(rand.NewPCG(7, 7))
	svcs := make([]*nat.ServicePort, nServices)
	for i := range svcs {
		svcs[i] = svc(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.3.%d", i), 80)
	}
	randomEndpoints := func() []nat.Endpoint {
		n := rng.IntN(6) // 0..5: services gain, lose and lose all endpoints
		out := make([]nat.Endpoint, n)
		for j := range out {
			out[j] = nat.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(rng.IntN(4)), byte(rng.IntN(250))}), 8080), Ready: true, Serving: true}
		}
		return out
	}

	var stop atomic.Bool
	var applies atomic.Int64
	var wg sync.WaitGroup
	defer func() { stop.Store(true); wg.Wait() }() // also when the test fails early
	wg.Add(1)
	go func() {
		defer wg.Done()
		e := map[nat.ServicePortName][]nat.Endpoint{}
		present := make([]bool, nServices)
		for !stop.Load() {
			for range 5 {
				i := rng.IntN(nServices)
				present[i] = rng.IntN(5) != 0
				e[svcs[i].Name] = randomEndpoints()
			}
			st := nat.State{Node: f.node, Services: map[nat.ServicePortName]*nat.ServicePort{}, Endpoints: e}
			for i, s := range svcs {
				if present[i] {
					st.Services[s.Name] = s
				}
			}
			if _, err := f.s.Apply(st); err != nil {
				t.Error(err)
				return
			}
			applies.Add(1)
		}
	}()

	packets := 0
	deadline := time.Now().Add(2 * time.Second)
	client := netip.MustParseAddr("10.1.0.5")
	for time.Now().Before(deadline) {
		for i, s := range svcs {
			src := netip.AddrPortFrom(client, uint16(1024+packets%60000))
			frame := bpftest.TCPPacket(src, netip.AddrPortFrom(s.ClusterIP, 80), bpftest.SYN)
			ret, err := objs.SlFromWl.Run(&ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+64)})
			if err != nil {
				t.Fatal(err)
			}
			if ret != bpftest.ActOK && ret != bpftest.ActRedirect {
				missing, _ := maps.Sum(counters, gen.SluiceCounterCNT_DROP_BACKEND_MISSING)
				t.Fatalf("service %d: verdict %d (backend-missing drops %d)", i, ret, missing)
			}
			packets++
		}
	}
	stop.Store(true)
	wg.Wait()
	missing, err := maps.Sum(counters, gen.SluiceCounterCNT_DROP_BACKEND_MISSING)
	if err != nil {
		t.Fatal(err)
	}
	if missing != 0 {
		t.Fatalf("%d packets found a frontend with a missing backend", missing)
	}
	if applies.Load() < 50 || packets < 1000 {
		t.Fatalf("too little concurrency to mean anything: %d applies, %d packets", applies.Load(), packets)
	}
	t.Logf("%d applies, %d packets, no half state seen", applies.Load(), packets)
}
