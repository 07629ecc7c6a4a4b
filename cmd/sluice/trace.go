package main

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/sluice-net/sluice/trace"
)

const traceUsage = "sluice trace tcp|udp SRC:PORT -> DST:PORT --iface NAME [--direction ingress|egress] [--flags syn,ack,...] [--json]"

// runTrace runs a described packet through the node's datapath as a dry
// run and prints what it decided (package trace).
func runTrace(args []string) error {
	f := newInspectFlags("sluice trace")
	iface := f.fs.String("iface", "", "the interface the packet meets (required)")
	direction := f.fs.String("direction", "ingress", "ingress (arriving through the interface; leaving a pod for a pod's interface) or egress")
	flags := f.fs.String("flags", "syn", "TCP flags, comma-separated: syn, ack, fin, rst, psh")
	payload := f.fs.String("payload", "", "the packet's payload")
	if wantsHelp(args) {
		return parseFlags(f.fs, []string{"--help"})
	}
	if len(args) < 4 || args[2] != "->" {
		return usageOr(traceUsage, args)
	}
	pkt := trace.Packet{Proto: strings.ToLower(args[0])}
	var err error
	if pkt.Src, err = netip.ParseAddrPort(args[1]); err != nil {
		return fmt.Errorf("source %q: %w", args[1], err)
	}
	if pkt.Dst, err = netip.ParseAddrPort(args[3]); err != nil {
		return fmt.Errorf("destination %q: %w", args[3], err)
	}
	if err := parseFlags(f.fs, args[4:]); err != nil {
		return err
	}
	if *iface == "" {
		return errors.New("--iface is required: usage: " + traceUsage)
	}
	switch *direction {
	case "ingress", "egress":
	default:
		return fmt.Errorf("--direction %q: want ingress or egress", *direction)
	}
	pkt.Iface, pkt.Egress, pkt.TCPFlags, pkt.Payload = *iface, *direction == "egress", *flags, []byte(*payload)
	set, err := f.open()
	if err != nil {
		return err
	}
	defer set.Close()
	// An arriving packet meets the interface's XDP program first.
	ifaces, err := f.interfaces(set)
	if err != nil {
		return err
	}
	for _, i := range ifaces {
		if i.Name == pkt.Iface {
			pkt.XDP = i.XDPProgram
		}
	}
	r, err := trace.Run(set, pkt)
	if err != nil {
		return err
	}
	if *f.asJSON {
		return printJSON(r)
	}
	for _, s := range r.Steps {
		fmt.Println(s)
	}
	fmt.Println("verdict:", r.Verdict)
	if r.XDP != "" {
		fmt.Println("xdp:", r.XDP)
	}
	return nil
}
