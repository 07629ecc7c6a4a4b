package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/ifacemgr"
	"github.com/sluice-net/sluice/kubeproxy"
	proxymetrics "github.com/sluice-net/sluice/kubeproxy/metrics"
	"github.com/sluice-net/sluice/kubeproxy/policysource"
	"github.com/sluice-net/sluice/kubeproxy/source"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
	"github.com/sluice-net/sluice/nat/maglev"
	"github.com/sluice-net/sluice/policy/k8s"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
)

// Config is the agent's configuration; flags and the config file fill it.
type Config struct {
	Kubeconfig        string
	Master            string
	Manifests         string // a folder of manifests instead of an API server
	NodeName          string
	NodePortAddresses []netip.Prefix
	NodePortPrimary   bool // --nodeport-addresses primary: the Node's primary IP too
	// KubeAPIQPS, KubeAPIBurst and KubeAPIContentType tune the API client
	// (0 or "": client-go's defaults).
	KubeAPIQPS         float32
	KubeAPIBurst       int
	KubeAPIContentType string
	// ConntrackTCPEstablished and ConntrackUDP replace the scanner's
	// timeouts of idle established TCP and UDP flows (0: conntrack's
	// defaults, 1 h and 60 s).
	ConntrackTCPEstablished, ConntrackUDP time.Duration
	HealthzBindAddress                    string
	MetricsBindAddress                    string
	// ServiceMetrics chooses the service ports with series of their own
	// (proxymetrics.ServiceSeries: active, all or none; "" is active), and
	// ServiceMetricsLimit bounds active's (0: 100).
	ServiceMetrics      string
	ServiceMetricsLimit int
	// IPv6Tables sizes the IPv6 tables: "full" (the built-in sizes and the
	// conntrack flags), "minimal" (maps.IPv6MinimalCapacity), or "auto"
	// (or ""): full when the node has IPv6 (an address beyond link-local
	// in its namespace, an IPv6 node IP or cluster CIDR), minimal when not.
	IPv6Tables string
	// Profiling serves Go's /debug/pprof on the metrics address
	// (kube-proxy's enableProfiling).
	Profiling bool
	// MinSyncPeriod bounds how often Services are synced and policies
	// updated (--min-sync-period).
	MinSyncPeriod    time.Duration
	SyncPeriod       time.Duration
	PinDir           string
	WorkloadPrefixes []string
	DataIfaces       string // regex; "" = interfaces holding a default route
	Cgroup           string // cgroup v2 for socket LB; "" disables it
	FailsafePorts    []uint16
	// DefaultHostEndpoint puts a host endpoint on every data interface no
	// HostEndpoint names: "" none, "deny-ingress" default deny inbound.
	DefaultHostEndpoint string
	NodeIPs             []netip.Addr // when no Node object says them
	Netns               string       // the node's network namespace ("" = the agent's own)
	ConntrackScanPeriod time.Duration
	// CheckInterval is how often the agent verifies its pins and
	// attachments and repairs what was removed behind its back (default
	// 10 s).
	CheckInterval time.Duration
	// MasqueradeAll SNATs every balanced flow to the node IP (kube-proxy's
	// --masquerade-all).
	MasqueradeAll bool
	// ClusterCIDR and ClusterCIDR6, when set, SNAT ClusterIP traffic of
	// their family arriving from outside them (kube-proxy's --cluster-cidr,
	// one CIDR per family).
	ClusterCIDR, ClusterCIDR6 netip.Prefix
	// DetectLocalMode tells the cluster's own traffic (not masqueraded to a
	// ClusterIP) from the rest, as kube-proxy's --detect-local-mode:
	// ClusterCIDR (the default: sources in ClusterCIDR), NodeCIDR (sources
	// in this Node's spec.podCIDRs), InterfaceNamePrefix (traffic entering
	// a managed interface named PodInterfaceNamePrefix...).
	DetectLocalMode        string
	PodInterfaceNamePrefix string
	// ConntrackMaxPerCore and ConntrackMin size the conntrack tables as
	// kube-proxy sizes nf_conntrack_max (maps.ConntrackCapacity); a
	// MaxPerCore of 0 keeps the built-in size.
	ConntrackMaxPerCore, ConntrackMin int
	// LBAlgorithm is how a new flow's backend is picked: "random" (the
	// default, kube-proxy's) or "maglev" (consistent hashing: every node
	// picks the same backend for a flow from outside; nat.MaglevOptions).
	LBAlgorithm string
	// MaglevTableSize is the slots of each Maglev table, a prime (0: the
	// default, 16381); MaglevClusterIP makes ClusterIPs use Maglev too.
	MaglevTableSize int
	MaglevClusterIP bool
	// ExternalServiceMode is how external traffic reaches a backend on
	// another node: "snat" (the default, kube-proxy's), "dsr" (direct
	// server return for TCP and UDP) or "hybrid" (DSR for TCP, SNAT for
	// UDP); nat.ExternalServiceMode.
	ExternalServiceMode string
	// SNATPortRange is the range a SNATed flow draws its source port from
	// when it cannot keep the client's (--snat-port-range, Calico's
	// BPFPSNATPorts); empty: nat.DefaultSNATPorts.
	SNATPortRange string
	// EventsPerSecond is the flow events each CPU may write a second (0:
	// none); FlowEvents adds service flows' starts and ends to the drops.
	EventsPerSecond int
	FlowEvents      bool
	// StackRouting leaves pod-to-pod traffic on this node to the node's IP
	// stack instead of the datapath's local delivery (nat.NodeConfig).
	StackRouting bool
	// Source, when set, is the source of Services and EndpointSlices in
	// place of the API server or a manifests folder: it runs until ctx ends,
	// sends objects to p.Tracker() (OnService, OnEndpointSlice) and calls
	// p.OnServicesSynced and p.OnEndpointSlicesSynced once it has sent the
	// first full set; nothing is programmed before. A custom source brings
	// no NetworkPolicy: the node's pods are not isolated.
	Source func(ctx context.Context, p *kubeproxy.Proxier)
	// XDPAcceleration is what runs at XDP on data interfaces: "disabled"
	// (or ""; the prefilter only), "native" (the prefilter and the
	// acceleration of external flows to remote backends, in driver mode: an
	// interface whose driver has no XDP is not ready) or "best-effort"
	// (the same, in generic mode where the driver has no XDP). Cilium's
	// --bpf-lb-acceleration has the same three.
	XDPAcceleration string
	// ProcSysNet is the node's /proc/sys/net, where per-interface sysctls
	// are written ("": /proc/sys/net; in a container, a hostPath mount of
	// it, since the container's own is read-only).
	ProcSysNet string
}

