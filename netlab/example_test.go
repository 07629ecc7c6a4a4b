package netlab_test

import (
	"log"
	"net"
	"net/netip"

	"github.com/sluice-net/sluice/netlab"
)

// A node with a pod behind a veth, as a CNI plugin would make it, then a
// socket opened inside the pod's namespace; Close removes every namespace
// and veth the lab made. It needs root.
func ExampleLab() {
	lab := &netlab.Lab{Prefix: "example"}
	defer lab.Close()
	node, err := lab.Router("node")
	if err != nil {
		log.Fatal(err)
	}
	pod, err := lab.Pod(node, "slwpod", "pod", netip.MustParsePrefix("10.240.0.2/24"), netip.MustParseAddr("10.240.0.1"))
	if err != nil {
		log.Fatal(err)
	}
	var ln net.Listener
	if err := netlab.Enter(netlab.Path(pod), func() (err error) { ln, err = net.Listen("tcp", ":8080"); return err }); err != nil {
		log.Fatal(err)
	}
	defer ln.Close() // the socket stays in the pod's namespace
}
