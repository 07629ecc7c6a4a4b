package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/sluice-net/sluice/agent"
	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/ifacemgr"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
)

// inspectFlags are the flags every inspection command takes.
type inspectFlags struct {
	fs     *flag.FlagSet
	pinDir *string
	asJSON *bool
}

func newInspectFlags(name string) *inspectFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	return &inspectFlags{fs: fs,
		pinDir: fs.String("bpf-pin-dir", maps.DefaultPinDir, "bpffs directory of Sluice's pins"),
		asJSON: fs.Bool("json", false, "print JSON for scripts instead of a table")}
}

// open opens the pinned maps without creating any, or says why there are
// none to open.
func (f *inspectFlags) open() (*maps.Set, error) {
	dir, err := maps.ReadablePinDir(*f.pinDir)
	if err != nil {
		return nil, err
	}
	*f.pinDir = dir // the links too are read from there
	return maps.Open(maps.OpenOptions{PinDir: *f.pinDir, NoCreate: true})
}

// interfaces reads the managed interfaces from the pins.
func (f *inspectFlags) interfaces(set *maps.Set) ([]ifacemgr.Interface, error) {
	ifstate, err := maps.IfState.In(set)
	if err != nil {
		return nil, err
	}
	return ifacemgr.ReadInterfaces(filepath.Join(*f.pinDir, "links"), ifstate)
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// subcommand checks that args start with the one subcommand an inspection
// command has ("list") and returns the rest.
func subcommand(args []string, sub, usage string) ([]string, error) {
	if len(args) == 0 || args[0] != sub {
		return nil, usageOr(usage, args)
	}
	return args[1:], nil
}

// report runs an inspection that reads the pins into one value and prints it:
// a table for people, or JSON with --json.
func report[T any](name string, args []string, read func(*inspectFlags, *maps.Set) (T, error), print func(T)) error {
	f := newInspectFlags(name)
	if err := parseFlags(f.fs, args); err != nil {
		return err
	}
	set, err := f.open()
	if err != nil {
		return err
	}
	defer set.Close()
	v, err := read(f, set)
	if err != nil {
		return err
	}
	if *f.asJSON {
		return printJSON(v)
	}
	print(v)
	return nil
}

func table(header string, rows [][]string) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, header)
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	w.Flush()
}

func runNAT(args []string) error {
	args, err := subcommand(args, "list", commandUsage["sluice nat list"])
	if err != nil {
		return err
	}
	return report("sluice nat list", args, func(_ *inspectFlags, set *maps.Set) ([]nat.Frontend, error) {
		return nat.ReadFrontends(set)
	}, printFrontends)
}

func printFrontends(fes []nat.Frontend) {
	var rows [][]string
	for _, fe := range fes {
		var bes []string
		for _, b := range fe.Backends {
			s := b.Address.String()
			if b.Local {
				s += "*"
			}
			bes = append(bes, s)
		}
		backends := strings.Join(bes, " ")
		if fe.Count == 0 && fe.Local == 0 {
			backends = "(no endpoints: rejected)"
		}
		rows = append(rows, []string{fe.Service, fe.Shown().String() + "/" + strings.ToLower(fe.Protocol),
			strings.Join(fe.Flags, ","), fmt.Sprint(fe.Count), fmt.Sprint(fe.Local), backends})
	}
	table("SERVICE\tFRONTEND\tFLAGS\tCLUSTER\tLOCAL\tBACKENDS (* local)", rows)
}

