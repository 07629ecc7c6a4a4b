// Package metrics defines the agent's Prometheus metrics: kube-proxy's where
// the meaning is the same (kubeproxy_*), Sluice's own (sluice_*), and the
// collectors that read the datapath's counters and maps at each scrape. It
// registers what it is given a registry for and touches nothing else.
package metrics

import (
	"cmp"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"

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
		conntrack.ReasonFlushed, conntrack.ReasonEarlyDrop, conntrack.ReasonGuardOnly} {
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

// NewXDPDecisionCollector returns a collector of the XDP acceleration's
// decisions (maps.ReadXDPDecisions): sluice_xdp_packets_total{decision}, the
// packets carried at XDP ("tx", "redirected") and those passed to TC by why.
func NewXDPDecisionCollector(read func() (map[string]uint64, error)) *CounterCollector {
	return &CounterCollector{Read: read, desc: prometheus.NewDesc("sluice_xdp_packets_total",
		"Packets the XDP acceleration saw, by its decision (enum xdp_accel_decision in bpf/include/xdp_accel.h): tx and redirected were translated and sent at XDP, dropped were new flows refused there, pass_* went on to TC; summed over CPUs",
		[]string{"decision"}, nil)}
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

// ServiceSeries chooses the service ports that get series of their own
// (sluice_service_*). Every choice keeps the node's totals over all service
// ports (sluice_all_services_*).
type ServiceSeries string

const (
	// ServiceSeriesActive gives series to service ports that carried
	// traffic, up to a limit, in the order they first did; a port keeps its
	// series while it exists. A node's thousands of idle Services cost
	// nothing at a scrape.
	ServiceSeriesActive ServiceSeries = "active"
	// ServiceSeriesAll gives every service port its series, idle or not:
	// five series a port, about 600 KB at 1,000 Services.
	ServiceSeriesAll ServiceSeries = "all"
	// ServiceSeriesNone exports the totals only.
	ServiceSeriesNone ServiceSeries = "none"
)

// DefaultServiceSeriesLimit is how many service ports ServiceSeriesActive
// gives series at most: about 62 KB of /metrics when all have them.
const DefaultServiceSeriesLimit = 100

// ParseServiceSeries parses a --service-metrics value.
func ParseServiceSeries(s string) (ServiceSeries, error) {
	switch v := ServiceSeries(s); v {
	case ServiceSeriesActive, ServiceSeriesAll, ServiceSeriesNone:
		return v, nil
	}
	return "", fmt.Errorf("service metrics %q: want %s, %s or %s", s, ServiceSeriesActive, ServiceSeriesAll, ServiceSeriesNone)
}

// ServiceCollectorOptions configure a ServiceCollector.
type ServiceCollectorOptions struct {
	// IDs yields each service port with each id the datapath counts it
	// under (a port can have several); usually nat.Syncer.ServiceIDs.
	IDs iter.Seq2[nat.ServicePortName, uint32]
	// Stats is sl_svcstats_v1.
	Stats *maps.PerCPUMap[uint32, gen.SluiceSvcstatsValue]
	// Series chooses the ports with series of their own; empty means
	// ServiceSeriesActive.
	Series ServiceSeries
	// Limit bounds ServiceSeriesActive's ports; zero means
	// DefaultServiceSeriesLimit.
	Limit int
	// Logger, if set, is told the first time the limit leaves a port out.
	Logger *slog.Logger
}

// MapMemoryCollector exports the kernel memory of each datapath map at
// scrape time: sluice_map_kernel_bytes{map="sl_ct_v2"} (maps.Set.KernelBytes).
type MapMemoryCollector struct {
	Read func() (map[string]uint64, error)
	desc *prometheus.Desc
}

// NewMapMemoryCollector returns the collector.
func NewMapMemoryCollector(read func() (map[string]uint64, error)) *MapMemoryCollector {
	return &MapMemoryCollector{Read: read, desc: prometheus.NewDesc("sluice_map_kernel_bytes",
		"Kernel memory each datapath map holds (its memlock charge), full or empty: most are preallocated", []string{"map"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *MapMemoryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *MapMemoryCollector) Collect(ch chan<- prometheus.Metric) {
	bytes, err := c.Read()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for name, n := range bytes {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), name)
	}
}

func keys[V any](m map[nat.ServicePortName]V) []nat.ServicePortName {
	out := make([]nat.ServicePortName, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// ServiceCollector exports the datapath's per-service traffic counters
// (sl_svcstats_v1) at scrape time: packets and bytes by direction and new
// flows, per service port and over all of them. A scrape reads the array's
// slots below the highest id in use in batches, never a map walk of its
// whole size.
//
// An id a removed service port held is handed to the next new one, and its
// slot still holds the old counts: the collector counts each port from the
// value its slot had when the port took it, and moves the old port's counts
// into the totals, so that a total never goes down.
type ServiceCollector struct {
	opts ServiceCollectorOptions

	packets, bytes, flows          *prometheus.Desc
	allPackets, allBytes, allFlows *prometheus.Desc
	seriesDesc, omittedDesc        *prometheus.Desc

	// mu serializes scrapes: they share the state below.
	mu sync.Mutex
	// slots, by id, are the ids' owners and counts at the last scrape.
	slots []serviceSlot
	// owners and current, by id, are this scrape's: scratch kept between
	// scrapes, so that one at 100,000 ports allocates no table of them.
	owners  []serviceOwner
	current []gen.SluiceSvcstatsValue
	// retired is what ports that left their ids counted, by family (IPv6 1).
	retired [2]gen.SluiceSvcstatsValue
	// shown are ServiceSeriesActive's ports with series.
	shown  map[nat.ServicePortName]struct{}
	warned bool
}

type serviceOwner struct {
	name nat.ServicePortName
	ok   bool
}

// serviceSlot is an id's owner and its counts: at the owner's first scrape
// (base) and at the last (last).
type serviceSlot struct {
	owner      nat.ServicePortName
	used       bool
	base, last gen.SluiceSvcstatsValue
}

// NewServiceCollector returns the collector.
func NewServiceCollector(opts ServiceCollectorOptions) (*ServiceCollector, error) {
	if opts.IDs == nil || opts.Stats == nil {
		return nil, fmt.Errorf("service collector: IDs and Stats are required")
	}
	if opts.Series == "" {
		opts.Series = ServiceSeriesActive
	}
	if _, err := ParseServiceSeries(string(opts.Series)); err != nil {
		return nil, err
	}
	if opts.Limit < 0 {
		return nil, fmt.Errorf("service metrics limit %d: want 0 (the default, %d) or more", opts.Limit, DefaultServiceSeriesLimit)
	}
	if opts.Limit == 0 {
		opts.Limit = DefaultServiceSeriesLimit
	}
	// ip_family: a dual-stack Service is a service port per family, each
	// counted on its own.
	labels := []string{"namespace", "service", "port", "ip_family"}
	return &ServiceCollector{opts: opts, shown: map[nat.ServicePortName]struct{}{},
		packets: prometheus.NewDesc("sluice_service_packets_total",
			"Packets of a service's flows, by direction: to_service (client to backend) or reply (ports chosen by --service-metrics)", append(labels, "direction"), nil),
		bytes: prometheus.NewDesc("sluice_service_bytes_total",
			"IP bytes of a service's flows, by direction (ports chosen by --service-metrics)", append(labels, "direction"), nil),
		flows: prometheus.NewDesc("sluice_service_new_flows_total",
			"Flows balanced to a backend of the service (ports chosen by --service-metrics)", labels, nil),
		allPackets: prometheus.NewDesc("sluice_all_services_packets_total",
			"Packets of all services' flows on this node, by direction", []string{"ip_family", "direction"}, nil),
		allBytes: prometheus.NewDesc("sluice_all_services_bytes_total",
			"IP bytes of all services' flows on this node, by direction", []string{"ip_family", "direction"}, nil),
		allFlows: prometheus.NewDesc("sluice_all_services_new_flows_total",
			"Flows balanced to a backend of any service on this node", []string{"ip_family"}, nil),
		seriesDesc: prometheus.NewDesc("sluice_service_series",
			"Service ports exported with series of their own (sluice_service_*)", nil, nil),
		omittedDesc: prometheus.NewDesc("sluice_service_series_omitted",
			"Service ports that carried traffic but have no series of their own: --service-metrics-limit is reached", nil, nil),
	}, nil
}

// Describe implements prometheus.Collector.
func (c *ServiceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.packets, c.bytes, c.flows, c.allPackets, c.allBytes, c.allFlows, c.seriesDesc, c.omittedDesc} {
		ch <- d
	}
}

func familyIndex(n nat.ServicePortName) int {
	if n.IPv6 {
		return 1
	}
	return 0
}

var familyNames = [2]string{"IPv4", "IPv6"}

func addStats(a *gen.SluiceSvcstatsValue, b gen.SluiceSvcstatsValue) {
	a.FwdPackets += b.FwdPackets
	a.FwdBytes += b.FwdBytes
	a.RevPackets += b.RevPackets
	a.RevBytes += b.RevBytes
	a.NewFlows += b.NewFlows
}

func subStats(a, b gen.SluiceSvcstatsValue) gen.SluiceSvcstatsValue {
	return gen.SluiceSvcstatsValue{FwdPackets: a.FwdPackets - b.FwdPackets, FwdBytes: a.FwdBytes - b.FwdBytes,
		RevPackets: a.RevPackets - b.RevPackets, RevBytes: a.RevBytes - b.RevBytes, NewFlows: a.NewFlows - b.NewFlows}
}

// grown returns s with at least n elements, the new ones zero.
func grown[T any](s []T, n int) []T {
	if len(s) < n {
		s = append(s, make([]T, n-len(s))...)
	}
	return s
}

// retire moves what a slot's port counted into the totals of the ports that
// left their ids.
func (c *ServiceCollector) retire(slot serviceSlot) {
	addStats(&c.retired[familyIndex(slot.owner)], subStats(slot.last, slot.base))
}

// below tells whether any count of a is below b's: the slot was zeroed (its
// map made anew), so counting starts again from zero.
func below(a, b gen.SluiceSvcstatsValue) bool {
	return a.FwdPackets < b.FwdPackets || a.FwdBytes < b.FwdBytes || a.RevPackets < b.RevPackets ||
		a.RevBytes < b.RevBytes || a.NewFlows < b.NewFlows
}

// Collect implements prometheus.Collector.
func (c *ServiceCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.owners)
	capacity := c.opts.Stats.MaxEntries()
	maxID := uint32(0)
	for name, id := range c.opts.IDs {
		if id >= capacity {
			continue // beyond the array (adopted from an older agent): not counted
		}
		c.owners = grown(c.owners, int(id)+1)
		c.owners[id] = serviceOwner{name: name, ok: true}
		maxID = max(maxID, id)
	}
	c.owners = grown(c.owners, int(maxID)+1) // also with no service port: id 0 is read
	c.current = grown(c.current[:0], int(maxID)+1)
	err := c.opts.Stats.Iterate(func(id uint32, vs []gen.SluiceSvcstatsValue) bool {
		if id > maxID {
			return false // ids are handed out lowest first: the rest are unused
		}
		if c.owners[id].ok {
			var sum gen.SluiceSvcstatsValue
			for _, v := range vs {
				addStats(&sum, v)
			}
			c.current[id] = sum
		}
		return true
	})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.allFlows, err)
		return
	}

	c.slots = grown(c.slots, int(maxID)+1)
	// live is what the ports that hold their ids counted, by family; the
	// totals are it and what retired ports did.
	var live [2]gen.SluiceSvcstatsValue
	// byPort sums a port's ids: of every port for ServiceSeriesAll, of
	// those with series or new traffic for ServiceSeriesActive.
	byPort := map[nat.ServicePortName]gen.SluiceSvcstatsValue{}
	for id := range c.slots {
		slot := &c.slots[id]
		if id > int(maxID) || !c.owners[id].ok {
			if slot.used {
				c.retire(*slot)
				*slot = serviceSlot{}
			}
			continue
		}
		name, cur := c.owners[id].name, c.current[id]
		switch {
		case !slot.used:
			// The first sight: the counts are the port's own, also those
			// from before an agent restart (the map outlives the agent).
			*slot = serviceSlot{owner: name, used: true}
		case slot.owner != name:
			// The id changed hands: the old port's counts go to the
			// totals, and the new port counts from here.
			c.retire(*slot)
			*slot = serviceSlot{owner: name, used: true, base: cur}
		case below(cur, slot.last):
			c.retire(*slot)
			slot.base = gen.SluiceSvcstatsValue{}
		}
		slot.last = cur
		delta := subStats(cur, slot.base)
		addStats(&live[familyIndex(name)], delta)
		switch c.opts.Series {
		case ServiceSeriesAll:
		case ServiceSeriesActive:
			if _, shown := c.shown[name]; !shown && delta == (gen.SluiceSvcstatsValue{}) {
				continue
			}
		default:
			continue
		}
		sum := byPort[name]
		addStats(&sum, delta)
		byPort[name] = sum
	}
	for f := range live {
		t, fam := c.retired[f], familyNames[f]
		addStats(&t, live[f])
		ch <- prometheus.MustNewConstMetric(c.allPackets, prometheus.CounterValue, float64(t.FwdPackets), fam, "to_service")
		ch <- prometheus.MustNewConstMetric(c.allPackets, prometheus.CounterValue, float64(t.RevPackets), fam, "reply")
		ch <- prometheus.MustNewConstMetric(c.allBytes, prometheus.CounterValue, float64(t.FwdBytes), fam, "to_service")
		ch <- prometheus.MustNewConstMetric(c.allBytes, prometheus.CounterValue, float64(t.RevBytes), fam, "reply")
		ch <- prometheus.MustNewConstMetric(c.allFlows, prometheus.CounterValue, float64(t.NewFlows), fam)
	}

	shown, omitted := c.choose(byPort)
	for _, name := range shown {
		sum := byPort[name]
		l := []string{name.Namespace, name.Name, name.Port, familyNames[familyIndex(name)]}
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(sum.FwdPackets), append(l, "to_service")...)
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(sum.RevPackets), append(l, "reply")...)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(sum.FwdBytes), append(l, "to_service")...)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(sum.RevBytes), append(l, "reply")...)
		ch <- prometheus.MustNewConstMetric(c.flows, prometheus.CounterValue, float64(sum.NewFlows), l...)
	}
	ch <- prometheus.MustNewConstMetric(c.seriesDesc, prometheus.GaugeValue, float64(len(shown)))
	ch <- prometheus.MustNewConstMetric(c.omittedDesc, prometheus.GaugeValue, float64(omitted))
}