// DefaultMinSyncPeriod is chosen by measurement (BenchmarkMinSyncPeriod in
// bench, against a real API server, 1,000 Services created in a burst): a
// sync costs what changed, so kube-proxy's 1 s only delays programming (by
// 0.4 s after the last object). 20 ms coalesces a burst, the agent spending
// a quarter to a third less CPU over it than with no minimum, and adds no
// measurable delay; longer periods save little more CPU and add their length.
const DefaultMinSyncPeriod = 20 * time.Millisecond

// DefaultConfig is the configuration `sluice agent` starts from before its
// flags: kube-proxy's ports and sync period, the node's bpffs and cgroup v2
// root, a conntrack scan and a pin and attachment check every 10 s. A
// custom agent sets its source and node on top of it.
func DefaultConfig() Config {
	return Config{
		HealthzBindAddress: "0.0.0.0:10256", MetricsBindAddress: "127.0.0.1:10249",
		MinSyncPeriod: DefaultMinSyncPeriod, SyncPeriod: 30 * time.Second,
		PinDir: maps.DefaultPinDir, Cgroup: "/sys/fs/cgroup", ProcSysNet: ifacemgr.DefaultProcSysNet,
		ConntrackScanPeriod: 10 * time.Second, CheckInterval: 10 * time.Second, ConntrackMin: 131072,
		LBAlgorithm: "random", MaglevTableSize: maglev.DefaultSize, ExternalServiceMode: "snat", EventsPerSecond: 1000,
		ServiceMetrics: string(proxymetrics.ServiceSeriesActive), ServiceMetricsLimit: proxymetrics.DefaultServiceSeriesLimit,
		IPv6Tables: "auto", XDPAcceleration: XDPAccelerationDisabled,
	}
}

// The --xdp-acceleration values.
const (
	XDPAccelerationDisabled   = "disabled"
	XDPAccelerationNative     = "native"
	XDPAccelerationBestEffort = "best-effort"
)

// xdpAcceleration reads --xdp-acceleration: whether the acceleration runs,
// and whether only driver mode will do.
func (cfg Config) xdpAcceleration() (on, driverOnly bool, err error) {
	switch cfg.XDPAcceleration {
	case "", XDPAccelerationDisabled:
		return false, false, nil
	case XDPAccelerationNative:
		return true, true, nil
	case XDPAccelerationBestEffort:
		return true, false, nil
	}
	return false, false, fmt.Errorf("--xdp-acceleration %q: want %s, %s or %s", cfg.XDPAcceleration,
		XDPAccelerationDisabled, XDPAccelerationNative, XDPAccelerationBestEffort)
}

// nodeHasIPv6 reads --ipv6-tables: whether the IPv6 tables get their full
// size, and, when not, why.
func (cfg Config) nodeHasIPv6() (bool, string, error) {
	switch cfg.IPv6Tables {
	case "full":
		return true, "", nil
	case "minimal":
		return false, "--ipv6-tables=minimal", nil
	case "", "auto":
	default:
		return false, "", fmt.Errorf("--ipv6-tables %q: want auto, full or minimal", cfg.IPv6Tables)
	}
	if _, v6 := firstOfEach(cfg.NodeIPs); v6.IsValid() || cfg.ClusterCIDR6.IsValid() {
		return true, "", nil
	}
	has, err := ifacemgr.HasGlobalIPv6(cfg.Netns)
	if err != nil {
		return false, "", fmt.Errorf("--ipv6-tables=auto: %w", err)
	}
	return has, "the node has no IPv6 address beyond link-local, no IPv6 node IP and no IPv6 cluster CIDR", nil
}

// maglevOptions reads --lb-algorithm and the Maglev flags: nil for random
// picks, an error naming the flag for a bad value.
func maglevOptions(cfg Config) (*nat.MaglevOptions, error) {
	switch cfg.LBAlgorithm {
	case "", "random":
		return nil, nil
	case "maglev":
	default:
		return nil, fmt.Errorf("--lb-algorithm %q: want random or maglev", cfg.LBAlgorithm)
	}
	size := cmp.Or(cfg.MaglevTableSize, maglev.DefaultSize)
	if err := maglev.ValidSize(size); err != nil {
		return nil, fmt.Errorf("--maglev-table-size: %w", err)
	}
	return &nat.MaglevOptions{TableSize: size, ClusterIP: cfg.MaglevClusterIP}, nil
}

