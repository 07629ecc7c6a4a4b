package metrics_test

import (
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
	set, err := maps.Open(maps.OpenOptions{PinDir: bpftest.PinDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	stats, err := maps.SvcStats.In(set)
	if err != nil {
		t.Fatal(err)
	}
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
	ids := func() map[nat.ServicePortName][]uint32 {
		return map[nat.ServicePortName][]uint32{{Namespace: "demo", Name: "web", Port: "http"}: {3, 9}}
	}
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
	reg.MustRegister(metrics.NewServiceCollector(ids, stats), metrics.NewRuleCollector(rules, names))
	both := uint64(2)
	if cpus == 1 {
		both = 1
	}
	want := strings.ReplaceAll(`
# HELP sluice_policy_rule_hits_total New flows a policy rule decided, by policy and rule (ids of removed policies are left out)
# TYPE sluice_policy_rule_hits_total counter
sluice_policy_rule_hits_total{policy="networkpolicy demo/web",rule="ingress rule 0 peer 0 port 0",rule_id="42"} 7
# HELP sluice_service_new_flows_total Flows balanced to a backend of the service
# TYPE sluice_service_new_flows_total counter
sluice_service_new_flows_total{ip_family="IPv4",namespace="demo",port="http",service="web"} NF
# HELP sluice_service_packets_total Packets of a service's flows, by direction: to_service (client to backend) or reply
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
