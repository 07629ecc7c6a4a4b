package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/maps"
)

// An agent restarted with a conntrack table of another size migrates the
// flows into the new tables, both families': keep-alive connections opened
// before, over IPv4 and IPv6, go on across the restart (without the
// migration the agent refused to start until `sluice cleanup`, which drops
// every flow; before both tables followed the flags, the IPv6 one kept the
// built-in size).
func TestConntrackResizeKeepsConnections(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := newDemoAgent(ctx, t)
	capacity := func(name string) uint32 {
		m, err := ebpf.LoadPinnedMap(filepath.Join(d.pinDir, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		return m.MaxEntries()
	}

	first := d.start(t)
	before, before6 := capacity(maps.Conntrack.Name), capacity(maps.Conntrack6.Name)
	conns := []*keepAlive{dialKeepAlive(t, d.pod("client"), "10.96.0.10:80"), dialKeepAlive(t, d.pod("client"), "[fd00:96::10]:80")}
	var backends []string
	for _, conn := range conns {
		backend, err := conn.get()
		if err != nil {
			t.Fatal(err)
		}
		backends = append(backends, backend)
	}
	first.stop()

	// 4,000 flows per core: the table holds max(131,072, 4,000 × CPUs)
	// flows, two entries each.
	second := d.start(t, "--conntrack-max-per-core", "4000")
	if got := capacity(maps.Conntrack.Name); got == before || got != 2*131072 {
		t.Fatalf("conntrack capacity %d after the restart (was %d), want %d\n%s", got, before, 2*131072, second.logs())
	}
	if got := capacity(maps.Conntrack6.Name); got == before6 || got != 2*131072 {
		t.Fatalf("IPv6 conntrack capacity %d after the restart (was %d), want %d\n%s", got, before6, 2*131072, second.logs())
	}
	for c, conn := range conns {
		for i := range 5 {
			got, err := conn.get()
			if err != nil {
				t.Fatalf("connection %d, request %d after the resize: the connection broke: %v\n%s", c, i, err, second.logs())
			}
			if got != backends[c] {
				t.Fatalf("connection %d, request %d answered by %s, the connection was with %s", c, i, got, backends[c])
			}
		}
	}
	for _, name := range []string{maps.Conntrack.Name, maps.Conntrack6.Name} {
		if l := second.logs(); !strings.Contains(l, "map migrated") || !strings.Contains(l, "from="+name) {
			t.Fatalf("the migration of %s is not logged:\n%s", name, l)
		}
	}
}
