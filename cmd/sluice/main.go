// Command sluice is Sluice's node agent and its inspection tool.
//
//	sluice agent [flags]      run the dataplane (replaces kube-proxy)
//	sluice demo               a self-contained demo in network namespaces
//	sluice nat list           frontends and their backends, per service
//	sluice ct list|flush      conntrack flows
//	sluice monitor            drops and flows, live, as the datapath sees them
//	sluice trace              a described packet through the datapath, as a dry run
//	sluice iface list         managed interfaces and their programs
//	sluice policy list        policy programs per interface, per-rule counters
//	sluice maps               every map's fill level and capacity
//	sluice cleanup            remove everything Sluice put on the node
//	sluice version
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

const usage = `sluice: an eBPF service proxy for Kubernetes

Usage:
  sluice agent [flags]        run the dataplane on this node (replaces kube-proxy)
  sluice demo                 build a topology in network namespaces and show Sluice at work
  sluice nat list [--json]    programmed frontends with their backends, per service
  sluice ct list [--json] [--service NS/NAME] [--address IP] [--proto tcp|udp]
  sluice ct flush [--service NS/NAME] [--address IP] [--proto tcp|udp]
  sluice monitor [--json] [--service NS/NAME] [--address IP] [--type drop|flow|REASON] [--count N]
                              drops, and flow starts and ends, live (agent: --flow-events)
  sluice trace tcp|udp SRC:PORT -> DST:PORT --iface NAME [--direction ingress|egress] [--flags syn,ack] [--json]
                              what the datapath would do with that packet (changes nothing)
  sluice iface list [--json]  managed interfaces, attached programs, readiness
  sluice policy list [--json] policy slots per interface and per-rule hit counters
  sluice maps [--json]        each map's fill level and capacity
  sluice cleanup              hand live connections to netfilter, then remove everything Sluice put on this node
  sluice version

Inspection reads the pinned maps (--bpf-pin-dir, default /sys/fs/bpf/sluice):
it works while the agent runs and after it stopped.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "sluice:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Print(usage)
		return nil
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "agent":
		return runAgent(ctx, rest)
	case "demo":
		return runDemo(ctx, rest)
	case "nat":
		return runNAT(rest)
	case "ct":
		return runCT(rest)
	case "monitor":
		return runMonitor(ctx, rest)
	case "trace":
		return runTrace(rest)
	case "iface":
		return runIface(rest)
	case "maps":
		return runMaps(rest)
	case "policy":
		return runPolicy(rest)
	case "cleanup":
		return runCleanup(rest)
	case "version":
		fmt.Println("sluice", version)
		return nil
	case "help", "-h", "--help":
		fmt.Print(usage)
		return nil
	}
	return fmt.Errorf("unknown command %q (sluice help lists them)", cmd)
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

// parseFlags parses a command's flags and refuses anything else: the flag
// package stops at the first word that is not a flag, and every flag after a
// stray word would be ignored without a word (a `ct flush` that flushes
// everything, a `cleanup` of the default directory).
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q (flags go after the command, as --name value)", fs.Name(), fs.Arg(0))
	}
	return nil
}