// choose returns the ports that get series, and how many ports with
// traffic were left out.
func (c *ServiceCollector) choose(byPort map[nat.ServicePortName]gen.SluiceSvcstatsValue) ([]nat.ServicePortName, int) {
	switch c.opts.Series {
	case ServiceSeriesNone:
		return nil, 0
	case ServiceSeriesAll:
		return keys(byPort), 0
	}
	for name := range c.shown {
		if _, ok := byPort[name]; !ok {
			delete(c.shown, name) // the port is gone, and its series with it
		}
	}
	var candidates []nat.ServicePortName
	for name := range byPort {
		if _, ok := c.shown[name]; !ok {
			candidates = append(candidates, name) // with traffic: Collect left out the idle
		}
	}
	if room := c.opts.Limit - len(c.shown); len(candidates) > room && room > 0 {
		// Ports that start at the same scrape are taken in name order,
		// so that which of them the limit leaves out does not change
		// scrape to scrape.
		slices.SortFunc(candidates, func(a, b nat.ServicePortName) int {
			return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name),
				strings.Compare(a.Port, b.Port), cmp.Compare(familyIndex(a), familyIndex(b)))
		})
	}
	omitted := 0
	for _, name := range candidates {
		if len(c.shown) >= c.opts.Limit {
			omitted++
			continue
		}
		c.shown[name] = struct{}{}
	}
	if omitted > 0 && !c.warned && c.opts.Logger != nil {
		c.warned = true
		c.opts.Logger.Warn("service ports with traffic left without series of their own: the limit is reached (they still count in sluice_all_services_*)",
			"limit", c.opts.Limit, "left out", omitted, "flag", "--service-metrics-limit")
	}
	return keys(c.shown), omitted
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
