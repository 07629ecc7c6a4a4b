// Package metrics defines the agent's Prometheus metrics: kube-proxy's where
// the meaning is the same (kubeproxy_*), Sluice's own (sluice_*), and the
// collectors that read the datapath's counters and maps at each scrape. It
// registers what it is given a registry for and touches nothing else.
package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
)

// Metrics are kube-proxy's metrics where the meaning is the same (prefix
// kubeproxy_), plus Sluice's own (prefix sluice_).
type Metrics struct {
	SyncDuration        prometheus.Histogram
	LastSync            prometheus.Gauge
	NetworkProgramming  prometheus.Histogram
	EndpointChanges     prometheus.Counter
	ServiceChanges      prometheus.Counter
	NoLocalEndpoints    *prometheus.GaugeVec
	Healthz             *prometheus.CounterVec
	SkippedObjects      prometheus.Counter
	SyncErrors          prometheus.Counter
	ConntrackFlushed    prometheus.Counter
	MapWrites           prometheus.Counter
	SourceUnreadable    *prometheus.GaugeVec
	ManifestErrors      prometheus.Counter
	PinsRepaired        prometheus.Counter
	AttachmentsRepaired prometheus.Counter
	ConntrackEntries    *prometheus.GaugeVec
	ConntrackCapacity   *prometheus.GaugeVec
	ConntrackDeleted    *prometheus.CounterVec
	ConntrackFlows      *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	buckets := prometheus.ExponentialBuckets(0.0001, 2, 18)
	m := &Metrics{
		SyncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_duration_seconds",
			Help: "SyncProxyRules latency in seconds", Buckets: buckets}),
		LastSync: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_last_timestamp_seconds",
			Help: "The last time proxy rules were successfully synced"}),
		NetworkProgramming: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "kubeproxy", Name: "network_programming_duration_seconds",
			Help: "In Cluster Network Programming Latency in seconds", Buckets: buckets}),
		EndpointChanges: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_endpoint_changes_total",
			Help: "Cumulative proxy rules Endpoint changes"}),
		ServiceChanges: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_service_changes_total",
			Help: "Cumulative proxy rules Service changes"}),
		NoLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "kubeproxy", Name: "sync_proxy_rules_no_local_endpoints_total",
			Help: "Number of services with a Local traffic policy and no endpoints"}, []string{"traffic_policy"}),
		Healthz: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kubeproxy", Name: "proxy_healthz_total",
			Help: "Cumulative proxy healthz HTTP status"}, []string{"code"}),
		SkippedObjects: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sluice", Name: "skipped_objects_total",
			Help: "Services and EndpointSlices not programmed: malformed, in conflict, or too big for the maps"}),
		SyncErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sluice", Name: "sync_errors_total",
			Help: "Syncs that failed (retried)"}),
		ConntrackFlushed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sluice", Name: "conntrack_flushed_total",
			Help: "UDP flows flushed because their backend left the service"}),
		MapWrites: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sluice", Name: "nat_map_operations_total",
			Help: "Map writes and deletes done by syncs"}),
		SourceUnreadable: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "sluice", Name: "source_unreadable",
			Help: "1 while a source of objects cannot be read (its last state is kept)"}, []string{"source"}),
		ManifestErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sluice", Name: "manifest_errors_total",
			Help: "Manifest documents that did not parse, counted each time their file is read"}),
		PinsRepaired: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sluice", Name: "pins_repaired_total",
			Help: "Map pins removed behind the agent's back and pinned again"}),
		AttachmentsRepaired: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "sluice", Name: "attachments_repaired_total",
			Help: "Interface hooks found detached or running another program, and attached again"}),
		ConntrackEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "sluice", Name: "conntrack_entries",
			Help: "Conntrack entries (two per flow) at the last scan, by map (one per address family)"}, []string{"map"}),
		ConntrackCapacity: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "sluice", Name: "conntrack_capacity",
			Help: "Conntrack map capacity, by map; new flows of its family are refused when it is full"}, []string{"map"}),
		ConntrackDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Name: "conntrack_deleted_total",
			Help: "Flows deleted by the conntrack scanner, by reason"}, []string{"reason"}),
		ConntrackFlows: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "sluice", Name: "conntrack_flows",
			Help: "Tracked flows at the last scan, by protocol and state (TCP opening, established or closing, as the client's flags say)"},
			[]string{"protocol", "state"}),
	}
	reg.MustRegister(m.SyncDuration, m.LastSync, m.NetworkProgramming, m.EndpointChanges, m.ServiceChanges,
		m.NoLocalEndpoints, m.Healthz, m.SkippedObjects, m.SyncErrors, m.ConntrackFlushed, m.MapWrites,
		m.SourceUnreadable, m.ManifestErrors, m.PinsRepaired, m.AttachmentsRepaired, m.ConntrackEntries, m.ConntrackCapacity, m.ConntrackDeleted,
		m.ConntrackFlows)
	// Every deletion reason has a series from the start, so a dashboard's
	// rate() sees the first deletion of each.
	for _, r := range []conntrack.Reason{conntrack.ReasonExpired, conntrack.ReasonStaleNAT, conntrack.ReasonOrphan,
		conntrack.ReasonFlushed, conntrack.ReasonEarlyDrop} {
		m.ConntrackDeleted.WithLabelValues(string(r))
	}
	return m
}

