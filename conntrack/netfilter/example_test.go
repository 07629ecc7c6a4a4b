package netfilter_test

import (
	"fmt"
	"log"

	"github.com/sluice-net/sluice/conntrack/netfilter"
)

// List the connections netfilter translated (kube-proxy's DNAT and SNAT) in
// this network namespace, as the agent does before it takes a node over.
// It needs CAP_NET_ADMIN.
func ExampleConn_Translated() {
	nf, err := netfilter.Dial()
	if err != nil {
		log.Fatal(err)
	}
	defer nf.Close()
	flows, err := nf.Translated()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range flows {
		fmt.Printf("%d %v -> %v, backend %v, assured %v\n", f.Proto, f.Client, f.Frontend, f.Backend, f.Assured)
	}
}