// xdpDevicesIf gives the interface manager the redirect targets to keep
// while the acceleration runs, and none to keep otherwise.
func xdpDevicesIf(accelerate bool, m *maps.Map[uint32, uint32]) *maps.Map[uint32, uint32] {
	if accelerate {
		return m
	}
	return nil
}

// clearXDPDevices empties the redirect targets a previous, accelerated run
// left (nothing reads them without the acceleration; an empty map says so).
func clearXDPDevices(m *maps.Map[uint32, uint32]) error {
	var keys []uint32
	if err := m.Iterate(func(k, _ uint32) bool { keys = append(keys, k); return true }); err != nil {
		return fmt.Errorf("%s: %w", gen.SluiceMapSlXdpdevV1, err)
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, maps.ErrKeyNotExist) {
			return fmt.Errorf("%s: %w", gen.SluiceMapSlXdpdevV1, err)
		}
	}
	return nil
}

// DefaultFailsafePorts are never dropped by the XDP prefilter (SSH, API
// server, kube-proxy health).
var DefaultFailsafePorts = []uint16{22, 6443, 10256}

// Agent is a running agent.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	set     *maps.Set
	filler  *maps.Filler // map fill metrics; nil where the kernel cannot count
	objs    *gen.SluiceObjects
	ifaces  *ifacemgr.Manager
	Proxier *kubeproxy.Proxier
	// healthLn and metricsLn are bound before the node is touched, so a bad
	// address fails the start with nothing attached or pinned.
	healthLn, metricsLn net.Listener
	maglev              *nat.MaglevOptions // nil: random picks
	// privatePins is set when the pins live in a bpffs the agent mounted in
	// a mount namespace that goes with it (maps.PreparedPinDir.Private).
	privatePins bool
	// reattached carries the attachments the interface manager repaired to
	// the guard, which counts them and shows them in /healthz.
	reattached chan string
	// loops runs every loop the agent starts, under a context Close
	// cancels; the first loop to fail ends them all (Wait says why).
	loops *errgroup.Group
	stop  context.CancelFunc
}

// CheckPrivileges tells, in words a person can act on, why the agent cannot use
// BPF here.
func CheckPrivileges() error {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		return fmt.Errorf("no BPF privilege (%v): run as root, or with CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN", err)
	}
	m.Close()
	return nil
}

// Run starts everything and blocks until ctx ends. On return the datapath stays
// in place, running from its pins: traffic keeps flowing while the agent is
// down, and the next start adopts it without disturbing live connections.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	a, err := Start(ctx, cfg, log)
	if err != nil {
		return err
	}
	err = a.Wait()
	a.Close()
	return err
}

// Wait blocks until the agent's loops end: when its context ends (nil), or
// when one of them fails, which ends the others (its error).
func (a *Agent) Wait() error { return a.loops.Wait() }

// spawn runs a loop until ctx ends. A loop that returns before that failed,
// and ends the agent.
func (a *Agent) spawn(ctx context.Context, name string, loop func() error) {
	a.loops.Go(func() error {
		err := loop()
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errors.New("stopped")
		}
		a.log.Error("agent loop failed; stopping the agent", "loop", name, "err", err)
		return fmt.Errorf("%s: %w", name, err)
	})
}