// ObserveScan records a conntrack scan.
func (m *Metrics) ObserveScan(st conntrack.ScanStats) {
	for _, mf := range st.Maps {
		m.ConntrackEntries.WithLabelValues(mf.Name).Set(float64(mf.Entries))
		m.ConntrackCapacity.WithLabelValues(mf.Name).Set(float64(mf.Capacity))
	}
	m.ConntrackFlows.Reset()
	for fs, n := range st.Flows {
		m.ConntrackFlows.WithLabelValues(fs.Protocol, fs.State).Set(float64(n))
	}
	for reason, n := range st.Deleted {
		m.ConntrackDeleted.WithLabelValues(string(reason)).Add(float64(n))
	}
}

// CounterCollector exports counters read at scrape time, by name, in one
// family: sluice_datapath_events_total{event="drop_ct_full"}.
type CounterCollector struct {
	Read func() (map[string]uint64, error)
	desc *prometheus.Desc
}

// NewCounterCollector returns a collector of the datapath's counters.
func NewCounterCollector(read func() (map[string]uint64, error)) *CounterCollector {
	return &CounterCollector{Read: read, desc: prometheus.NewDesc("sluice_datapath_events_total",
		"Datapath verdicts and drops by reason (enum counter in bpf/include/counters.h), summed over CPUs",
		[]string{"event"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *CounterCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *CounterCollector) Collect(ch chan<- prometheus.Metric) {
	values, err := c.Read()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for name, v := range values {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(v), name)
	}
}

// MapFillCollector exports each map's entries and capacity at scrape time:
// sluice_map_entries{map="sl_ct_v2"} and sluice_map_capacity. Read comes
// from the kernel's own counts (maps.Filler): a scrape walks no map.
type MapFillCollector struct {
	Read     func() (map[string]int64, error)
	Capacity func() map[string]uint32
	entries  *prometheus.Desc
	capacity *prometheus.Desc
}

// NewMapFillCollector returns the collector.
func NewMapFillCollector(read func() (map[string]int64, error), capacity func() map[string]uint32) *MapFillCollector {
	return &MapFillCollector{Read: read, Capacity: capacity,
		entries: prometheus.NewDesc("sluice_map_entries",
			"Entries each datapath map holds (the kernel's count; an array always holds its capacity)", []string{"map"}, nil),
		capacity: prometheus.NewDesc("sluice_map_capacity", "Entries each datapath map can hold", []string{"map"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *MapFillCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.entries; ch <- c.capacity }

// Collect implements prometheus.Collector.
func (c *MapFillCollector) Collect(ch chan<- prometheus.Metric) {
	entries, err := c.Read()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.entries, err)
		return
	}
	capacity := c.Capacity()
	for name, n := range entries {
		ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(n), name)
		ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(capacity[name]), name)
	}
}

// ServiceCollector exports the datapath's per-service traffic counters
// (sl_svcstats_v1) at scrape time: packets and bytes by direction and new
// flows, per service port. A scrape reads one per-CPU array slot per backend
// set the syncer holds (a remote node's NodePort set counts with its
// service), never a walk of a large map.
type ServiceCollector struct {
	IDs   func() map[nat.ServicePortName][]uint32
	Stats *maps.PerCPUMap[uint32, gen.SluiceSvcstatsValue]

	packets, bytes, flows *prometheus.Desc
}

// NewServiceCollector returns the collector; ids is usually
// nat.Syncer.ServiceIDs.
func NewServiceCollector(ids func() map[nat.ServicePortName][]uint32, stats *maps.PerCPUMap[uint32, gen.SluiceSvcstatsValue]) *ServiceCollector {
	// ip_family: a dual-stack Service is a service port per family, each
	// counted on its own.
	labels := []string{"namespace", "service", "port", "ip_family"}
	return &ServiceCollector{IDs: ids, Stats: stats,
		packets: prometheus.NewDesc("sluice_service_packets_total",
			"Packets of a service's flows, by direction: to_service (client to backend) or reply", append(labels, "direction"), nil),
		bytes: prometheus.NewDesc("sluice_service_bytes_total",
			"IP bytes of a service's flows, by direction", append(labels, "direction"), nil),
		flows: prometheus.NewDesc("sluice_service_new_flows_total",
			"Flows balanced to a backend of the service", labels, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ServiceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.packets
	ch <- c.bytes
	ch <- c.flows
}

// Collect implements prometheus.Collector.
func (c *ServiceCollector) Collect(ch chan<- prometheus.Metric) {
	for name, ids := range c.IDs() {
		var sum gen.SluiceSvcstatsValue
		for _, id := range ids {
			vs, err := c.Stats.Get(id)
			if err != nil {
				continue // an id beyond the array (adopted from an older agent): not counted
			}
			for _, v := range vs {
				sum.FwdPackets += v.FwdPackets
				sum.FwdBytes += v.FwdBytes
				sum.RevPackets += v.RevPackets
				sum.RevBytes += v.RevBytes
				sum.NewFlows += v.NewFlows
			}
		}
		family := "IPv4"
		if name.IPv6 {
			family = "IPv6"
		}
		l := []string{name.Namespace, name.Name, name.Port, family}
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(sum.FwdPackets), append(l, "to_service")...)
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(sum.RevPackets), append(l, "reply")...)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(sum.FwdBytes), append(l, "to_service")...)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(sum.RevBytes), append(l, "reply")...)
		ch <- prometheus.MustNewConstMetric(c.flows, prometheus.CounterValue, float64(sum.NewFlows), l...)
	}
}

