package conntrack_test

import (
	"fmt"

	"github.com/sluice-net/sluice/conntrack"
)

// How long an idle flow lives depends on its protocol and, for TCP, on what
// the datapath saw of it (the flags in its two entries): a SYN never
// answered goes after 20 s, an established connection after an hour.
func ExampleTimeouts_Timeout() {
	t := conntrack.DefaultTimeouts()
	udp := &conntrack.Pair{FwdKey: conntrack.Key{Proto: 17}, HasFwd: true}
	syn := &conntrack.Pair{FwdKey: conntrack.Key{Proto: 6}, HasFwd: true, Fwd: conntrack.Entry{TcpSeen: 0x02}}
	fmt.Println(t.Timeout(udp), syn.State(), t.Timeout(syn))
	// Output: 1m0s syn-sent 20s
}
