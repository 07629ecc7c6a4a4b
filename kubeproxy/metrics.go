package kubeproxy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are kube-proxy's metrics where the meaning is the same (prefix
// kubeproxy_), plus Sluice's own (prefix sluice_).
type Metrics struct {
	SyncDuration       prometheus.Histogram
	LastSync           prometheus.Gauge
	NetworkProgramming prometheus.Histogram
	EndpointChanges    prometheus.Counter
	ServiceChanges     prometheus.Counter
	NoLocalEndpoints   *prometheus.GaugeVec
	Healthz            *prometheus.CounterVec
	SkippedObjects     prometheus.Counter
	SyncErrors         prometheus.Counter
	ConntrackFlushed   prometheus.Counter
	MapWrites          prometheus.Counter
	SourceUnreadable   *prometheus.GaugeVec
	ManifestErrors     prometheus.Counter
	PinsRepaired       prometheus.Counter
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
	}
	reg.MustRegister(m.SyncDuration, m.LastSync, m.NetworkProgramming, m.EndpointChanges, m.ServiceChanges,
		m.NoLocalEndpoints, m.Healthz, m.SkippedObjects, m.SyncErrors, m.ConntrackFlushed, m.MapWrites,
		m.SourceUnreadable, m.ManifestErrors, m.PinsRepaired)
	return m
}
