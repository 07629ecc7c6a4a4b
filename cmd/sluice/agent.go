package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/sluice-net/sluice/agent"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/ifacemgr"
	"github.com/sluice-net/sluice/nat"
	"github.com/sluice-net/sluice/nat/maglev"
	"sigs.k8s.io/yaml"
)

// agentFlags binds the agent's flags (kube-proxy's names where they exist) to a
// Config.
func agentFlags(fs *flag.FlagSet, cfg *agent.Config) (configFile, logLevel *string) {
	host, _ := os.Hostname()
	def := agent.DefaultConfig() // every default comes from it
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "path to a kubeconfig file")
	fs.StringVar(&cfg.Master, "master", "", "address of the Kubernetes API server (overrides the kubeconfig)")
	fs.StringVar(&cfg.Manifests, "manifests", "", "a folder of Service/EndpointSlice/Node manifests to use instead of an API server")
	fs.StringVar(&cfg.NodeName, "hostname-override", host, "this node's name")
	fs.Func("nodeport-addresses", "comma-separated CIDRs, or primary (the Node's primary IP), or all: NodePorts only on node IPs inside them (default: all)", func(s string) error {
		cfg.NodePortAddresses, cfg.NodePortPrimary = nil, false
		all := false
		defer func() {
			if all { // every node IP, with the wildcard entry, as with no list
				cfg.NodePortAddresses, cfg.NodePortPrimary = nil, false
			}
		}()
		for _, f := range splitComma(s) {
			switch f {
			case "all":
				all = true
			case "primary":
				cfg.NodePortPrimary = true
			case "localhost":
				return errors.New("localhost: NodePorts on loopback are not supported")
			default:
				p, err := netip.ParsePrefix(f)
				if err != nil {
					return err
				}
				cfg.NodePortAddresses = append(cfg.NodePortAddresses, p)
			}
		}
		return nil
	})
	fs.Func("kube-api-qps", "queries per second to the API server (default client-go's)", func(s string) error {
		v, err := strconv.ParseFloat(s, 32)
		cfg.KubeAPIQPS = float32(v)
		return err
	})
	fs.IntVar(&cfg.KubeAPIBurst, "kube-api-burst", 0, "burst of queries to the API server (default client-go's)")
	fs.StringVar(&cfg.KubeAPIContentType, "kube-api-content-type", "", "content type of requests to the API server")
	fs.DurationVar(&cfg.ConntrackTCPEstablished, "conntrack-tcp-timeout-established", 0, "idle established TCP flows expire after this (0: 1h)")
	fs.DurationVar(&cfg.ConntrackUDP, "conntrack-udp-timeout", 0, "idle UDP flows expire after this (0: 60s)")
	fs.Func("node-ips", "comma-separated node IPs, when no Node object gives them (manifests)", func(s string) error {
		return parseList(s, &cfg.NodeIPs, netip.ParseAddr)
	})
	fs.StringVar(&cfg.HealthzBindAddress, "healthz-bind-address", def.HealthzBindAddress, "address of /healthz and /livez (empty disables)")
	fs.StringVar(&cfg.MetricsBindAddress, "metrics-bind-address", def.MetricsBindAddress, "address of /metrics (empty disables)")
	fs.StringVar(&cfg.ServiceMetrics, "service-metrics", def.ServiceMetrics,
		"service ports with series of their own: active (those that carried traffic, up to --service-metrics-limit), all, or none; the node's totals are always exported")
	fs.IntVar(&cfg.ServiceMetricsLimit, "service-metrics-limit", def.ServiceMetricsLimit, "most service ports --service-metrics=active gives series")
	fs.StringVar(&cfg.IPv6Tables, "ipv6-tables", def.IPv6Tables,
		"size of the IPv6 tables: full, minimal (about 140 MiB less kernel memory, no IPv6 Service), or auto (full when the node has an IPv6 address beyond link-local)")
	fs.BoolVar(&cfg.Profiling, "profiling", false, "serve Go's /debug/pprof on the metrics address")
	fs.DurationVar(&cfg.MinSyncPeriod, "min-sync-period", def.MinSyncPeriod, "least time between syncs of Services and of policies (a burst of changes is coalesced over it)")
	fs.DurationVar(&cfg.SyncPeriod, "sync-period", def.SyncPeriod, "most time between syncs")
	fs.StringVar(&cfg.PinDir, "bpf-pin-dir", def.PinDir, "bpffs directory of Sluice's pinned maps and links")
	fs.Func("workload-iface-prefixes", "comma-separated name prefixes of pods' host-side interfaces (default cali,lxc,veth,sl)", func(s string) error {
		cfg.WorkloadPrefixes = splitComma(s)
		return nil
	})
	fs.StringVar(&cfg.DataIfaces, "data-ifaces", "", "regex of node data interfaces (default: those holding a default route)")
	fs.StringVar(&cfg.Cgroup, "cgroup", def.Cgroup, "cgroup v2 for socket-level load balancing (empty disables it)")
	fs.DurationVar(&cfg.CheckInterval, "check-interval", def.CheckInterval, "how often pins and attachments are verified and repaired")
	fs.StringVar(&cfg.DetectLocalMode, "detect-local-mode", "",
		"what traffic is the cluster's own, not masqueraded to a ClusterIP: ClusterCIDR (default: sources in --cluster-cidr), NodeCIDR (in this Node's pod CIDR) or InterfaceNamePrefix")
	fs.StringVar(&cfg.PodInterfaceNamePrefix, "pod-interface-name-prefix", "",
		"with --detect-local-mode=InterfaceNamePrefix: traffic entering interfaces named so is local")
	fs.IntVar(&cfg.ConntrackMaxPerCore, "conntrack-max-per-core", 0,
		"flows tracked per CPU, as kube-proxy's: each family's table holds max(conntrack-min, this × CPUs) flows (0: the built-in "+thousands(gen.ConntrackEntries/2)+" flows)")
	fs.IntVar(&cfg.ConntrackMin, "conntrack-min", def.ConntrackMin, "least flows tracked whatever the CPU count, with --conntrack-max-per-core")
	fs.DurationVar(&cfg.ConntrackScanPeriod, "conntrack-scan-period", def.ConntrackScanPeriod, "first conntrack scan interval (it adapts)")
	fs.BoolVar(&cfg.MasqueradeAll, "masquerade-all", false, "SNAT every Service flow to the node IP")
	fs.StringVar(&cfg.LBAlgorithm, "lb-algorithm", def.LBAlgorithm,
		"how new flows pick a backend: random, or maglev (consistent hashing: every node picks the same backend for a flow from outside)")
	fs.IntVar(&cfg.MaglevTableSize, "maglev-table-size", def.MaglevTableSize,
		fmt.Sprintf("slots of each Service's Maglev table: a prime, %d-%d (4 bytes each)", maglev.MinSize, maglev.MaxSize))
	fs.IntVar(&cfg.EventsPerSecond, "events-per-second", def.EventsPerSecond,
		"flow events (drops, and with --flow-events flow starts and ends) each CPU may write a second for sluice monitor; 0 writes none")
	fs.BoolVar(&cfg.StackRouting, "stack-routing", false,
		"route pod-to-pod traffic on this node through the node's IP stack and its netfilter FORWARD chain, instead of handing it from one pod's interface to the other's in the datapath")
	fs.StringVar(&cfg.ProcSysNet, "proc-sys-net", def.ProcSysNet,
		"the node's /proc/sys/net, where per-interface sysctls are set (in a container, a hostPath mount of it: the container's own /proc/sys is read-only)")
	fs.BoolVar(&cfg.FlowEvents, "flow-events", false, "write service flows' starts and ends as events too, not only drops (costs each new flow an event)")
	fs.StringVar(&cfg.ExternalServiceMode, "external-service-mode", def.ExternalServiceMode,
		"how external traffic reaches a backend on another node: snat (through this node, as kube-proxy), dsr (direct server return: the backend sees the client and answers it directly), or hybrid (DSR for TCP, SNAT for UDP)")
	fs.StringVar(&cfg.XDPAcceleration, "xdp-acceleration", def.XDPAcceleration,
		"external flows (NodePort, LoadBalancer, external IPs to backends on other nodes) started, translated and sent at XDP, before an skb exists: disabled (the XDP prefilter only), native (driver mode; an interface whose driver has no XDP is not ready), or best-effort (generic mode where the driver has no XDP)")
	fs.StringVar(&cfg.SNATPortRange, "snat-port-range", "",
		"MIN-MAX: the source ports a SNATed flow draws from when it cannot keep the client's (default "+nat.DefaultSNATPorts.String()+", as netfilter's MASQUERADE; Calico's BPFPSNATPorts)")
	fs.BoolVar(&cfg.MaglevClusterIP, "maglev-cluster-ip", false, "with --lb-algorithm=maglev, ClusterIPs pick by Maglev too (otherwise only NodePorts, load balancer and external IPs)")
	fs.Func("failsafe-ports", "TCP ports to the node that neither the XDP prefilter nor a host endpoint's policy ever blocks (default 22,6443,10256)", func(s string) error {
		return parseList(s, &cfg.FailsafePorts, func(f string) (uint16, error) {
			n, err := strconv.ParseUint(f, 10, 16)
			if err != nil || n == 0 {
				return 0, fmt.Errorf("port %q: want 1-65535", f)
			}
			return uint16(n), nil
		})
	})
	fs.StringVar(&cfg.DefaultHostEndpoint, "default-host-endpoint", "",
		"policy for the node's data interfaces no HostEndpoint names: \"\" (none) or deny-ingress (only the failsafe ports, replies and Services the node's own HostEndpoints allow reach the node)")
	fs.Func("cluster-cidr", "the pods' CIDRs, one per family, comma-separated: ClusterIP traffic from outside them is SNATed to the node IP", func(s string) error {
		cfg.ClusterCIDR, cfg.ClusterCIDR6 = netip.Prefix{}, netip.Prefix{}
		for _, f := range splitComma(s) {
			p, err := netip.ParsePrefix(f)
			if err != nil {
				return err
			}
			at := &cfg.ClusterCIDR
			if p.Addr().Is6() {
				at = &cfg.ClusterCIDR6
			}
			if at.IsValid() {
				return fmt.Errorf("%s: two CIDRs of one family (%s, %s)", s, *at, p)
			}
			*at = p.Masked()
		}
		return nil
	})
	logLevel = fs.String("log-level", "info", "debug, info, warn or error")
	configFile = fs.String("config", "", "a YAML or JSON file with the same keys as the flags (flags win)")
	return configFile, logLevel
}

