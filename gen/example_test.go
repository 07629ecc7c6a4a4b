package gen_test

import (
	"fmt"
	"net/netip"

	"github.com/sluice-net/sluice/gen"
)

// Map keys and values hold addresses and ports in network byte order, as
// the programs read them off the wire: NetAddr and NetPort convert on the
// way in, AddrFromNet and PortFromNet on the way out.
func ExampleNetAddr() {
	key := gen.SluiceFeKey{Addr: gen.NetAddr(netip.MustParseAddr("10.96.0.10")), Port: gen.NetPort(80), Proto: 6}
	fmt.Printf("%#08x %#04x\n", key.Addr, key.Port)
	fmt.Println(gen.AddrFromNet(key.Addr), gen.PortFromNet(key.Port))
	// Output:
	// 0x0a00600a 0x5000
	// 10.96.0.10 80
}
