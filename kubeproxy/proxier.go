package kubeproxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/kubeproxy/healthcheck"
	proxymetrics "github.com/sluice-net/sluice/kubeproxy/metrics"
	"github.com/sluice-net/sluice/nat"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Config configures a Proxier, with kube-proxy's meanings.
type Config struct {
	// NodeName is this node (--hostname-override).
	NodeName string
	// NodePortAddresses restricts NodePorts to node IPs in these CIDRs
	// (--nodeport-addresses); empty: every node IP, plus the wildcard entry.
	NodePortAddresses []netip.Prefix
	// NodePortPrimary adds this node's primary IPs (its first InternalIP,
	// else ExternalIP, of each family) to NodePortAddresses (kube-proxy's
	// "primary").
	NodePortPrimary bool
	// NodePortMin and NodePortMax bound valid NodePorts (default 30000-32767).
	NodePortMin, NodePortMax uint16
	// MinSyncPeriod (default 1 s when zero; negative: none, every change
	// syncs at once) and SyncPeriod (default 30 s) bound the sync rate;
	// health turns bad after 2 × SyncPeriod with an update pending.
	MinSyncPeriod, SyncPeriod time.Duration
	// HealthCheckBindIP is where health-check NodePorts listen ("" = all).
	HealthCheckBindIP string
	// OnNodeIPs, if set, is called with the node's addresses whenever they
	// change (the agent writes the SNAT address from them).
	OnNodeIPs func([]netip.Addr)
	// OnPodCIDRs, if set, is called with this Node's pod CIDRs
	// (spec.podCIDRs) whenever the Node is seen (the agent's
	// --detect-local-mode=NodeCIDR).
	OnPodCIDRs func([]netip.Prefix)
	// Routes, if set, is fed every Node of the cluster by the sources (an
	// informer on all Nodes, or the manifests), for the NAT syncer's route
	// lookup.
	Routes *NodeRoutes
}

// Flusher removes conntrack flows of backends that left their service
// (conntrack.Scanner does).
type Flusher interface {
	FlushBackends([]conntrack.Backend) (int, error)
}

// Proxier drives the NAT syncer from Kubernetes objects.
type Proxier struct {
	cfg       Config
	log       *slog.Logger
	conv      Converter
	tracker   *Tracker
	syncer    *nat.Syncer
	flusher   Flusher
	Health    *healthcheck.ProxyHealth
	svcHealth *healthcheck.ServiceHealth
	metrics   *proxymetrics.Metrics
	runner    *Runner

	mu             sync.Mutex
	servicesSynced bool
	slicesSynced   bool
	node           nat.Node
	nodeIPs        []netip.Addr
	serviceCIDRs   []netip.Prefix

	// Owned by the sync function.
	ports       map[nat.ServicePortName]*nat.ServicePort
	eps         map[nat.ServicePortName][]nat.Endpoint
	portsBySvc  map[types.NamespacedName][]nat.ServicePortName
	checks      map[types.NamespacedName]healthcheck.HealthCheck
	noLocal     map[types.NamespacedName][2]bool // internal, external policy Local without local endpoints
	pending     map[nat.ServicePortName]bool     // changes of a failed sync, retried
	reportedBad map[string]bool
	applied     atomic.Int64  // syncs that programmed the dataplane
	programmed  chan struct{} // closed by the first of them
	// affinityCleaned is when the affinity map was last swept of entries
	// expired or pointing at what is gone (once per sync period).
	affinityCleaned time.Time
}

// NewProxier wires a proxier; flusher and metrics may be nil.
func NewProxier(cfg Config, syncer *nat.Syncer, flusher Flusher, metrics *proxymetrics.Metrics, log *slog.Logger) *Proxier {
	if cfg.MinSyncPeriod == 0 {
		cfg.MinSyncPeriod = time.Second
	}
	if cfg.SyncPeriod == 0 {
		cfg.SyncPeriod = 30 * time.Second
	}
	if log == nil {
		log = slog.Default()
	}
	p := &Proxier{
		cfg: cfg, log: log, syncer: syncer, flusher: flusher, metrics: metrics,
		conv:        Converter{NodeName: cfg.NodeName, NodePortMin: cfg.NodePortMin, NodePortMax: cfg.NodePortMax},
		Health:      healthcheck.NewProxyHealth(2 * cfg.SyncPeriod),
		node:        nat.Node{Name: cfg.NodeName, AllNodePortIPs: len(cfg.NodePortAddresses) == 0 && !cfg.NodePortPrimary},
		ports:       map[nat.ServicePortName]*nat.ServicePort{},
		eps:         map[nat.ServicePortName][]nat.Endpoint{},
		portsBySvc:  map[types.NamespacedName][]nat.ServicePortName{},
		checks:      map[types.NamespacedName]healthcheck.HealthCheck{},
		noLocal:     map[types.NamespacedName][2]bool{},
		pending:     map[nat.ServicePortName]bool{},
		reportedBad: map[string]bool{},
		programmed:  make(chan struct{}),
	}
	p.svcHealth = healthcheck.NewServiceHealth(cfg.HealthCheckBindIP, p.Health, log)
	if metrics != nil {
		p.Health.OnRequest(func(path string, code int) {
			if path == "/healthz" {
				metrics.Healthz.WithLabelValues(fmt.Sprint(code)).Inc()
			}
		})
	}
	p.tracker = newTracker(p.changed, &p.conv)
	p.runner = NewRunner(p.Sync, cfg.MinSyncPeriod, cfg.SyncPeriod)
	return p
}