func splitComma(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseList[T any](s string, out *[]T, parse func(string) (T, error)) error {
	*out = nil
	for _, f := range splitComma(s) {
		v, err := parse(f)
		if err != nil {
			return err
		}
		*out = append(*out, v)
	}
	return nil
}

// applyConfigFile sets every flag the file names that the command line did
// not set. The file is kube-proxy's KubeProxyConfiguration, or a YAML or JSON
// map of the agent's flag names. It returns the kube-proxy fields that were
// set but mean nothing to Sluice, for a warning.
func applyConfigFile(fs *flag.FlagSet, path string) (ignored []string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	flags := map[string]string{}
	if values["kind"] == kubeProxyConfigKind {
		if flags, ignored, err = fromKubeProxyConfig(data); err != nil {
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
	} else {
		for key, v := range values {
			if fs.Lookup(key) == nil {
				return nil, fmt.Errorf("config file %s: unknown key %q", path, key)
			}
			flags[key] = flagValue(v)
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for key, v := range flags {
		if set[key] || key == "config" {
			continue
		}
		if err := fs.Set(key, v); err != nil {
			return nil, fmt.Errorf("config file %s: %s: %w", path, key, err)
		}
	}
	return ignored, nil
}

// flagValue is a decoded YAML value as a flag's text: lists comma-separated.
func flagValue(v any) string {
	switch x := v.(type) {
	case []any:
		parts := make([]string, len(x))
		for i, p := range x {
			parts[i] = fmt.Sprint(p)
		}
		return strings.Join(parts, ",")
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case nil:
		return ""
	default:
		return fmt.Sprint(x)
	}
}

func runAgent(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sluice agent", flag.ContinueOnError)
	cfg := agent.Config{WorkloadPrefixes: ifacemgr.DefaultWorkloadPrefixes}
	configFile, logLevel := agentFlags(fs, &cfg)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var ignored []string
	if *configFile != "" {
		var err error
		if ignored, err = applyConfigFile(fs, *configFile); err != nil {
			return err
		}
	}
	log, err := newLogger(*logLevel)
	if err != nil {
		return err
	}
	if len(ignored) > 0 {
		log.Warn("kube-proxy configuration fields that do not apply to Sluice are ignored", "file", *configFile, "fields", ignored)
	}
	return agent.Run(ctx, cfg, log)
}

// thousands writes n with commas between groups of three digits, as the
// README and help texts write sizes.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
