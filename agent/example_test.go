package agent_test

import (
	"context"
	"log/slog"
	"os"
	"os/signal"

	"github.com/sluice-net/sluice/agent"
	"github.com/sluice-net/sluice/kubeproxy"
)

// A custom agent: sluice agent's defaults, a node, and a source of its own.
// Run blocks until the context ends, the datapath staying in place from its
// pins (examples/customagent is the whole program, with its test). It needs
// root on a node.
func ExampleRun() {
	cfg := agent.DefaultConfig()
	cfg.NodeName = "node-1"
	cfg.Source = func(ctx context.Context, p *kubeproxy.Proxier) {
		svc, slice := kubeproxy.SimpleService{Name: "web", IP: "10.96.7.7", Port: 80, Protocol: "TCP",
			TargetPort: 8080, Backends: []string{"10.1.0.7"}}.Objects()
		p.Tracker().OnService(svc, false)
		p.Tracker().OnEndpointSlice(slice, false)
		p.OnServicesSynced()
		p.OnEndpointSlicesSynced()
		<-ctx.Done()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := agent.Run(ctx, cfg, slog.Default()); err != nil {
		slog.Error("agent", "err", err)
	}
}