// NodeName is the name of the Node this proxier serves.
func (p *Proxier) NodeName() string { return p.cfg.NodeName }

// Log is the proxier's logger, for the sources that feed it.
func (p *Proxier) Log() *slog.Logger { return p.log }

// Routes is where the Nodes' pod routes go (nil: none are kept).
func (p *Proxier) Routes() *NodeRoutes { return p.cfg.Routes }

// Metrics are the proxier's metrics (nil: none).
func (p *Proxier) Metrics() *proxymetrics.Metrics { return p.metrics }

// Programmed is closed once a sync has programmed the dataplane with every
// Service and EndpointSlice of the initial list.
func (p *Proxier) Programmed() <-chan struct{} { return p.programmed }

// Tracker is where sources send Service and EndpointSlice events.
func (p *Proxier) Tracker() *Tracker { return p.tracker }

// Runs counts the syncs run (including those before both lists arrived,
// which do nothing).
func (p *Proxier) Runs() int { return p.runner.Runs() }

// Applied counts the syncs that programmed the dataplane: after the first,
// every Service and EndpointSlice listed at start is in the maps.
func (p *Proxier) Applied() int64 { return p.applied.Load() }

// RequestSync asks for a sync (within the sync periods), e.g. when routes
// resolved endpoints the last one could not place (nat.Options.Trigger).
func (p *Proxier) RequestSync() { p.changed() }

func (p *Proxier) changed() {
	p.Health.QueuedUpdate()
	p.runner.Trigger()
}

// OnServicesSynced and OnEndpointSlicesSynced tell that a source listed every
// object of the kind; syncing starts once both have.
func (p *Proxier) OnServicesSynced() { p.setSynced(func() { p.servicesSynced = true }) }

// OnEndpointSlicesSynced: see OnServicesSynced.
func (p *Proxier) OnEndpointSlicesSynced() { p.setSynced(func() { p.slicesSynced = true }) }

func (p *Proxier) setSynced(f func()) {
	p.mu.Lock()
	f()
	p.mu.Unlock()
	p.changed()
}

// OnNode records this Node: its IPs (NodePort addresses after
// --nodeport-addresses), its zone, and whether it is being deleted.
func (p *Proxier) OnNode(node *v1.Node) {
	// InternalIPs first: the first address is the primary one (the SNAT
	// source, and NodePortPrimary's address); the first of each family is
	// that family's.
	var ips []netip.Addr
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			if ip, err := ParseIPSloppy(a.Address); a.Type == typ && err == nil {
				ips = append(ips, ip)
			}
		}
	}
	deleting := node.DeletionTimestamp != nil || slices.ContainsFunc(node.Spec.Taints, func(t v1.Taint) bool {
		return t.Key == "ToBeDeletedByClusterAutoscaler"
	})
	p.Health.SetNodeEligible(!deleting)
	if p.cfg.OnPodCIDRs != nil {
		var cidrs []netip.Prefix
		for _, c := range cmpOrSlice(node.Spec.PodCIDRs, node.Spec.PodCIDR) {
			if pfx, err := netip.ParsePrefix(c); err == nil {
				cidrs = append(cidrs, pfx.Masked())
			}
		}
		p.cfg.OnPodCIDRs(cidrs)
	}
	p.mu.Lock()
	p.node.Zone = node.Labels[LabelZone]
	known := len(p.nodeIPs) > 0
	p.mu.Unlock()
	if len(ips) == 0 && known {
		// A Node without addresses (a manifest that omits them, a status
		// not written yet) is not a node that lost them: NodePorts and SNAT
		// keep the last known addresses.
		p.log.Warn("Node has no InternalIP or ExternalIP; keeping its last known addresses", "node", node.Name)
		p.changed()
		return
	}
	p.SetNodeIPs(ips)
}

