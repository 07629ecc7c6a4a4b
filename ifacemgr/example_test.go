package ifacemgr_test

import (
	"fmt"
	"regexp"

	"github.com/sluice-net/sluice/ifacemgr"
)

// Which programs an interface gets follows from its name: pods' host-side
// veths by prefix, data interfaces by a regular expression (by default, the
// interfaces holding a default route), L3 and tunnel devices by prefix;
// everything else is left alone.
func ExampleClassifier_Classify() {
	c := ifacemgr.Classifier{WorkloadPrefixes: ifacemgr.DefaultWorkloadPrefixes, DataIfaces: regexp.MustCompile(`^eth0$`),
		L3Prefixes: ifacemgr.DefaultL3Prefixes}
	for _, name := range []string{"cali1234", "veth5678", "eth0", "wg0", "docker0"} {
		fmt.Println(name, c.Classify(name))
	}
	// Output:
	// cali1234 workload
	// veth5678 workload
	// eth0 data
	// wg0 l3
	// docker0 ignored
}
