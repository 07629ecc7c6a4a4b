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
// flows into the new table: a keep-alive connection opened before goes on
// across the restart (without the migration the agent refused to start
// until `sluice cleanup`, which drops every flow).
func TestConntrackResizeKeepsConnections(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := newDemoAgent(ctx, t)
	capacity := func() uint32 {
		m, err := ebpf.LoadPinnedMap(filepath.Join(d.pinDir, maps.Conntrack.Name), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		return m.MaxEntries()
	}

	first := d.start(t)
	before := capacity()
	conn := dialKeepAlive(t, d.pod("client"), "10.96.0.10:80")
	backend, err := conn.get()
	if err != nil {
		t.Fatal(err)
	}
	first.stop()

	// 4,000 flows per core: the table holds max(131,072, 4,000 × CPUs)
	// flows, two entries each.
	second := d.start(t, "--conntrack-max-per-core", "4000")
	if got := capacity(); got == before || got != 2*131072 {
		t.Fatalf("conntrack capacity %d after the restart (was %d), want %d\n%s", got, before, 2*131072, second.logs())
	}
	for i := range 5 {
		got, err := conn.get()
		if err != nil {
			t.Fatalf("request %d after the resize: the connection broke: %v\n%s", i, err, second.logs())
		}
		if got != backend {
			t.Fatalf("request %d answered by %s, the connection was with %s", i, got, backend)
		}
	}
	if l := second.logs(); !strings.Contains(l, "map migrated") || !strings.Contains(l, maps.Conntrack.Name) {
		t.Fatalf("the migration is not logged:\n%s", l)
	}
}
