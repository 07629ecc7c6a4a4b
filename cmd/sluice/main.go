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
	"errors"
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
	if err := run(ctx, os.Args[1:]); err != nil && !errors.Is(err, errHelp) {
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

// errHelp says that a command's help was asked for (-h, --help) and
// printed: sluice exits 0.
var errHelp = errors.New("help printed")

// commandUsage is each command's usage line, by its flag set's name, as
// `sluice help` lists them.
var commandUsage = map[string]string{
	"sluice agent":       "sluice agent [flags]",
	"sluice nat list":    "sluice nat list [--json] [--bpf-pin-dir DIR]",
	"sluice ct list":     "sluice ct list [--json] [--service NS/NAME] [--address IP] [--proto tcp|udp] [--bpf-pin-dir DIR]",
	"sluice ct flush":    "sluice ct flush [--service NS/NAME] [--address IP] [--proto tcp|udp] [--bpf-pin-dir DIR]",
	"sluice monitor":     "sluice monitor [--json] [--service NS/NAME] [--address IP] [--type drop|flow|REASON] [--count N]",
	"sluice trace":       traceUsage,
	"sluice iface list":  "sluice iface list [--json] [--bpf-pin-dir DIR]",
	"sluice policy list": "sluice policy list [--json] [--bpf-pin-dir DIR]",
	"sluice maps":        "sluice maps [--json] [--bpf-pin-dir DIR]",
	"sluice cleanup":     "sluice cleanup [--hand-back=false] [--bpf-pin-dir DIR]",
}

// wantsHelp tells whether args ask for help (before a "--").
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// usageOr is a command's usage as its answer to args that do not name
// what to do: printed, and errHelp, when args ask for help; else the
// error.
func usageOr(usage string, args []string) error {
	if wantsHelp(args) {
		fmt.Println("usage:", usage)
		return errHelp
	}
	return errors.New("usage: " + usage)
}

// parseFlags parses a command's flags and refuses anything else: the flag
// package stops at the first word that is not a flag, and every flag after a
// stray word would be ignored without a word (a `ct flush` that flushes
// everything, a `cleanup` of the default directory). --help prints the
// command's usage and flags to stdout, and gives errHelp.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.Usage = func() {
		line, ok := commandUsage[fs.Name()]
		if !ok {
			line = fs.Name() + " [flags]"
		}
		fmt.Fprintf(fs.Output(), "usage: %s\n\nflags:\n", line)
		fs.PrintDefaults()
	}
	if wantsHelp(args) {
		fs.SetOutput(os.Stdout)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q (flags go after the command, as --name value)", fs.Name(), fs.Arg(0))
	}
	return nil
}