// Start brings the agent up and returns once its loops run (they stop with ctx).
func Start(ctx context.Context, cfg Config, log *slog.Logger) (*Agent, error) {
	if cfg.Source == nil && cfg.Manifests == "" && cfg.Kubeconfig == "" && cfg.Master == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil, errors.New("no source of services: give --kubeconfig or --master, run inside a cluster, or use --manifests DIR")
	}
	if cfg.Source != nil && cfg.Manifests != "" {
		return nil, errors.New("a Source and a manifests folder: give one source of services")
	}
	if cfg.Manifests != "" {
		// A missing folder is not an empty cluster: starting would remove
		// every Service the node's pins still serve.
		if err := source.CheckManifestDir(cfg.Manifests); err != nil {
			return nil, fmt.Errorf("--manifests: %w", err)
		}
	}
	if cfg.Source == nil && cfg.Manifests == "" && !kubeClient {
		return nil, errNoKubeClient
	}
	if err := cfg.localTraffic().Check(); err != nil {
		return nil, err
	}
	if cfg.ConntrackMaxPerCore < 0 || cfg.ConntrackMin < 0 {
		return nil, fmt.Errorf("--conntrack-max-per-core %d, --conntrack-min %d: must not be negative", cfg.ConntrackMaxPerCore, cfg.ConntrackMin)
	}
	if _, _, err := cfg.xdpAcceleration(); err != nil {
		return nil, err
	}
	if err := CheckPrivileges(); err != nil {
		return nil, err
	}
	if cfg.Cgroup != "" {
		if _, err := os.Stat(filepath.Join(cfg.Cgroup, "cgroup.controllers")); err != nil {
			return nil, fmt.Errorf("--cgroup %s is not a cgroup v2 directory (%v): mount cgroup2, or pass --cgroup= to disable socket load balancing", cfg.Cgroup, err)
		}
	}
	healthLn, err := listen("--healthz-bind-address", cfg.HealthzBindAddress)
	if err != nil {
		return nil, err
	}
	metricsLn, err := listen("--metrics-bind-address", cfg.MetricsBindAddress)
	if err != nil {
		closeListener(healthLn)
		return nil, err
	}
	fail := func(err error) (*Agent, error) {
		closeListener(healthLn)
		closeListener(metricsLn)
		return nil, err
	}
	// Every flag is checked: from here on the node is touched.
	pins, err := maps.PreparePinDir(cfg.PinDir)
	if err != nil {
		return fail(err)
	}
	switch {
	case pins.ThroughInit:
		log.Info("no bpffs is mounted in this mount namespace; pinning in the host's, through PID 1's root", "dir", pins.Dir)
	case pins.Private:
		log.Warn("no bpffs was mounted; mounted one in this process's own mount namespace: every pin goes with it, "+
			"so a restart drops every connection and `sluice` commands elsewhere find nothing. Give the agent the host's /sys/fs/bpf "+
			"(a hostPath volume with mountPropagation) or mount one on the host", "at", "/sys/fs/bpf", "dir", pins.Dir)
	case pins.Mounted:
		log.Info("no bpffs was mounted; mounted one", "at", "/sys/fs/bpf")
	}
	cfg.PinDir = pins.Dir
	// Counters of an older layout carry no connection: drop them, so an
	// upgrade that only adds counters needs no cleanup.
	if removed, err := maps.RemoveStaleDisposable(cfg.PinDir); err != nil {
		return fail(err)
	} else if len(removed) > 0 {
		log.Info("removed pins of an older layout that hold only counters", "dir", cfg.PinDir, "maps", removed)
	}
	// Older layouts this build can convert are migrated by Open; others
	// need a cleanup.
	if stale, err := maps.StalePins(cfg.PinDir); err != nil {
		return fail(err)
	} else if stale = slices.DeleteFunc(stale, maps.CanUpgrade); len(stale) > 0 {
		return fail(fmt.Errorf("pin directory %s holds maps of an older layout %v: run `sluice cleanup --bpf-pin-dir %s` (this drops live connections), then start again", cfg.PinDir, stale, cfg.PinDir))
	}
	capacity := maps.ConntrackCapacity(cfg.ConntrackMaxPerCore, cfg.ConntrackMin, runtime.NumCPU())
	// A conntrack table sized anew, or a map of an older layout, is
	// migrated: its entries move into the new map, and what the programs
	// still attached add meanwhile is copied once the new ones replace them
	// (start), so no connection is lost.
	maglevOpts, err := maglevOptions(cfg)
	if err != nil {
		return fail(err)
	}
	if _, err := nat.ParseExternalServiceMode(cfg.ExternalServiceMode); err != nil {
		return fail(fmt.Errorf("--external-service-mode: %w", err))
	}
	if _, err := snatPorts(cfg.SNATPortRange); err != nil {
		return fail(err)
	}
	if _, err := proxymetrics.ParseServiceSeries(cmp.Or(cfg.ServiceMetrics, string(proxymetrics.ServiceSeriesActive))); err != nil {
		return fail(fmt.Errorf("--service-metrics: %w", err))
	}
	if cfg.ServiceMetricsLimit < 0 {
		return fail(fmt.Errorf("--service-metrics-limit %d: want 0 (the default, %d) or more", cfg.ServiceMetricsLimit, proxymetrics.DefaultServiceSeriesLimit))
	}
	if ipv6, why, err := cfg.nodeHasIPv6(); err != nil {
		return fail(err)
	} else if !ipv6 {
		if capacity == nil {
			capacity = map[string]uint32{}
		}
		maps.MergeCapacity(capacity, maps.IPv6MinimalCapacity())
		log.Info("IPv6 tables are minimal: "+why+"; --ipv6-tables=full sizes them for IPv6 Services", "capacity", maps.IPv6MinimalCapacity())
	}
	var maglevSize uint32
	if maglevOpts != nil {
		maglevSize = uint32(maglevOpts.TableSize)
	}
	set, err := maps.Open(maps.OpenOptions{PinDir: cfg.PinDir, Capacity: capacity, Migrate: true, MaglevTableSize: maglevSize})
	if err != nil {
		var le *maps.LayoutError
		if errors.As(err, &le) {
			return fail(fmt.Errorf("%w (or run `sluice cleanup`)", err))
		}
		return fail(err)
	}
	for _, mig := range set.Migrations() {
		log.Info("migrating a map's entries into a new map", "from", mig.From, "to", mig.To,
			"from_capacity", mig.FromCapacity, "to_capacity", mig.ToCapacity, "entries", mig.Copied)
	}
	a := &Agent{cfg: cfg, log: log, set: set, healthLn: healthLn, metricsLn: metricsLn, reattached: make(chan string, 64),
		maglev: maglevOpts, privatePins: pins.Private}
	ctx, a.stop = context.WithCancel(ctx)
	a.loops, ctx = errgroup.WithContext(ctx)
	if err := a.start(ctx); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