// cmpOrSlice is list, or the single value when the list is empty (a Node's
// spec.podCIDRs, and the older spec.podCIDR).
func cmpOrSlice(list []string, single string) []string {
	if len(list) == 0 && single != "" {
		return []string{single}
	}
	return list
}

// SetNodeIPs sets this node's addresses (the agent does when there is no Node
// object, as with a folder of manifests).
func (p *Proxier) SetNodeIPs(ips []netip.Addr) {
	p.mu.Lock()
	p.nodeIPs = slices.Clone(ips)
	var np []netip.Addr
	var primary [2]bool // seen the first address of each family
	for _, ip := range ips {
		first := !primary[family(ip)]
		primary[family(ip)] = true
		if p.node.AllNodePortIPs || (p.cfg.NodePortPrimary && first) ||
			slices.ContainsFunc(p.cfg.NodePortAddresses, func(c netip.Prefix) bool { return c.Contains(ip) }) {
			np = append(np, ip)
		}
	}
	slices.SortFunc(np, func(a, b netip.Addr) int { return a.Compare(b) })
	np = slices.Compact(np)
	p.node.NodePortIPs = np
	p.mu.Unlock()
	if p.cfg.OnNodeIPs != nil {
		p.cfg.OnNodeIPs(ips)
	}
	p.changed()
}

