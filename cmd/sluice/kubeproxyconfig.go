package main

import (
	"fmt"
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// kubeProxyConfigKind is what tells a kube-proxy configuration file from one
// written with the agent's own flag names.
const kubeProxyConfigKind = "KubeProxyConfiguration"

// fromKubeProxyConfig translates kube-proxy's own configuration file
// (kubeproxy.config.k8s.io/v1alpha1, as in the kube-proxy ConfigMap) into
// the agent's flag values, so the same file configures both. Unknown fields
// are an error naming them; fields that mean nothing to Sluice (iptables'
// masquerade bit, the Windows section, feature gates...) are returned as
// ignored when set, for a warning. A zero value means kube-proxy's default
// and sets nothing.
func fromKubeProxyConfig(data []byte) (values map[string]string, ignored []string, err error) {
	var raw map[string]any
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, nil, err
	}
	var c kpconfig.KubeProxyConfiguration
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		// The decoder names an unknown field without its parents.
		if m := unknownField.FindStringSubmatch(err.Error()); m != nil {
			var paths []string
			for _, p := range fieldPaths(raw, "", true) {
				if p == m[1] || strings.HasSuffix(p, "."+m[1]) {
					paths = append(paths, p)
				}
			}
			return nil, nil, fmt.Errorf("unknown field %q in KubeProxyConfiguration", strings.Join(paths, `", "`))
		}
		return nil, nil, fmt.Errorf("not a valid KubeProxyConfiguration: %w", err)
	}
	if want := kpconfig.SchemeGroupVersion.String(); c.APIVersion != want {
		return nil, nil, fmt.Errorf("apiVersion %q: want %s", c.APIVersion, want)
	}
	values = map[string]string{}
	used := []string{"apiVersion", "kind"}
	set := func(field, flag, value string) {
		used = append(used, field)
		if value != "" {
			values[flag] = value
		}
	}
	duration := func(d time.Duration) string {
		if d == 0 {
			return ""
		}
		return d.String()
	}
	number := func(v *int32) string {
		if v == nil {
			return ""
		}
		return strconv.Itoa(int(*v))
	}

	set("clientConnection.kubeconfig", "kubeconfig", c.ClientConnection.Kubeconfig)
	if c.ClientConnection.QPS != 0 {
		set("clientConnection.qps", "kube-api-qps", strconv.FormatFloat(float64(c.ClientConnection.QPS), 'f', -1, 32))
	}
	if c.ClientConnection.Burst != 0 {
		set("clientConnection.burst", "kube-api-burst", strconv.Itoa(int(c.ClientConnection.Burst)))
	}
	set("clientConnection.contentType", "kube-api-content-type", c.ClientConnection.ContentType)
	set("hostnameOverride", "hostname-override", c.HostnameOverride)
	// bindAddress, other than the unspecified address, is the node's primary
	// IP to kube-proxy.
	switch ip, err := netip.ParseAddr(c.BindAddress); {
	case c.BindAddress == "" || err == nil && ip.IsUnspecified():
		used = append(used, "bindAddress")
	case err == nil:
		set("bindAddress", "node-ips", ip.String())
	}
	for _, b := range []struct{ field, flag, value string }{
		{"healthzBindAddress", "healthz-bind-address", c.HealthzBindAddress},
		{"metricsBindAddress", "metrics-bind-address", c.MetricsBindAddress},
	} {
		addr, err := bindAddress(b.value)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", b.field, err)
		}
		set(b.field, b.flag, addr)
	}
	set("clusterCIDR", "cluster-cidr", c.ClusterCIDR)
	if c.EnableProfiling {
		set("enableProfiling", "profiling", "true")
	} else {
		used = append(used, "enableProfiling")
	}
	set("nodePortAddresses", "nodeport-addresses", strings.Join(c.NodePortAddresses, ","))
	set("conntrack.maxPerCore", "conntrack-max-per-core", number(c.Conntrack.MaxPerCore))
	set("conntrack.min", "conntrack-min", number(c.Conntrack.Min))
	if d := c.Conntrack.TCPEstablishedTimeout; d != nil {
		set("conntrack.tcpEstablishedTimeout", "conntrack-tcp-timeout-established", duration(d.Duration))
	}
	set("conntrack.udpTimeout", "conntrack-udp-timeout", duration(c.Conntrack.UDPTimeout.Duration))
	set("detectLocalMode", "detect-local-mode", string(c.DetectLocalMode))
	set("detectLocal.interfaceNamePrefix", "pod-interface-name-prefix", c.DetectLocal.InterfaceNamePrefix)

	// The sync periods and masquerade-all of the mode kube-proxy would run.
	// The mode itself means nothing to Sluice.
	used = append(used, "mode")
	switch c.Mode {
	case "", "iptables":
		set("iptables.minSyncPeriod", "min-sync-period", duration(c.IPTables.MinSyncPeriod.Duration))
		set("iptables.syncPeriod", "sync-period", duration(c.IPTables.SyncPeriod.Duration))
		set("iptables.masqueradeAll", "masquerade-all", strconv.FormatBool(c.IPTables.MasqueradeAll))
	case "nftables":
		set("nftables.minSyncPeriod", "min-sync-period", duration(c.NFTables.MinSyncPeriod.Duration))
		set("nftables.syncPeriod", "sync-period", duration(c.NFTables.SyncPeriod.Duration))
		set("nftables.masqueradeAll", "masquerade-all", strconv.FormatBool(c.NFTables.MasqueradeAll))
	case "ipvs":
		set("ipvs.minSyncPeriod", "min-sync-period", duration(c.IPVS.MinSyncPeriod.Duration))
		set("ipvs.syncPeriod", "sync-period", duration(c.IPVS.SyncPeriod.Duration))
		set("iptables.masqueradeAll", "masquerade-all", strconv.FormatBool(c.IPTables.MasqueradeAll))
	default:
		return nil, nil, fmt.Errorf("mode %q: want iptables, nftables or ipvs", c.Mode)
	}
	if values["masquerade-all"] == "false" {
		delete(values, "masquerade-all")
	}

	// Whatever else the file sets is ignored, and said so.
	for _, field := range fieldPaths(raw, "", false) {
		if !slices.ContainsFunc(used, func(u string) bool { return field == u || strings.HasPrefix(field, u+".") }) {
			ignored = append(ignored, field)
		}
	}
	slices.Sort(ignored)
	return values, ignored, nil
}

