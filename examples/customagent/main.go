// Command customagent is a Sluice agent fed by a JSON file of services
// instead of Kubernetes: the datapath, conntrack, interfaces and health are
// the agent package's; only the source is its own. Run as root on a node:
//
//	customagent -services services.json -node-ip 10.0.0.1
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"

	"github.com/sluice-net/sluice/agent"
	"github.com/sluice-net/sluice/kubeproxy"
)

func main() {
	cfg := agent.DefaultConfig()
	file := flag.String("services", "services.json", "the services: a JSON list of kubeproxy.SimpleService")
	flag.StringVar(&cfg.NodeName, "node", "custom", "this node's name")
	flag.StringVar(&cfg.PinDir, "pin-dir", cfg.PinDir, "bpffs directory of the pins")
	flag.Func("node-ip", "this node's IP", func(s string) error {
		ip, err := netip.ParseAddr(s)
		cfg.NodeIPs = append(cfg.NodeIPs, ip)
		return err
	})
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, *file); err != nil {
		slog.Error("customagent", "err", err)
		os.Exit(1)
	}
}

// run serves the services in file until ctx ends.
func run(ctx context.Context, cfg agent.Config, file string) error {
	var services []kubeproxy.SimpleService
	data, err := os.ReadFile(file)
	if err == nil {
		err = json.Unmarshal(data, &services)
	}
	for _, s := range services {
		if err == nil {
			err = s.Check()
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	cfg.Source = func(ctx context.Context, p *kubeproxy.Proxier) {
		for _, s := range services {
			svc, slice := s.Objects()
			p.Tracker().OnService(svc, false)
			p.Tracker().OnEndpointSlice(slice, false)
		}
		p.OnServicesSynced()
		p.OnEndpointSlicesSynced()
		<-ctx.Done()
	}
	return agent.Run(ctx, cfg, slog.Default())
}