// OnServiceCIDRsChanged takes the cluster's service ranges: the CIDRs of
// every ServiceCIDR object (networking.k8s.io/v1), as kube-proxy's handler of
// the same name. A new flow to an address of them that no Service holds is
// dropped. A CIDR that does not parse is logged and left out. Until the
// first call the datapath keeps the ranges it has (a restarted agent's).
// Every call says the ranges are known: nil or empty means the cluster has
// none (an API server that does not serve ServiceCIDRs), and the datapath's
// are removed.
func (p *Proxier) OnServiceCIDRsChanged(cidrs []string) {
	parsed := []netip.Prefix{} // not nil: the ranges are known, maybe none
	for _, c := range cidrs {
		pfx, err := netip.ParsePrefix(c)
		if err != nil {
			p.log.Warn("ServiceCIDR: not a CIDR; left out", "cidr", c, "err", err)
			continue
		}
		parsed = append(parsed, pfx.Masked())
	}
	slices.SortFunc(parsed, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	parsed = slices.Compact(parsed)
	p.mu.Lock()
	same := p.serviceCIDRs != nil && slices.Equal(parsed, p.serviceCIDRs)
	p.serviceCIDRs = parsed
	p.mu.Unlock()
	if !same {
		p.changed()
	}
}

// Run syncs until ctx ends.
func (p *Proxier) Run(ctx context.Context) {
	defer p.svcHealth.Close()
	p.runner.Run(ctx)
}

// Sync programs the dataplane with what changed since the last sync. Until
// Services and EndpointSlices have both been listed it does nothing.
func (p *Proxier) Sync() error {
	p.mu.Lock()
	ready := p.servicesSynced && p.slicesSynced
	node := p.node
	node.NodePortIPs = slices.Clone(p.node.NodePortIPs)
	serviceCIDRs := p.serviceCIDRs
	p.mu.Unlock()
	if !ready {
		return nil
	}
	start := time.Now()
	ch := p.tracker.TakeChanges()
	for key, sc := range ch.Services {
		p.updateService(key, sc)
	}
	stats, err := p.syncer.Apply(nat.State{Node: node, Services: p.ports, Endpoints: p.eps, Changed: p.pending,
		ServiceCIDRs: serviceCIDRs})
	if p.metrics != nil {
		p.metrics.ServiceChanges.Add(float64(ch.ServiceEvents))
		p.metrics.EndpointChanges.Add(float64(ch.SliceEvents))
		p.metrics.MapWrites.Add(float64(stats.Writes + stats.Deletes))
	}
	for _, e := range stats.Errors {
		p.reportBad(e)
	}
	// Served, but not as asked (a Maglev table the map had no room for):
	// /healthz says so until a sync clears it.
	if degraded := errors.Join(stats.Degraded...); degraded != nil {
		if p.metrics != nil {
			p.metrics.SyncErrors.Inc()
		}
		p.log.Error("sync degraded; every packet is served", "err", degraded)
		p.Health.SetSourceError("nat", degraded)
	} else if err == nil {
		p.Health.SetSourceError("nat", nil)
	}
	if err != nil {
		if p.metrics != nil {
			p.metrics.SyncErrors.Inc()
		}
		p.log.Error("sync failed; retrying", "err", err)
		return fmt.Errorf("sync: %w", err) // p.pending keeps the changes for the retry
	}
	p.pending = map[nat.ServicePortName]bool{} // not clear: a map keeps its largest size
	if p.applied.Add(1) == 1 {
		close(p.programmed)
	}
	p.flushStaleUDP(stats.StaleUDP)
	// Apply sweeps the affinity entries of the services it changed; expired
	// entries of the others are swept here, once per sync period, so that
	// they do not linger until the LRU needs their room.
	if now := time.Now(); now.Sub(p.affinityCleaned) >= p.cfg.SyncPeriod {
		if n, err := p.syncer.CleanAffinity(); err != nil {
			p.log.Warn("sweeping session affinity entries", "err", err)
		} else if n > 0 {
			p.log.Debug("swept session affinity entries", "removed", n)
		}
		p.affinityCleaned = now
	}
	if err := p.svcHealth.Sync(slices.Collect(maps.Values(p.checks))); err != nil {
		p.log.Warn("health check ports", "err", err)
	}
	p.Health.Updated()
	if p.metrics != nil {
		p.metrics.SyncDuration.Observe(time.Since(start).Seconds())
		p.metrics.LastSync.SetToCurrentTime()
		for _, ts := range ch.TriggerTimes {
			p.metrics.NetworkProgramming.Observe(time.Since(ts).Seconds())
		}
		internal, external := 0, 0
		for _, nl := range p.noLocal {
			if nl[0] {
				internal++
			}
			if nl[1] {
				external++
			}
		}
		p.metrics.NoLocalEndpoints.WithLabelValues("internal").Set(float64(internal))
		p.metrics.NoLocalEndpoints.WithLabelValues("external").Set(float64(external))
	}
	return nil
}

// updateService recomputes one service's ports and endpoints.
func (p *Proxier) updateService(key types.NamespacedName, sc ServiceChange) {
	ports := sc.Ports
	if sc.Err != nil {
		p.reportBad(sc.Err) // skipped: a bad object is not programmed
	}
	eps, errs := mergeSlices(sc.Slices)
	for _, err := range errs {
		p.reportBad(err)
	}
	var names []nat.ServicePortName
	localIPs := map[netip.Addr]bool{}
	noLocal := [2]bool{}
	for _, sp := range ports {
		list := eps[portKey{name: sp.Name.Port, proto: sp.Protocol, ipv6: sp.Name.IPv6}]
		p.ports[sp.Name], p.eps[sp.Name] = sp, list
		p.pending[sp.Name] = true
		names = append(names, sp.Name)
		hasLocal := false
		for _, e := range list {
			if e.Local && e.Ready {
				localIPs[e.Addr.Addr()] = true
				hasLocal = true
			}
		}
		noLocal[0] = noLocal[0] || (sp.InternalPolicy == nat.PolicyLocal && !hasLocal)
		noLocal[1] = noLocal[1] || (sp.ExternalPolicy == nat.PolicyLocal && !hasLocal)
	}
	for _, old := range p.portsBySvc[key] {
		if !slices.Contains(names, old) {
			delete(p.ports, old)
			delete(p.eps, old)
			p.pending[old] = true
		}
	}
	if len(names) == 0 {
		delete(p.portsBySvc, key)
		delete(p.checks, key)
		delete(p.noLocal, key)
		return
	}
	p.portsBySvc[key] = names
	p.noLocal[key] = noLocal
	if sp := ports[0]; sp.ExternalPolicy == nat.PolicyLocal && sp.HealthCheckNodePort != 0 {
		p.checks[key] = healthcheck.HealthCheck{Service: key, Port: sp.HealthCheckNodePort, LocalEndpoints: len(localIPs)}
	} else {
		delete(p.checks, key)
	}
}

// reportBad logs a malformed object once and counts it.
func (p *Proxier) reportBad(err error) {
	msg := err.Error()
	if p.reportedBad[msg] {
		return
	}
	p.reportedBad[msg] = true
	p.log.Error("object not programmed; every other one is", "err", msg)
	if p.metrics != nil {
		p.metrics.SkippedObjects.Inc()
	}
}

func (p *Proxier) flushStaleUDP(stale []nat.StaleBackend) {
	if p.flusher == nil || len(stale) == 0 {
		return
	}
	backends := make([]conntrack.Backend, len(stale))
	for i, s := range stale {
		backends[i] = conntrack.Backend{ServiceID: s.ServiceID, Addr: s.Backend}
	}
	n, err := p.flusher.FlushBackends(backends)
	if err != nil {
		p.log.Warn("conntrack flush of removed UDP backends failed", "err", err)
		return
	}
	if p.metrics != nil {
		p.metrics.ConntrackFlushed.Add(float64(n))
	}
}

// HealthCheckPorts lists the open health-check NodePorts.
func (p *Proxier) HealthCheckPorts() []uint16 { return p.svcHealth.Ports() }