func (a *Agent) start(ctx context.Context) error {
	cfg, log := a.cfg, a.log
	var err error
	loadOpts := gen.LoadOptions{Maps: a.set.All()}
	if a.maglev != nil {
		// The pinned tables' size (maps.Open) and the programs' must agree.
		loadOpts.MaglevTableSize = uint32(a.maglev.TableSize)
		a.maglev.Tables = a.set.Map(gen.SluiceMapSlMaglevV1)
	}
	if a.objs, err = gen.Load(loadOpts); err != nil {
		return err
	}
	if err := a.writeNodeConfig(); err != nil {
		return err
	}
	// Before any program is attached: connections netfilter translated
	// (kube-proxy's) are adopted once the Services are programmed
	// (takeover.go).
	takeoverFlows := newTakeoverMetrics()
	tk, tkErr := a.checkTakeover(takeoverFlows)

	ifstate, err := maps.IfState.In(a.set)
	if err != nil {
		return err
	}
	classifier := ifacemgr.Classifier{WorkloadPrefixes: cfg.WorkloadPrefixes, L3Prefixes: ifacemgr.DefaultL3Prefixes}
	if cfg.DataIfaces != "" {
		if classifier.DataIfaces, err = regexp.Compile(cfg.DataIfaces); err != nil {
			return fmt.Errorf("--data-ifaces %q: %w", cfg.DataIfaces, err)
		}
	}
	o := a.objs
	feed, err := newPolicyFeed(a.set, o, cfg.Netns, cfg.NodeName, log)
	if err != nil {
		return err
	}
	switch cfg.DefaultHostEndpoint {
	case "":
	case "deny-ingress":
		feed.defaultHost = &k8s.HostEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "default-host-endpoint"},
			Spec: k8s.HostEndpointSpec{InterfaceName: k8s.AllInterfaces, PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeIngress}}}
	default:
		return fmt.Errorf("--default-host-endpoint %q: want \"\" or deny-ingress", cfg.DefaultHostEndpoint)
	}
	xdpDevices, err := maps.XDPDevices.In(a.set)
	if err != nil {
		return err
	}
	xdpProg := o.SlXdpPrefilter
	accelerate, driverOnly, _ := cfg.xdpAcceleration()
	if accelerate {
		xdpProg = o.SlXdpAccel // the prefilter, then the acceleration
	} else if err := clearXDPDevices(xdpDevices); err != nil {
		return err
	}
	a.ifaces, err = ifacemgr.New(ifacemgr.Options{
		Netns: cfg.Netns, PinDir: filepath.Join(cfg.PinDir, "links"), Classifier: classifier, IfState: ifstate, Sysctls: true, ProcSysNet: cfg.ProcSysNet,
		Programs: ifacemgr.Programs{FromWorkload: o.SlFromWl, ToWorkload: o.SlToWl, FromHost: o.SlFromHost, ToHost: o.SlToHost,
			FromHostL3: o.SlFromHostL3, ToHostL3: o.SlToHostL3, XDP: xdpProg},
		XDPDriverOnly: driverOnly, XDPDevices: xdpDevicesIf(accelerate, xdpDevices),
		Policies: feed, Logger: log, ResyncInterval: cfg.CheckInterval,
		LocalTrafficPrefix: cfg.localTraffic().Prefix(),
		OnRepair: func(iface string, hook ifacemgr.Hook) {
			select {
			case a.reattached <- fmt.Sprintf("%s %s", iface, hook):
			default: // the guard is behind: the log has it
			}
		},
	})
	if err != nil {
		return err
	}
	feed.ifaces = a.ifaces
	if _, err := a.ifaces.CleanupStale(); err != nil {
		log.Warn("clean-up of stale attachments", "err", err)
	}
	a.ifaces.Apply()
	a.spawn(ctx, "interfaces", func() error { return a.ifaces.Run(ctx) })

	if cfg.Cgroup != "" {
		s, err := ifacemgr.AttachSocketLB(cfg.Cgroup, cfg.PinDir, ifacemgr.SocketLBPrograms{Connect4: o.SlConnect4,
			Sendmsg4: o.SlSendmsg4, Recvmsg4: o.SlRecvmsg4, Getpeername4: o.SlGetpeername4, SockEgress: o.SlSockEgress,
			Connect6: o.SlConnect6, Sendmsg6: o.SlSendmsg6, Recvmsg6: o.SlRecvmsg6, Getpeername6: o.SlGetpeername6})
		if err != nil {
			return err
		}
		s.Close() // pinned: the programs stay attached
	}
	// Every hook now runs the new programs (an interface whose attach
	// failed is retried and keeps the old ones meanwhile): copy what the
	// old programs added to the old maps since Open.
	if migs := a.set.Migrations(); len(migs) > 0 {
		if err := a.set.FinishMigrations(); err != nil {
			log.Error("finishing map migrations", "err", err)
		}
		for _, mig := range migs {
			log.Info("map migrated", "from", mig.From, "to", mig.To, "entries", mig.Copied+mig.Added, "added_at_finish", mig.Added)
		}
	}

	// The route lookup places other nodes' endpoints for the
	// internalTrafficPolicy Local NodePort expansion; the sources feed it
	// every Node.
	routes := &kubeproxy.NodeRoutes{}
	syncer, err := nat.NewSyncer(nat.Options{Maps: a.set, Logger: log, Routes: routes.Lookup,
		Trigger: func() { a.Proxier.RequestSync() }, Maglev: a.maglev})
	if err != nil {
		return err
	}
	ct, err := maps.Conntrack.In(a.set)
	if err != nil {
		return err
	}
	ct6, err := maps.Conntrack6.In(a.set)
	if err != nil {
		return err
	}
	fe, _ := maps.Frontends.In(a.set)
	be, _ := maps.Backends.In(a.set)
	hip, _ := maps.HostIPs.In(a.set)
	fe6, _ := maps.Frontends6.In(a.set)
	be6, _ := maps.Backends6.In(a.set)
	hip6, _ := maps.HostIPs6.In(a.set)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), takeoverFlows)
	metrics := proxymetrics.NewMetrics(reg)
	counters, err := maps.Counters.In(a.set)
	if err != nil {
		return err
	}
	names, err := maps.CounterNames()
	if err != nil {
		return err
	}
	reg.MustRegister(proxymetrics.NewCounterCollector(func() (map[string]uint64, error) { return maps.ReadCounters(counters, names) }))
	if accelerate, _, _ := cfg.xdpAcceleration(); accelerate {
		decisions, err := maps.XDPDecisions.In(a.set)
		if err != nil {
			return err
		}
		names, err := maps.XDPDecisionNames()
		if err != nil {
			return err
		}
		reg.MustRegister(proxymetrics.NewXDPDecisionCollector(func() (map[string]uint64, error) { return maps.ReadXDPDecisions(decisions, names) }))
	}
	if filler, err := maps.NewFiller(); err != nil {
		a.log.Warn("no map fill metrics: the kernel's map counts cannot be read", "err", err)
	} else {
		a.filler = filler
		reg.MustRegister(proxymetrics.NewMapFillCollector(func() (map[string]int64, error) { return filler.Fill(a.set) },
			a.set.Capacities))
	}
	reg.MustRegister(proxymetrics.NewMapMemoryCollector(a.set.KernelBytes))
	svcStats, err := maps.SvcStats.In(a.set)
	if err != nil {
		return err
	}
	ruleCtrs, err := maps.RuleCtrs.In(a.set)
	if err != nil {
		return err
	}
	svcCollector, err := proxymetrics.NewServiceCollector(proxymetrics.ServiceCollectorOptions{IDs: syncer.ServiceIDs, Stats: svcStats,
		Series: proxymetrics.ServiceSeries(cfg.ServiceMetrics), Limit: cfg.ServiceMetricsLimit, Logger: log})
	if err != nil {
		return err
	}
	reg.MustRegister(svcCollector,
		proxymetrics.NewRuleCollector(ruleCtrs, func(id uint32) (string, string, bool) {
			r, ok := feed.b.Rule(id)
			return r.Policy, r.Rule, ok
		}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_policy_errors",
		Help: "NetworkPolicy constructs the latest translation could not apply as written (each is logged, naming its object)"},
		func() float64 { return float64(feed.b.Stats().Errors) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_pins_private",
		Help: "1 when the pins are in a bpffs the agent mounted in its own mount namespace: they go with the agent, and a restart drops every connection"},
		func() float64 {
			if a.privatePins {
				return 1
			}
			return 0
		}))
	var entries func() (map[string]int64, error)
	if a.filler != nil {
		entries = func() (map[string]int64, error) { return a.filler.Fill(a.set) }
	}
	scanner, err := conntrack.NewScanner(conntrack.Options{Conntrack: ct, Conntrack6: ct6, Logger: log, Interval: cfg.ConntrackScanPeriod,
		OnScan: metrics.ObserveScan, Entries: entries,
		Scanners: []conntrack.EntryScanner{&conntrack.Liveness{Timeouts: a.timeouts()},
			&conntrack.StaleNAT{Frontends: fe, Backends: be, HostIPs: hip, Frontends6: fe6, Backends6: be6, HostIPs6: hip6}}})
	if err != nil {
		return err
	}
	a.spawn(ctx, "conntrack scanner", func() error { scanner.Run(ctx); return nil })

	minSync := cfg.MinSyncPeriod
	if minSync == 0 {
		minSync = -1 // --min-sync-period=0: no minimum (kubeproxy's zero means its default)
	}
	a.Proxier = kubeproxy.NewProxier(kubeproxy.Config{NodeName: cfg.NodeName, NodePortAddresses: cfg.NodePortAddresses,
		NodePortPrimary: cfg.NodePortPrimary,
		MinSyncPeriod:   minSync, SyncPeriod: cfg.SyncPeriod, OnNodeIPs: a.setNodeIPs, OnPodCIDRs: a.setPodCIDRs,
		Routes: routes}, syncer, scanner, metrics, log)
	routes.OnChange = syncer.RoutesChanged
	if a.privatePins {
		a.Proxier.Health.Warn("pins", "the bpffs at /sys/fs/bpf was mounted by the agent in its own mount namespace: "+
			"pins go with the agent and a restart drops every connection; give it the host's /sys/fs/bpf")
	}
	if len(cfg.NodeIPs) > 0 {
		a.Proxier.SetNodeIPs(cfg.NodeIPs)
	}
	if tkErr != nil {
		a.Proxier.Health.Repaired("takeover failed", tkErr.Error())
	}
	if tk != nil {
		tk.adopter = &conntrack.Adopter{Conntrack: ct, Conntrack6: ct6, Frontends: fe, Backends: be, HostIPs: hip,
			Frontends6: fe6, Backends6: be6, HostIPs6: hip6}
		tk.onFault = func(what string) { a.Proxier.Health.Repaired("takeover failed", what) }
		// Done after its two passes; a loop that returns ends the agent.
		a.spawn(ctx, "takeover", func() error { tk.run(ctx, a.Proxier.Programmed(), a.set); <-ctx.Done(); return nil })
	}
	switch {
	case cfg.Source != nil:
		feed.Update(k8s.Cluster{}) // no NetworkPolicy comes from it
		a.spawn(ctx, "source", func() error { cfg.Source(ctx, a.Proxier); return nil })
	case cfg.Manifests != "":
		src := &source.ManifestSource{Dir: cfg.Manifests, Log: log, Kinds: []func(*k8sruntime.Scheme) error{k8s.AddToScheme}, OnObjects: func(objs []source.Object) {
			feed.Update(policysource.FromObjects(objs))
		}}
		a.spawn(ctx, "manifests", func() error { src.Run(ctx, a.Proxier); return nil })
	default:
		if err := a.watchAPIServer(ctx, minSync, feed.Update); err != nil {
			return err
		}
	}
	a.spawn(ctx, "proxier", func() error { a.Proxier.Run(ctx); return nil })
	go a.returnListMemory(ctx)
	a.spawn(ctx, "guard", func() error { a.guard(ctx, metrics); return nil })

	if a.healthLn != nil {
		a.serve(ctx, "healthz", a.healthLn, a.Proxier.Health.Handler())
	}
	if a.metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		// kube-proxy names its mode here; tools (and the upstream e2e
		// spec "Networking should check kube-proxy urls") ask for it.
		mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, ProxyMode) })
		if cfg.Profiling {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		a.serve(ctx, "metrics", a.metricsLn, mux)
	}
	log.Info("sluice agent running", "node", cfg.NodeName, "pins", cfg.PinDir)
	return nil
}

