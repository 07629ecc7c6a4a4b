package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/agent"
)

// kubeadm's kube-proxy ConfigMap (config.conf) as `kubeadm init` writes it:
// every field present, most at their zero value (kube-proxy's defaults).
const kubeadmConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
`

func applyKubeProxyConfig(t *testing.T, config string, args ...string) (agent.Config, []string, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	var cfg agent.Config
	agentFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	ignored, err := applyConfigFile(fs, path)
	return cfg, ignored, err
}

// The kube-proxy ConfigMap configures the agent: kubeadm's default applies
// without a warning; the fields that apply are translated, the others are
// named as ignored, unknown ones are refused by name.
func TestKubeProxyConfiguration(t *testing.T) {
	cfg, ignored, err := applyKubeProxyConfig(t, kubeadmConfig)
	if err != nil {
		t.Fatal(err)
	}
	if len(ignored) != 0 {
		t.Fatalf("kubeadm's default configuration has ignored fields %v", ignored)
	}
	if cfg.Kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" || cfg.ClusterCIDR != netip.MustParsePrefix("10.244.0.0/16") {
		t.Fatalf("kubeconfig %q, cluster CIDR %v", cfg.Kubeconfig, cfg.ClusterCIDR)
	}
	if cfg.HealthzBindAddress != "0.0.0.0:10256" || cfg.MinSyncPeriod != agent.DefaultMinSyncPeriod || cfg.SyncPeriod != 30*time.Second {
		t.Fatalf("defaults changed by zero values: %+v", cfg)
	}

	custom := strings.NewReplacer(
		"hostnameOverride: \"\"", "hostnameOverride: node-7",
		"clusterCIDR: 10.244.0.0/16", "clusterCIDR: 10.244.0.0/16,fd00:10:244::/56",
		"  maxPerCore: null", "  maxPerCore: 65536",
		"  tcpEstablishedTimeout: null", "  tcpEstablishedTimeout: 24h0m0s",
		"  udpTimeout: 0s\ndetectLocal", "  udpTimeout: 30s\ndetectLocal",
		"  interfaceNamePrefix: \"\"", "  interfaceNamePrefix: cali",
		"detectLocalMode: \"\"", "detectLocalMode: InterfaceNamePrefix",
		"healthzBindAddress: \"\"", "healthzBindAddress: 0.0.0.0/0:10256",
		"metricsBindAddress: \"\"", "metricsBindAddress: 127.0.0.1:10249",
		"mode: \"\"", "mode: nftables",
		"nftables:\n  masqueradeAll: false\n  masqueradeBit: null\n  minSyncPeriod: 0s",
		"nftables:\n  masqueradeAll: true\n  masqueradeBit: 14\n  minSyncPeriod: 10ms",
		"nodePortAddresses: null", "nodePortAddresses: [primary, 192.168.0.0/16]",
		"  qps: 0", "  qps: 50",
		"enableProfiling: false", "enableProfiling: true",
		"oomScoreAdj: null", "oomScoreAdj: -999",
		"kind: KubeProxyConfiguration", "kind: KubeProxyConfiguration\nfeatureGates: {SomeGate: true}",
	).Replace(kubeadmConfig)
	cfg, ignored, err = applyKubeProxyConfig(t, custom, "--min-sync-period=2ms")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.NodePortAddresses, []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}) || !cfg.NodePortPrimary {
		t.Fatalf("nodePortAddresses %v primary %v", cfg.NodePortAddresses, cfg.NodePortPrimary)
	}
	cfg.NodePortAddresses, cfg.WorkloadPrefixes, cfg.FailsafePorts, cfg.NodeIPs = nil, nil, nil, nil
	want := agent.Config{Kubeconfig: "/var/lib/kube-proxy/kubeconfig.conf", NodeName: "node-7",
		ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16"), ClusterCIDR6: netip.MustParsePrefix("fd00:10:244::/56"),
		ConntrackMaxPerCore: 65536, ConntrackMin: 131072,
		ConntrackTCPEstablished: 24 * time.Hour, ConntrackUDP: 30 * time.Second, DetectLocalMode: "InterfaceNamePrefix",
		PodInterfaceNamePrefix: "cali", HealthzBindAddress: "0.0.0.0:10256", MetricsBindAddress: "127.0.0.1:10249",
		MasqueradeAll: true, MinSyncPeriod: 2 * time.Millisecond, SyncPeriod: 30 * time.Second, NodePortPrimary: true,
		KubeAPIQPS: 50, Profiling: true, PinDir: cfg.PinDir, Cgroup: cfg.Cgroup, ConntrackScanPeriod: cfg.ConntrackScanPeriod,
		CheckInterval: cfg.CheckInterval, LBAlgorithm: "random", MaglevTableSize: 16381, ExternalServiceMode: "snat",
		EventsPerSecond: 1000, ProcSysNet: "/proc/sys/net", ServiceMetrics: "active", ServiceMetricsLimit: 100, IPv6Tables: "auto",
		XDPAcceleration: "disabled"}
	if fmt.Sprintf("%+v", cfg) != fmt.Sprintf("%+v", want) {
		t.Fatalf("translated\n%+v\nwant (the command line's --min-sync-period wins)\n%+v", cfg, want)
	}
	if !slices.Equal(ignored, []string{"featureGates.SomeGate", "nftables.masqueradeBit", "oomScoreAdj"}) {
		t.Fatalf("ignored %v", ignored)
	}

	for _, c := range []struct{ config, want string }{
		{strings.Replace(kubeadmConfig, "portRange: \"\"", "portRange: \"\"\nnoSuchField: 1", 1), `unknown field "noSuchField"`},
		{strings.Replace(kubeadmConfig, "  strictARP: false", "  strictARP: false\n  bogus: 1", 1), `unknown field "ipvs.bogus"`},
		{strings.Replace(kubeadmConfig, "v1alpha1", "v1alpha9", 1), `apiVersion "kubeproxy.config.k8s.io/v1alpha9"`},
		{strings.Replace(kubeadmConfig, "mode: \"\"", "mode: kernelspace", 1), `mode "kernelspace"`},
		{strings.Replace(kubeadmConfig, "healthzBindAddress: \"\"", "healthzBindAddress: 10.0.0.0/8:10256", 1), "healthzBindAddress"},
	} {
		if _, _, err := applyKubeProxyConfig(t, c.config); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error with %q, got %v", c.want, err)
		}
	}
}
