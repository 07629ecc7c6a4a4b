package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-net/sluice/cmd/internal/agent"
	"github.com/sluice-net/sluice/maps"
	"sigs.k8s.io/yaml"
)

// agentFlags binds the agent's flags (kube-proxy's names where they exist) to a
// Config.
func agentFlags(fs *flag.FlagSet, cfg *agent.Config) (configFile, logLevel *string) {
	host, _ := os.Hostname()
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "path to a kubeconfig file")
	fs.StringVar(&cfg.Master, "master", "", "address of the Kubernetes API server (overrides the kubeconfig)")
	fs.StringVar(&cfg.Manifests, "manifests", "", "a folder of Service/EndpointSlice/Node manifests to use instead of an API server")
	fs.StringVar(&cfg.NodeName, "hostname-override", host, "this node's name")
	fs.Func("nodeport-addresses", "comma-separated CIDRs: NodePorts only on node IPs inside them (default: every node IP)", func(s string) error {
		return parseList(s, &cfg.NodePortAddresses, netip.ParsePrefix)
	})
	fs.Func("node-ips", "comma-separated node IPs, when no Node object gives them (manifests)", func(s string) error {
		return parseList(s, &cfg.NodeIPs, netip.ParseAddr)
	})
	fs.StringVar(&cfg.HealthzBindAddress, "healthz-bind-address", "0.0.0.0:10256", "address of /healthz and /livez (empty disables)")
	fs.StringVar(&cfg.MetricsBindAddress, "metrics-bind-address", "127.0.0.1:10249", "address of /metrics (empty disables)")
	fs.DurationVar(&cfg.MinSyncPeriod, "min-sync-period", time.Second, "least time between syncs")
	fs.DurationVar(&cfg.SyncPeriod, "sync-period", 30*time.Second, "most time between syncs")
	fs.StringVar(&cfg.PinDir, "bpf-pin-dir", maps.DefaultPinDir, "bpffs directory of Sluice's pinned maps and links")
	fs.Func("workload-iface-prefixes", "comma-separated name prefixes of pods' host-side interfaces (default cali,lxc,veth,sl)", func(s string) error {
		cfg.WorkloadPrefixes = splitComma(s)
		return nil
	})
	fs.StringVar(&cfg.DataIfaces, "data-ifaces", "", "regex of node data interfaces (default: those holding a default route)")
	fs.StringVar(&cfg.Cgroup, "cgroup", "/sys/fs/cgroup", "cgroup v2 for socket-level load balancing (empty disables it)")
	fs.DurationVar(&cfg.CheckInterval, "check-interval", 10*time.Second, "how often pins and attachments are verified and repaired")
	fs.StringVar(&cfg.DetectLocalMode, "detect-local-mode", "",
		"what traffic is the cluster's own, not masqueraded to a ClusterIP: ClusterCIDR (default: sources in --cluster-cidr), NodeCIDR (in this Node's pod CIDR) or InterfaceNamePrefix")
	fs.StringVar(&cfg.PodInterfaceNamePrefix, "pod-interface-name-prefix", "",
		"with --detect-local-mode=InterfaceNamePrefix: traffic entering interfaces named so is local")
	fs.IntVar(&cfg.ConntrackMaxPerCore, "conntrack-max-per-core", 0,
		"flows tracked per CPU, as kube-proxy's: the table holds max(conntrack-min, this × CPUs) flows (0: the built-in 262,144 flows)")
	fs.IntVar(&cfg.ConntrackMin, "conntrack-min", 131072, "least flows tracked whatever the CPU count, with --conntrack-max-per-core")
	fs.DurationVar(&cfg.ConntrackScanPeriod, "conntrack-scan-period", 10*time.Second, "first conntrack scan interval (it adapts)")
	fs.BoolVar(&cfg.MasqueradeAll, "masquerade-all", false, "SNAT every Service flow to the node IP")
	fs.Func("cluster-cidr", "the pods' CIDR: ClusterIP traffic from outside it is SNATed to the node IP (comma-separated: the IPv4 one is used)", func(s string) error {
		for _, f := range splitComma(s) {
			p, err := netip.ParsePrefix(f)
			if err != nil {
				return err
			}
			if p.Addr().Is4() {
				cfg.ClusterCIDR = p
				return nil
			}
		}
		return fmt.Errorf("%s holds no IPv4 CIDR: the datapath is IPv4-only", s)
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
// not set.
func applyConfigFile(fs *flag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for key, v := range values {
		if fs.Lookup(key) == nil {
			return fmt.Errorf("config file %s: unknown key %q", path, key)
		}
		if set[key] || key == "config" {
			continue
		}
		var s string
		switch x := v.(type) {
		case []any:
			parts := make([]string, len(x))
			for i, p := range x {
				parts[i] = fmt.Sprint(p)
			}
			s = strings.Join(parts, ",")
		case float64:
			s = strconv.FormatFloat(x, 'f', -1, 64)
		case nil:
			s = ""
		default:
			s = fmt.Sprint(x)
		}
		if err := fs.Set(key, s); err != nil {
			return fmt.Errorf("config file %s: %s: %w", path, key, err)
		}
	}
	return nil
}

func runAgent(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sluice agent", flag.ContinueOnError)
	cfg := agent.Config{WorkloadPrefixes: []string{"cali", "lxc", "veth", "sl"}}
	configFile, logLevel := agentFlags(fs, &cfg)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *configFile != "" {
		if err := applyConfigFile(fs, *configFile); err != nil {
			return err
		}
	}
	log, err := newLogger(*logLevel)
	if err != nil {
		return err
	}
	return agent.Run(ctx, cfg, log)
}