// returnListMemory hands the memory the initial list and the first sync
// used, and no longer use, back to the kernel once that sync is done. Go
// returns freed memory slowly; without this the agent's RSS stays near its
// startup peak (at 10,000 Services, more than twice what it then holds).
func (a *Agent) returnListMemory(ctx context.Context) {
	select {
	case <-a.Proxier.Programmed():
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		debug.FreeOSMemory()
		runtime.ReadMemStats(&after)
		a.log.Debug("returned the initial sync's memory", "heapInUseMB", after.HeapInuse>>20,
			"returnedMB", (after.HeapReleased-before.HeapReleased)>>20)
	case <-ctx.Done():
	}
}

// ProxyMode is what /proxyMode answers on the metrics address, where
// kube-proxy answers iptables, ipvs or nftables.
const ProxyMode = "sluice-ebpf"

// guard pins the agent's maps again when a pin is removed behind its back
// (the next start would otherwise create an empty map the running programs
// do not read), and keeps /healthz unhealthy while a managed interface is not
// ready, its programs missing or running on other maps; ifacemgr repairs the
// attachments themselves.
func (a *Agent) guard(ctx context.Context, metrics *proxymetrics.Metrics) {
	t := time.NewTicker(cmp.Or(a.cfg.CheckInterval, 10*time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case what := <-a.reattached:
			metrics.AttachmentsRepaired.Inc()
			a.Proxier.Health.Repaired("attachments", what)
			continue
		case <-t.C:
		}
		names, err := a.set.RepairPins()
		if len(names) > 0 {
			a.log.Warn("map pins were removed; pinned them again", "maps", names)
			metrics.PinsRepaired.Add(float64(len(names)))
			a.Proxier.Health.Repaired("pins", strings.Join(names, " "))
		}
		if err != nil {
			a.log.Error("repairing map pins", "err", err)
		}
		var notReady []string
		for _, st := range a.ifaces.Statuses() {
			if !st.Ready {
				notReady = append(notReady, st.Name)
			}
		}
		if len(notReady) > 0 {
			a.Proxier.Health.SetSourceError("interfaces", fmt.Errorf("programs not in place on %s", strings.Join(notReady, ", ")))
		} else {
			a.Proxier.Health.SetSourceError("interfaces", nil)
		}
	}
}

