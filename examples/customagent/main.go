// Command customagent is a Sluice agent fed by a JSON file of services
// instead of Kubernetes: the datapath, conntrack, interfaces and health are
// the agent package's; the source is its own. Run as root on a node:
//
//	customagent -services services.json -node-ip 10.0.0.1
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"

	"github.com/sluice-net/sluice/agent"
	"github.com/sluice-net/sluice/kubeproxy"
)

// A service is one frontend and the backends it balances over.
type service struct {
	Name       string   `json:"name"`
	IP         string   `json:"ip"`
	Port       int32    `json:"port"`
	Protocol   string   `json:"protocol"` // TCP or UDP
	TargetPort int32    `json:"targetPort"`
	Backends   []string `json:"backends"` // IPs
}

func main() {
	cfg := agent.DefaultConfig()
	file := flag.String("services", "services.json", "the services, a JSON list")
	flag.StringVar(&cfg.NodeName, "node", "custom", "this node's name")
	flag.StringVar(&cfg.PinDir, "pin-dir", cfg.PinDir, "bpffs directory of the pins")
	flag.StringVar(&cfg.Netns, "netns", "", "the node's network namespace (default: this one)")
	flag.Func("node-ip", "this node's IP", func(s string) error { return parseIP(s, &cfg) })
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
	data, err := os.ReadFile(file)
	var services []service
	if err == nil {
		err = json.Unmarshal(data, &services)
	}
	if err != nil {
		return err
	}
	for _, s := range services {
		if err := s.check(); err != nil {
			return fmt.Errorf("%s: service %q: %w", file, s.Name, err)
		}
	}
	cfg.Source = func(ctx context.Context, p *kubeproxy.Proxier) {
		for _, s := range services {
			svc, slice := s.objects()
			p.Tracker().OnService(svc, false)
			p.Tracker().OnEndpointSlice(slice, false)
		}
		p.OnServicesSynced()
		p.OnEndpointSlicesSynced()
		<-ctx.Done()
	}
	return agent.Run(ctx, cfg, slog.Default())
}
