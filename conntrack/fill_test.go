package conntrack_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/maps"
)

func TestNearlyFullMapWarnsAndReportsByType(t *testing.T) {
	bpftest.Require(t)
	spec, err := gen.Spec()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps[maps.Conntrack.Name].Copy()
	ms.MaxEntries = 20
	raw, err := ebpf.NewMap(ms)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ct, err := maps.NewMap[gen.SluiceCtKey, gen.SluiceCtValue](raw)
	if err != nil {
		t.Fatal(err)
	}
	now := conntrack.Monotonic()
	for i := range 19 {
		k := gen.SluiceCtKey{Saddr: uint32(i + 1), Proto: 17}
		v := gen.SluiceCtValue{Created: uint64(now), LastSeen: uint64(now), Type: gen.SluiceCtTypeCT_REVERSE}
		if i%2 == 0 {
			v.Type, k.Proto = gen.SluiceCtTypeCT_FORWARD, 6
		}
		if err := ct.Put(k, v, 0); err != nil {
			t.Fatal(err)
		}
	}
	var logs bytes.Buffer
	var seen conntrack.ScanStats
	sc, err := conntrack.NewScanner(conntrack.Options{Conntrack: ct,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), OnScan: func(s conntrack.ScanStats) { seen = s }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Scan(); err != nil {
		t.Fatal(err)
	}
	if seen.Entries != 19 || seen.Forward != 10 || seen.Reverse != 9 || seen.TCP != 10 || seen.UDP != 9 || seen.Capacity != 20 {
		t.Fatalf("stats %+v", seen)
	}
	out := logs.String()
	if !strings.Contains(out, "nearly full") || !strings.Contains(out, "map="+maps.Conntrack.Name) || !strings.Contains(out, "capacity=20") {
		t.Fatalf("no warning naming the map and its size: %q", out)
	}
}
