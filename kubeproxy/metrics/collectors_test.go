package metrics_test

import (
	"fmt"
	"iter"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy/metrics"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
)

// The per-service and per-rule collectors read the datapath's maps at
// scrape time: values summed over CPUs (and over a service's backend sets),
// named from the syncer's ids and the policy's rules; unknown rule ids are
// left out.
func TestServiceAndRuleCollectors(t *testing.T) {
	set, stats := openSvcStats(t)
	cpus := ebpf.MustPossibleCPU()
	put := func(id uint32, v gen.SluiceSvcstatsValue) {
		vs := make([]gen.SluiceSvcstatsValue, cpus)
		vs[0], vs[cpus-1] = v, v // counted on two CPUs (one when there is one)
		if err := stats.Put(id, vs, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	put(3, gen.SluiceSvcstatsValue{FwdPackets: 5, FwdBytes: 500, RevPackets: 4, RevBytes: 4000, NewFlows: 2})
	put(9, gen.SluiceSvcstatsValue{FwdPackets: 1, FwdBytes: 100, NewFlows: 1}) // web's set for a remote node's NodePort
	ids := fromMap(map[nat.ServicePortName][]uint32{{Namespace: "demo", Name: "web", Port: "http"}: {3, 9}})
	rules, err := maps.RuleCtrs.In(set)
	if err != nil {
		t.Fatal(err)
	}
	for id, n := range map[uint64]uint64{42: 7, 43: 1} {
		vs := make([]uint64, cpus)
		vs[0] = n
		if err := rules.Put(gen.SluiceRulectrKey{RuleId: id}, vs, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	names := func(id uint32) (string, string, bool) {
		if id == 42 {
			return "networkpolicy demo/web", "ingress rule 0 peer 0 port 0", true
		}
		return "", "", false // 43: a removed policy's
	}
	reg := prometheus.NewRegistry()
	svc, err := metrics.NewServiceCollector(metrics.ServiceCollectorOptions{IDs: ids, Stats: stats, Series: metrics.ServiceSeriesAll})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(svc, metrics.NewRuleCollector(rules, names))
	both := uint64(2)
	if cpus == 1 {
		both = 1
	}
	want := strings.ReplaceAll(`
# HELP sluice_policy_rule_hits_total New flows a policy rule decided, by policy and rule (ids of removed policies are left out)
# TYPE sluice_policy_rule_hits_total counter
sluice_policy_rule_hits_total{policy="networkpolicy demo/web",rule="ingress rule 0 peer 0 port 0",rule_id="42"} 7
# HELP sluice_service_new_flows_total Flows balanced to a backend of the service (ports chosen by --service-metrics)
# TYPE sluice_service_new_flows_total counter
sluice_service_new_flows_total{ip_family="IPv4",namespace="demo",port="http",service="web"} NF
# HELP sluice_service_packets_total Packets of a service's flows, by direction: to_service (client to backend) or reply (ports chosen by --service-metrics)
# TYPE sluice_service_packets_total counter
sluice_service_packets_total{direction="reply",ip_family="IPv4",namespace="demo",port="http",service="web"} RP
sluice_service_packets_total{direction="to_service",ip_family="IPv4",namespace="demo",port="http",service="web"} FP
`, "NF", strconv.FormatUint(3*both, 10))
	want = strings.ReplaceAll(strings.ReplaceAll(want, "RP", strconv.FormatUint(4*both, 10)), "FP", strconv.FormatUint(6*both, 10))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_policy_rule_hits_total",
		"sluice_service_new_flows_total", "sluice_service_packets_total"); err != nil {
		t.Fatal(err)
	}
}

// --service-metrics=active: series only for service ports that carried
// traffic, at most the limit of them, in the order they started (name order
// within a scrape); the node's totals count every port, also one whose id
// a new port took over, and never go down.
func TestServiceSeriesActive(t *testing.T) {
	_, stats := openSvcStats(t)
	cpus := ebpf.MustPossibleCPU()
	add := func(id uint32, flows, packets uint64) {
		vs, err := stats.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		vs[cpus-1].NewFlows += flows
		vs[cpus-1].FwdPackets += packets
		vs[cpus-1].FwdBytes += 100 * packets
		if err := stats.Put(id, vs, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	port := func(name string, v6 bool) nat.ServicePortName {
		return nat.ServicePortName{Namespace: "demo", Name: name, Port: "http", IPv6: v6}
	}
	ids := map[nat.ServicePortName][]uint32{port("a", false): {1, 4}, port("b", false): {2}, port("c", false): {3}, port("d", true): {5}}
	var logs strings.Builder
	svc, err := metrics.NewServiceCollector(metrics.ServiceCollectorOptions{
		IDs:   func(yield func(nat.ServicePortName, uint32) bool) { fromMap(ids)(yield) },
		Stats: stats, Limit: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(svc)
	check := func(step, want string) {
		t.Helper()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_service_new_flows_total",
			"sluice_all_services_new_flows_total", "sluice_service_series", "sluice_service_series_omitted"); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	const head = `
# HELP sluice_all_services_new_flows_total Flows balanced to a backend of any service on this node
# TYPE sluice_all_services_new_flows_total counter
`
	const flowsHead = `
# HELP sluice_service_new_flows_total Flows balanced to a backend of the service (ports chosen by --service-metrics)
# TYPE sluice_service_new_flows_total counter
`
	gauges := func(shown, omitted int) string {
		return fmt.Sprintf(`
# HELP sluice_service_series Service ports exported with series of their own (sluice_service_*)
# TYPE sluice_service_series gauge
sluice_service_series %d
# HELP sluice_service_series_omitted Service ports that carried traffic but have no series of their own: --service-metrics-limit is reached
# TYPE sluice_service_series_omitted gauge
sluice_service_series_omitted %d
`, shown, omitted)
	}

	// No service port at all (a node before its first sync): zero totals.
	none := ids
	ids = map[nat.ServicePortName][]uint32{}
	check("no service port", head+`sluice_all_services_new_flows_total{ip_family="IPv4"} 0
sluice_all_services_new_flows_total{ip_family="IPv6"} 0
`+gauges(0, 0))
	ids = none

	// Nothing has traffic: totals only.
	check("idle", head+`sluice_all_services_new_flows_total{ip_family="IPv4"} 0
sluice_all_services_new_flows_total{ip_family="IPv6"} 0
`+gauges(0, 0))

	// a (on its second id), c and d carry traffic; the limit of 2 takes a
	// and c, and leaves d out (it still counts in the totals).
	add(4, 2, 10)
	add(3, 1, 1)
	add(5, 7, 7)
	check("three active", head+`sluice_all_services_new_flows_total{ip_family="IPv4"} 3
sluice_all_services_new_flows_total{ip_family="IPv6"} 7
`+flowsHead+`sluice_service_new_flows_total{ip_family="IPv4",namespace="demo",port="http",service="a"} 2
sluice_service_new_flows_total{ip_family="IPv4",namespace="demo",port="http",service="c"} 1
`+gauges(2, 1))
	if !strings.Contains(logs.String(), "limit=2") {
		t.Fatalf("the limit was not logged:\n%s", logs.String())
	}

	// a goes away and e takes its id 4 with a's counts still in the slot:
	// e starts from zero, the IPv4 total keeps a's flows, and a's place
	// among the series goes to d.
	delete(ids, port("a", false))
	ids[port("e", false)] = []uint32{4}
	check("a removed", head+`sluice_all_services_new_flows_total{ip_family="IPv4"} 3
sluice_all_services_new_flows_total{ip_family="IPv6"} 7
`+flowsHead+`sluice_service_new_flows_total{ip_family="IPv4",namespace="demo",port="http",service="c"} 1
sluice_service_new_flows_total{ip_family="IPv6",namespace="demo",port="http",service="d"} 7
`+gauges(2, 0))
	add(4, 5, 5)
	check("e active", head+`sluice_all_services_new_flows_total{ip_family="IPv4"} 8
sluice_all_services_new_flows_total{ip_family="IPv6"} 7
`+flowsHead+`sluice_service_new_flows_total{ip_family="IPv4",namespace="demo",port="http",service="c"} 1
sluice_service_new_flows_total{ip_family="IPv6",namespace="demo",port="http",service="d"} 7
`+gauges(2, 1))

	// The map made anew (zeroed): the ports count from zero again, the
	// totals keep what was counted.
	for id := range uint32(6) {
		if err := stats.Put(id, make([]gen.SluiceSvcstatsValue, cpus), ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	check("zeroed", head+`sluice_all_services_new_flows_total{ip_family="IPv4"} 8
sluice_all_services_new_flows_total{ip_family="IPv6"} 7
`+flowsHead+`sluice_service_new_flows_total{ip_family="IPv4",namespace="demo",port="http",service="c"} 0
sluice_service_new_flows_total{ip_family="IPv6",namespace="demo",port="http",service="d"} 0
`+gauges(2, 0))
	add(4, 1, 1)
	check("after zeroed", head+`sluice_all_services_new_flows_total{ip_family="IPv4"} 9
sluice_all_services_new_flows_total{ip_family="IPv6"} 7
`+flowsHead+`sluice_service_new_flows_total{ip_family="IPv4",namespace="demo",port="http",service="c"} 0
sluice_service_new_flows_total{ip_family="IPv6",namespace="demo",port="http",service="d"} 0
`+gauges(2, 1))
}

// --service-metrics=none exports the totals only, and a value that is not
// a mode is refused, naming it.
func TestServiceSeriesNoneAndBadMode(t *testing.T) {
	_, stats := openSvcStats(t)
	vs := make([]gen.SluiceSvcstatsValue, ebpf.MustPossibleCPU())
	vs[0].NewFlows = 3
	if err := stats.Put(1, vs, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	ids := fromMap(map[nat.ServicePortName][]uint32{{Namespace: "demo", Name: "web", Port: "http"}: {1}})
	svc, err := metrics.NewServiceCollector(metrics.ServiceCollectorOptions{IDs: ids, Stats: stats, Series: metrics.ServiceSeriesNone})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(svc)
	if n, err := testutil.GatherAndCount(reg, "sluice_service_new_flows_total", "sluice_service_packets_total", "sluice_service_bytes_total"); err != nil || n != 0 {
		t.Fatalf("per-service series with none: %d, %v", n, err)
	}
	if n, err := testutil.GatherAndCount(reg, "sluice_all_services_new_flows_total"); err != nil || n != 2 {
		t.Fatalf("totals with none: %d series, %v", n, err)
	}
	_, err = metrics.NewServiceCollector(metrics.ServiceCollectorOptions{IDs: ids, Stats: stats, Series: "busy"})
	if err == nil || !strings.Contains(err.Error(), `"busy"`) {
		t.Fatalf("mode busy: %v", err)
	}
}

// fromMap yields the ids of a map of them, as nat.Syncer.ServiceIDs does.
func fromMap(ids map[nat.ServicePortName][]uint32) iter.Seq2[nat.ServicePortName, uint32] {
	return func(yield func(nat.ServicePortName, uint32) bool) {
		for name, list := range ids {
			for _, id := range list {
				if !yield(name, id) {
					return
				}
			}
		}
	}
}

// openSvcStats opens the catalogue's maps in a pin directory of the test's
// own (closed when it ends) and returns them with sl_svcstats_v1.
func openSvcStats(tb testing.TB) (*maps.Set, *maps.PerCPUMap[uint32, gen.SluiceSvcstatsValue]) {
	tb.Helper()
	set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(tb)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { set.Close() })
	stats, err := maps.SvcStats.In(set)
	if err != nil {
		tb.Fatal(err)
	}
	return set, stats
}
