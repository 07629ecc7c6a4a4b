package binding_test

import (
	"log"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/policy/binding"
	"github.com/sluice-net/sluice/policy/k8s"
)

// Keep a node's pods' policies compiled and installed as the cluster
// changes, and give an interface its policy slots. A policy whose content
// is already installed (by this process or the one before it) is not
// compiled again. It needs BPF privileges and the agent's pins.
func ExampleBinder() {
	set, err := maps.Open(maps.OpenOptions{PinDir: maps.DefaultPinDir})
	if err != nil {
		log.Fatal(err)
	}
	defer set.Close()
	objs, err := gen.Load(gen.LoadOptions{Maps: set.All()})
	if err != nil {
		log.Fatal(err)
	}
	defer objs.Close()
	b, err := binding.New(binding.Options{Maps: set, Verdict: objs.SlPolicyVerdict, Node: "node-1"})
	if err != nil {
		log.Fatal(err)
	}
	var cluster k8s.Cluster // the node's pods, namespaces and policies, from informers
	endpoints, _ := b.Update(cluster)
	for id := range endpoints {
		in, out, err := b.Slots(42, id) // the slots for the interface with ifindex 42
		if err != nil {
			log.Fatal(err)
		}
		log.Printf("%s: ingress slot %d, egress slot %d", id, in, out)
	}
}