// RuleCollector exports policy rule hits (sl_rulectr_v1, the new flows each
// rule decided) at scrape time, named by Name (the policy and the rule). The
// map holds the rules of this node's policies only; a scrape walks it.
type RuleCollector struct {
	Counters *maps.PerCPUMap[gen.SluiceRulectrKey, uint64]
	// Name names a rule id; false for one no current policy has.
	Name func(id uint32) (policy, rule string, ok bool)

	desc *prometheus.Desc
}

// NewRuleCollector returns the collector.
func NewRuleCollector(counters *maps.PerCPUMap[gen.SluiceRulectrKey, uint64], name func(uint32) (string, string, bool)) *RuleCollector {
	return &RuleCollector{Counters: counters, Name: name, desc: prometheus.NewDesc("sluice_policy_rule_hits_total",
		"New flows a policy rule decided, by policy and rule (ids of removed policies are left out)",
		[]string{"policy", "rule", "rule_id"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *RuleCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *RuleCollector) Collect(ch chan<- prometheus.Metric) {
	err := c.Counters.Iterate(func(k gen.SluiceRulectrKey, vs []uint64) bool {
		policy, rule, ok := c.Name(uint32(k.RuleId))
		if !ok {
			return true
		}
		var sum uint64
		for _, v := range vs {
			sum += v
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(sum), policy, rule, strconv.FormatUint(k.RuleId, 10))
		return true
	})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
	}
}