func runCT(args []string) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "flush") {
		return usageOr("sluice ct list|flush [--json] [--service NS/NAME] [--address IP] [--proto tcp|udp] [--bpf-pin-dir DIR]", args)
	}
	f := newInspectFlags("sluice ct " + args[0])
	service := f.fs.String("service", "", "only flows of this service (namespace/name, or namespace/name:port)")
	address := f.fs.String("address", "", "only flows with this client, frontend or backend address")
	proto := f.fs.String("proto", "", "only tcp or udp flows")
	if err := parseFlags(f.fs, args[1:]); err != nil {
		return err
	}
	switch *proto {
	case "", "tcp", "udp":
	default:
		return fmt.Errorf("--proto %q: want tcp or udp", *proto)
	}
	set, err := f.open()
	if err != nil {
		return err
	}
	defer set.Close()
	ct, err := maps.Conntrack.In(set)
	if err != nil {
		return err
	}
	ct6, err := maps.Conntrack6.In(set)
	if err != nil {
		return err
	}
	flows, err := conntrack.ListFlows(ct, ct6, conntrack.Monotonic())
	if err != nil {
		return err
	}
	names := map[uint32]string{}
	if m, err := maps.SvcNames.In(set); err == nil {
		m.Iterate(func(k gen.SluiceSvcnameKey, v gen.SluiceSvcnameValue) bool {
			names[k.SvcId] = gen.CString(v.Name[:])
			return true
		})
	}
	var addr netip.Addr
	if *address != "" {
		if addr, err = netip.ParseAddr(*address); err != nil {
			return fmt.Errorf("--address: %w", err)
		}
	}
	var picked []conntrack.Flow
	for _, fl := range flows {
		name := names[fl.ServiceID]
		if *service != "" && name != *service && !strings.HasPrefix(name, *service+":") {
			continue
		}
		if addr.IsValid() && fl.Client.Addr() != addr && fl.Frontend.Addr() != addr && fl.Backend.Addr() != addr {
			continue
		}
		if *proto != "" && fl.Proto != *proto {
			continue
		}
		picked = append(picked, fl)
	}
	if args[0] == "flush" {
		return flushFlows(ct, ct6, picked)
	}
	if *f.asJSON {
		return printJSON(picked)
	}
	for _, fl := range picked {
		fmt.Println(fl)
	}
	return nil
}

// flushFlows deletes the listed flows, both entries of each, as the
// conntrack scanner flushes.
func flushFlows(ct *maps.Map[gen.SluiceCtKey, gen.SluiceCtValue], ct6 *maps.Map[conntrack.Key, conntrack.Entry], flows []conntrack.Flow) error {
	type flowKey struct {
		proto            string
		client, frontend netip.AddrPort
	}
	picked := make(map[flowKey]bool, len(flows))
	for _, fl := range flows {
		dst := fl.Frontend
		if fl.DSR == conntrack.DSRAnswered {
			dst = fl.Backend // its packets arrive here translated already
		}
		picked[flowKey{fl.Proto, fl.Client, dst}] = true
	}
	sc, err := conntrack.NewScanner(conntrack.Options{Conntrack: ct, Conntrack6: ct6})
	if err != nil {
		return err
	}
	n, err := sc.Flush(func(k conntrack.Key, _ conntrack.Entry) bool {
		return picked[flowKey{conntrack.ProtoName(k.Proto), netip.AddrPortFrom(gen.AddrFromNet6(k.Saddr).Unmap(), gen.PortFromNet(k.Sport)),
			netip.AddrPortFrom(gen.AddrFromNet6(k.Daddr).Unmap(), gen.PortFromNet(k.Dport))}]
	})
	fmt.Printf("flushed %d flows\n", n)
	return err
}

func runIface(args []string) error {
	args, err := subcommand(args, "list", commandUsage["sluice iface list"])
	if err != nil {
		return err
	}
	return report("sluice iface list", args, (*inspectFlags).interfaces, printInterfaces)
}

func printInterfaces(ifaces []ifacemgr.Interface) {
	var rows [][]string
	for _, i := range ifaces {
		var hooks []string
		for _, h := range i.Hooks {
			hooks = append(hooks, string(h))
		}
		xdp := "-"
		if i.XDPMode != "" {
			xdp = string(i.XDPMode)
		}
		rows = append(rows, []string{fmt.Sprint(i.Index), i.Name, i.Class, fmt.Sprint(i.Ready), strings.Join(hooks, ","), xdp})
	}
	table("IFINDEX\tNAME\tCLASS\tREADY\tPROGRAMS\tXDP", rows)
}

func runMaps(args []string) error {
	return report("sluice maps", args, func(_ *inspectFlags, set *maps.Set) ([]maps.Usage, error) {
		// The kernel's counts where it keeps them (no walk of a large map);
		// a walk where the iterator cannot load.
		f, err := maps.NewFiller()
		if err != nil {
			return maps.Usages(set, nil)
		}
		defer f.Close()
		return maps.Usages(set, f)
	}, printUsages)
}