// setNodeIPs makes the node's first address of each family that family's
// SNAT source; a family the node has no address of keeps what it had.
func (a *Agent) setNodeIPs(ips []netip.Addr) {
	v4, v6 := firstOfEach(ips)
	if !v4.IsValid() && !v6.IsValid() {
		return
	}
	err := nat.UpdateNodeConfig(a.set, func(c *nat.NodeConfig) {
		if v4.IsValid() {
			c.NodeIP = v4
		}
		if v6.IsValid() {
			c.NodeIP6 = v6
		}
	})
	if err != nil {
		a.log.Error("writing the node IP", "err", err)
	}
}

// firstOfEach returns the first IPv4 and the first IPv6 element of list,
// addresses or prefixes (either is the zero value when none is of its
// family).
func firstOfEach[T netip.Addr | netip.Prefix](list []T) (v4, v6 T) {
	var seen4, seen6 bool
	for _, x := range list {
		var a netip.Addr
		switch v := any(x).(type) {
		case netip.Addr:
			a = v
		case netip.Prefix:
			a = v.Addr()
		}
		switch {
		case a.Is4() && !seen4:
			v4, seen4 = x, true
		case a.Is6() && !seen6:
			v6, seen6 = x, true
		}
	}
	return v4, v6
}

// localTraffic is how the agent tells the cluster's own traffic
// (--detect-local-mode and the flags it reads).
func (cfg Config) localTraffic() nat.LocalTraffic {
	return nat.LocalTraffic{Mode: cfg.DetectLocalMode, ClusterCIDR: cfg.ClusterCIDR, ClusterCIDR6: cfg.ClusterCIDR6,
		InterfacePrefix: cfg.PodInterfaceNamePrefix}
}

// setPodCIDRs writes this Node's first pod CIDR of each family as that
// family's local-traffic CIDR (--detect-local-mode=NodeCIDR).
func (a *Agent) setPodCIDRs(cidrs []netip.Prefix) {
	if a.cfg.DetectLocalMode != nat.LocalModeNodeCIDR {
		return
	}
	if v4, v6 := firstOfEach(cidrs); !v4.IsValid() && !v6.IsValid() {
		a.log.Warn("--detect-local-mode=NodeCIDR: the Node has no pod CIDR yet; ClusterIP traffic is not masqueraded until it has", "node", a.cfg.NodeName)
		return
	}
	changed := false
	err := nat.UpdateNodeConfig(a.set, func(c *nat.NodeConfig) { changed = a.cfg.localTraffic().PodCIDRs(c, cidrs) })
	switch {
	case err != nil:
		a.log.Error("writing the Node's pod CIDR", "err", err)
	case changed:
		a.log.Info("local traffic is the Node's pod CIDRs", "cidrs", cidrs)
	}
}

