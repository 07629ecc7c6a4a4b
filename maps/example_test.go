package maps_test

import (
	"fmt"
	"log"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// Read a running agent's conntrack table from its pins, as an inspection
// tool does: NoCreate opens only what is pinned (of any capacity), and the
// typed map decodes keys and values with their generated Go types. It needs
// BPF privileges (root, or CAP_BPF and CAP_SYS_ADMIN).
func Example_readPinnedConntrack() {
	set, err := maps.Open(maps.OpenOptions{PinDir: maps.DefaultPinDir, NoCreate: true})
	if err != nil {
		log.Fatal(err) // not pinned: is the agent running?
	}
	defer set.Close()
	ct, err := maps.Conntrack.In(set)
	if err != nil {
		log.Fatal(err)
	}
	err = ct.Iterate(func(k gen.SluiceCtKey, v gen.SluiceCtValue) bool {
		if v.Type == gen.SluiceCtTypeCT_FORWARD {
			fmt.Printf("%v:%d -> %v:%d proto %d, service %d\n", gen.AddrFromNet(k.Saddr), gen.PortFromNet(k.Sport),
				gen.AddrFromNet(k.Daddr), gen.PortFromNet(k.Dport), k.Proto, v.SvcId)
		}
		return true // go on
	})
	if err != nil {
		log.Fatal(err)
	}
}