func printUsages(usages []maps.Usage) {
	var rows [][]string
	var kernel uint64
	for _, u := range usages {
		rows = append(rows, []string{u.Name, u.Type, fmt.Sprint(u.Entries), fmt.Sprint(u.Capacity),
			fmt.Sprintf("%.1f%%", 100*float64(u.Entries)/float64(max(u.Capacity, 1))), mebibytes(u.KernelBytes), u.Doc})
		kernel += u.KernelBytes
	}
	rows = append(rows, []string{"total", "", "", "", "", mebibytes(kernel), "kernel memory of all the maps"})
	table("MAP\tTYPE\tENTRIES\tCAPACITY\tFILL\tKERNEL\tHOLDS", rows)
}

// mebibytes writes a size in MiB, to a tenth.
func mebibytes(n uint64) string {
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

func runCleanup(args []string) error {
	fs := flag.NewFlagSet("sluice cleanup", flag.ContinueOnError)
	pinDir := fs.String("bpf-pin-dir", maps.DefaultPinDir, "bpffs directory of Sluice's pins")
	handBack := fs.Bool("hand-back", true, "first write Sluice's live Service connections into netfilter's conntrack "+
		"with their translation, so that kube-proxy (started before) keeps them on their backends")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	had := len(agent.Leftovers(*pinDir))
	if *handBack && had > 0 {
		report, err := agent.HandBack(*pinDir, "")
		switch {
		case errors.Is(err, agent.ErrNothingToHandBack):
		case err != nil:
			// The rest are handed back; removing Sluice is still what
			// was asked.
			fmt.Fprintln(os.Stderr, "hand-back:", err)
			fmt.Println(report)
		default:
			fmt.Println(report)
		}
	}
	// Right after the hand-back: until the programs are detached, Sluice
	// carries the connections past the entries just written.
	if err := agent.Cleanup(*pinDir, ""); err != nil {
		return err
	}
	if had == 0 {
		fmt.Println("nothing of Sluice's is pinned in", *pinDir)
		return nil
	}
	fmt.Printf("removed Sluice's programs, pins and maps from %s (%d pins)\n", *pinDir, had)
	return nil
}

// policyReport is what `sluice policy list` shows.
type policyReport struct {
	Interfaces []ifacemgr.Interface `json:"interfaces"`
	Rules      []ruleHits           `json:"rules"`
}

type ruleHits struct {
	ID   uint32 `json:"id"`
	Hits uint64 `json:"hits"`
}

func runPolicy(args []string) error {
	args, err := subcommand(args, "list", commandUsage["sluice policy list"])
	if err != nil {
		return err
	}
	return report("sluice policy list", args, readPolicy, printPolicy)
}

// readPolicy gathers the interfaces with a policy and every rule's counter.
func readPolicy(f *inspectFlags, set *maps.Set) (policyReport, error) {
	ifaces, err := f.interfaces(set)
	if err != nil {
		return policyReport{}, err
	}
	var rep policyReport
	for _, i := range ifaces {
		if i.IngressPolicy != ifacemgr.NoPolicy || i.EgressPolicy != ifacemgr.NoPolicy {
			rep.Interfaces = append(rep.Interfaces, i)
		}
	}
	ctrs, err := maps.RuleCtrs.In(set)
	if err != nil {
		return rep, err
	}
	err = ctrs.Iterate(func(k gen.SluiceRulectrKey, vs []uint64) bool {
		var n uint64
		for _, v := range vs {
			n += v
		}
		rep.Rules = append(rep.Rules, ruleHits{ID: uint32(k.RuleId), Hits: n})
		return true
	})
	slices.SortFunc(rep.Rules, func(a, b ruleHits) int { return cmp.Compare(a.ID, b.ID) })
	return rep, err
}

func printPolicy(rep policyReport) {
	slot := func(s uint32) string {
		if s == ifacemgr.NoPolicy {
			return "-"
		}
		return fmt.Sprint(s)
	}
	var rows [][]string
	for _, i := range rep.Interfaces {
		rows = append(rows, []string{fmt.Sprint(i.Index), i.Name, slot(i.IngressPolicy), slot(i.EgressPolicy)})
	}
	table("IFINDEX\tNAME\tINGRESS SLOT\tEGRESS SLOT", rows)
	fmt.Println()
	rows = nil
	for _, r := range rep.Rules {
		name := fmt.Sprintf("%#x", r.ID)
		switch {
		case r.ID == 0xffffffff:
			name += " (end of policy: deny)"
		case r.ID >= 0xffff0000:
			name += fmt.Sprintf(" (tier %d default)", r.ID-0xffff0000)
		}
		rows = append(rows, []string{name, fmt.Sprint(r.Hits)})
	}
	table("RULE\tNEW FLOWS", rows)
}
