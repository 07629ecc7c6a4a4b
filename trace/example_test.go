package trace_test

import (
	"fmt"
	"log"
	"net/netip"

	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/trace"
)

// Ask a running node what it would do with a packet, without sending one:
// the programs are loaded again over the agent's pinned maps (the ones they
// write, copied) and the packet is run through them. It needs root on a node
// where the agent runs; `sluice trace` is this behind flags.
func ExampleRun() {
	set, err := maps.Open(maps.OpenOptions{PinDir: maps.DefaultPinDir, NoCreate: true})
	if err != nil {
		log.Fatal(err) // is the agent running?
	}
	defer set.Close()
	res, err := trace.Run(set, trace.Packet{Proto: "tcp", Src: netip.MustParseAddrPort("10.244.1.5:40000"),
		Dst: netip.MustParseAddrPort("10.96.0.10:80"), Iface: "veth1234"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Program, res.Verdict, res.Conntrack)
	for _, step := range res.Steps {
		fmt.Println(" ", step)
	}
}
