package nat_test

import (
	"fmt"
	"log"
	"net/netip"
	"os"
	"testing"

	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
	"golang.org/x/sys/unix"
)

// Program one Service into maps pinned on a private bpffs and read the
// frontends back. The syncer knows nothing of Kubernetes: a service port and
// its endpoints are plain values. It needs BPF privileges.
func ExampleSyncer_Apply() {
	dir, err := os.MkdirTemp("", "sluice-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := unix.Mount("bpffs", dir, "bpf", 0, ""); err != nil {
		log.Fatal(err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)

	set, err := maps.Open(maps.OpenOptions{PinDir: dir})
	if err != nil {
		log.Fatal(err)
	}
	defer set.Close()
	syncer, err := nat.NewSyncer(nat.Options{Maps: set})
	if err != nil {
		log.Fatal(err)
	}
	web := nat.ServicePortName{Namespace: "demo", Name: "web", Port: "http"}
	stats, err := syncer.Apply(nat.State{
		Node: nat.Node{Name: "node-a", NodePortIPs: []netip.Addr{netip.MustParseAddr("10.210.0.1")}},
		Services: map[nat.ServicePortName]*nat.ServicePort{web: {
			Name: web, ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: nat.TCP, NodePort: 30080}},
		Endpoints: map[nat.ServicePortName][]nat.Endpoint{web: {
			{Addr: netip.MustParseAddrPort("10.201.0.2:8080"), Ready: true, Serving: true, Local: true},
			{Addr: netip.MustParseAddrPort("10.202.0.2:8080"), Ready: true, Serving: true}}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("map writes:", stats.Writes)
	frontends, err := nat.ReadFrontends(set)
	if err != nil {
		log.Fatal(err)
	}
	for _, fe := range frontends {
		fmt.Println(fe.Address, fe.Protocol, fe.Count, "backends")
	}
}

// The example, run and checked (it needs privileges, so it is no Go example
// with an Output comment).
func TestExampleSyncerApply(t *testing.T) {
	bpftest.Require(t)
	got := bpftest.Stdout(t, ExampleSyncer_Apply)
	want := "map writes: 8\n10.96.0.10:80 TCP 2 backends\n10.210.0.1:30080 TCP 2 backends\n"
	if got != want {
		t.Fatalf("the example printed\n%s\nwant\n%s", got, want)
	}
}