// bindAddress turns kube-proxy's "IP:port" or "CIDR:port" (0.0.0.0/0:10256)
// into an address the agent can listen on.
func bindAddress(v string) (string, error) {
	i := strings.LastIndex(v, ":")
	if v == "" || i < 0 {
		return v, nil
	}
	host, port := v[:i], v[i+1:]
	if p, err := netip.ParsePrefix(host); err == nil {
		if p.Bits() != 0 {
			return "", fmt.Errorf("%s: only the whole address space (0.0.0.0/0) or an address can be served", v)
		}
		host = p.Addr().String()
	}
	return host + ":" + port, nil
}

var unknownField = regexp.MustCompile(`unknown field "([^"]+)"`)

// fieldPaths lists the dotted paths of a decoded YAML document's values:
// every one, or only those that are not zero (nil, "", 0, false, "0s", empty
// lists and maps).
func fieldPaths(v any, prefix string, all bool) []string {
	switch x := v.(type) {
	case map[string]any:
		var out []string
		for k, child := range x {
			path := k
			if prefix != "" {
				path = prefix + "." + k
			}
			out = append(out, fieldPaths(child, path, all)...)
		}
		if all && prefix != "" {
			out = append(out, prefix)
		}
		return out
	case nil:
		if !all {
			return nil
		}
	case string:
		if !all && (x == "" || x == "0" || x == "0s") {
			return nil
		}
	case []any:
		if !all && len(x) == 0 {
			return nil
		}
	default:
		if !all && reflect.ValueOf(x).IsZero() {
			return nil
		}
	}
	return []string{prefix}
}
