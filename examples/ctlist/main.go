// Command ctlist prints the connections a running Sluice agent tracks, read
// from its pinned conntrack maps with the typed maps of package maps: a tool
// beside the agent that shares only its pins. Run as root on a node:
//
//	ctlist [-pin-dir /sys/fs/bpf/sluice]
package main

import (
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

func main() {
	dir := flag.String("pin-dir", maps.DefaultPinDir, "the agent's pin directory")
	flag.Parse()
	if err := list(os.Stdout, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "ctlist:", err)
		os.Exit(1)
	}
}

// list prints one line per connection: its client and frontend as the
// client sees them, its protocol and the backend it was given.
func list(w io.Writer, dir string) error {
	dir, err := maps.ReadablePinDir(dir) // says why when there is nothing to read
	if err != nil {
		return err
	}
	set, err := maps.Open(maps.OpenOptions{PinDir: dir, NoCreate: true})
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
	line := func(src, dst netip.AddrPort, proto uint8, backend netip.AddrPort) {
		fmt.Fprintf(w, "%-5s %-45s -> %-45s backend %s\n", protoName(proto), src, dst, backend)
	}
	err = ct.Iterate(func(k gen.SluiceCtKey, v gen.SluiceCtValue) bool {
		if v.Type == gen.SluiceCtTypeCT_FORWARD {
			line(netip.AddrPortFrom(gen.AddrFromNet(k.Saddr), gen.PortFromNet(k.Sport)),
				netip.AddrPortFrom(gen.AddrFromNet(k.Daddr), gen.PortFromNet(k.Dport)), k.Proto,
				netip.AddrPortFrom(gen.AddrFromNet(v.NatAddr), gen.PortFromNet(v.NatPort)))
		}
		return true
	})
	if err != nil {
		return err
	}
	return ct6.Iterate(func(k gen.SluiceCt6Key, v gen.SluiceCt6Value) bool {
		if v.Type == gen.SluiceCtTypeCT_FORWARD {
			line(netip.AddrPortFrom(gen.AddrFromNet6(k.Saddr), gen.PortFromNet(k.Sport)),
				netip.AddrPortFrom(gen.AddrFromNet6(k.Daddr), gen.PortFromNet(k.Dport)), k.Proto,
				netip.AddrPortFrom(gen.AddrFromNet6(v.NatAddr), gen.PortFromNet(v.NatPort)))
		}
		return true
	})
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	}
	return fmt.Sprint(p)
}
