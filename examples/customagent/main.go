// Command customagent is a Sluice agent fed by a JSON file of services
// (kubeproxy.SimpleService) instead of Kubernetes, run as root on a node.
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
	file := flag.String("services", "services.json", "the services: a JSON list")
	flag.StringVar(&cfg.NodeName, "node", "custom", "this node's name")
	var nodeIP netip.Addr
	flag.TextVar(&nodeIP, "node-ip", netip.Addr{}, "this node's IP")
	if flag.Parse(); nodeIP.IsValid() {
		cfg.NodeIPs = []netip.Addr{nodeIP}
	}
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
	for i := 0; err == nil && i < len(services); i++ {
		err = services[i].Check()
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
