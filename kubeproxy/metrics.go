package kubeproxy

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-net/sluice/conntrack"
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
	ConntrackEntries    prometheus.Gauge
	ConntrackCapacity   prometheus.Gauge
	ConntrackDeleted    *prometheus.CounterVec
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
		ConntrackEntries: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "sluice", Name: "conntrack_entries",
			Help: "Conntrack entries (two per flow) at the last scan"}),
		ConntrackCapacity: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "sluice", Name: "conntrack_capacity",
			Help: "Conntrack map capacity; new flows are refused when it is full"}),
		ConntrackDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Name: "conntrack_deleted_total",
			Help: "Flows deleted by the conntrack scanner, by reason"}, []string{"reason"}),
	}
	reg.MustRegister(m.SyncDuration, m.LastSync, m.NetworkProgramming, m.EndpointChanges, m.ServiceChanges,
		m.NoLocalEndpoints, m.Healthz, m.SkippedObjects, m.SyncErrors, m.ConntrackFlushed, m.MapWrites,
		m.SourceUnreadable, m.ManifestErrors, m.PinsRepaired, m.AttachmentsRepaired, m.ConntrackEntries, m.ConntrackCapacity, m.ConntrackDeleted)
	return m
}

// ObserveScan records a conntrack scan.
func (m *Metrics) ObserveScan(st conntrack.ScanStats) {
	m.ConntrackEntries.Set(float64(st.Entries))
	m.ConntrackCapacity.Set(float64(st.Capacity))
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