// snatPorts reads --snat-port-range; empty is the datapath's default.
func snatPorts(s string) (nat.PortRange, error) {
	if s == "" {
		return nat.PortRange{}, nil
	}
	r, err := nat.ParsePortRange(s)
	if err != nil {
		return r, fmt.Errorf("--snat-port-range: %w", err)
	}
	return r, nil
}

// writeNodeConfig writes the node-wide settings and the prefilter's failsafe
// ports. The node IP and, with --detect-local-mode=NodeCIDR, the pod CIDR a
// previous agent wrote are kept until the Node object says otherwise: no
// window without SNAT or masquerade across a restart.
func (a *Agent) writeNodeConfig() error {
	// Socket LB serves the host's own sockets only: a pod's connect() takes
	// the TC path, which sees the pod's address (its affinity identity, its
	// source ranges) rather than the node's.
	cookie, err := ifacemgr.NetnsCookie(a.cfg.Netns)
	if err != nil {
		return fmt.Errorf("socket LB: the node's network namespace: %w", err)
	}
	err = nat.UpdateNodeConfig(a.set, func(c *nat.NodeConfig) {
		mode, _ := nat.ParseExternalServiceMode(a.cfg.ExternalServiceMode) // checked by Start
		next := nat.NodeConfig{NodeIP: c.NodeIP, NodeIP6: c.NodeIP6, SocketLBNetnsCookie: cookie,
			MasqueradeAll: a.cfg.MasqueradeAll, ExternalMode: mode,
			EventsPerSecond: uint32(max(a.cfg.EventsPerSecond, 0)), FlowEvents: a.cfg.FlowEvents,
			StackRouting: a.cfg.StackRouting}
		next.SNATPorts, _ = snatPorts(a.cfg.SNATPortRange) // checked by Start
		if v4, v6 := firstOfEach(a.cfg.NodeIPs); v4.IsValid() || v6.IsValid() {
			next.NodeIP, next.NodeIP6 = v4, v6
		}
		a.cfg.localTraffic().Apply(&next, *c) // NodeCIDR: written when the Node tells them (setPodCIDRs)
		*c = next
	})
	if err != nil {
		return err
	}
	failsafe, err := maps.Failsafe.In(a.set)
	if err != nil {
		return err
	}
	ports := a.cfg.FailsafePorts
	if ports == nil {
		ports = DefaultFailsafePorts
	}
	for _, p := range ports {
		if err := failsafe.Put(gen.SluiceFailsafeKey{Proto: 6, Port: gen.NetPort(p)}, gen.SluiceFailsafeValue{}, ebpf.UpdateAny); err != nil {
			return err
		}
	}
	return nil
}

// timeouts are conntrack's defaults with the configured replacements.
func (a *Agent) timeouts() conntrack.Timeouts {
	t := conntrack.DefaultTimeouts()
	if a.cfg.ConntrackTCPEstablished > 0 {
		t.TCPEstablished = a.cfg.ConntrackTCPEstablished
	}
	if a.cfg.ConntrackUDP > 0 {
		t.UDP = a.cfg.ConntrackUDP
	}
	return t
}

// listen binds an HTTP address given by flag ("" for none).
func listen(flag, addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return ln, nil
}

func closeListener(ln net.Listener) {
	if ln != nil {
		ln.Close()
	}
}

// serve serves h on ln until ctx ends.
func (a *Agent) serve(ctx context.Context, name string, ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	a.loops.Go(func() error {
		<-ctx.Done()
		_ = srv.Close() // the listener's close error says nothing useful at shutdown
		return nil
	})
	a.spawn(ctx, name+" server", func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
}

// Ready reports whether every managed interface has its programs and the
// proxier has synced at least once.
func (a *Agent) Ready() bool {
	if a.Proxier == nil || a.Proxier.Applied() == 0 || !a.Proxier.Health.Healthy() {
		return false
	}
	for _, s := range a.ifaces.Statuses() {
		if !s.Ready {
			return false
		}
	}
	return true
}

// Interfaces lists the managed interfaces.
func (a *Agent) Interfaces() []ifacemgr.Status { return a.ifaces.Statuses() }

// Maps is the agent's open map set.
func (a *Agent) Maps() *maps.Set { return a.set }

// Close stops the agent's loops, waits for them, and releases handles;
// pinned maps and attachments stay.
func (a *Agent) Close() {
	if a.stop != nil {
		a.stop()
		_ = a.loops.Wait()
	}
	closeListener(a.healthLn) // served ones are closed with the context too
	closeListener(a.metricsLn)
	if a.ifaces != nil {
		a.ifaces.Close()
	}
	if a.objs != nil {
		a.objs.Close()
	}
	if a.filler != nil {
		a.filler.Close()
	}
	a.set.Close()
}

// Cleanup removes everything the agent put on the node whose pins are in
// pinDir (ifacemgr.CleanupNode).
func Cleanup(pinDir, netns string) error { return ifacemgr.CleanupNode(pinDir, netns) }

// Leftovers lists what of Sluice's is pinned in pinDir (ifacemgr.Leftovers).
func Leftovers(pinDir string) []string { return ifacemgr.Leftovers(pinDir) }
