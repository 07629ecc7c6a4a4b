// Package agent assembles Sluice's modules into a running node agent: the
// maps (maps) and programs (gen) loaded and pinned, the interfaces attached
// (ifacemgr), Services and EndpointSlices programmed (kubeproxy, nat), the
// conntrack table scanned (conntrack), NetworkPolicy compiled and bound
// (policy), health and metrics served, pins and attachments guarded, and a
// node taken over from kube-proxy.
//
// `sluice agent` is this package behind flags. A custom agent starts from
// DefaultConfig, sets its node and a source of Services — the API server
// (Kubeconfig, Master, or in-cluster), a folder of manifests (Manifests), or
// its own (Source) — and calls Run:
//
//	cfg := agent.DefaultConfig()
//	cfg.NodeName, cfg.Source = "node-1", mySource
//	err := agent.Run(ctx, cfg, slog.Default())
//
// examples/customagent is such an agent, fed by a JSON file.
//
// Built with the tag sluice_nokube, the package leaves out the API server
// source, and with it client-go's clientset and informers (with the rest of
// the tag, 278 of the 718 packages of a first build of `sluice`): such an
// agent reads manifests or its own Source, and Start refuses a Config that
// needs an API server.
// `sluice demo` is built so in the README's first command.
//
// The agent owns the node's Sluice pins (Config.PinDir), the programs it
// attaches to the interfaces its classifier picks and to Config.Cgroup, and
// the per-interface sysctls of those interfaces. It never changes another
// interface, route or firewall rule; the connections it takes over from
// netfilter are the only netfilter state it writes (and deletes).
package agent
