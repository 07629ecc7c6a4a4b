package maglev_test

import (
	"fmt"

	"github.com/sluice-net/sluice/nat/maglev"
)

// A Maglev table gives every backend an even share of its slots (in
// proportion to the weights), and every node that builds it from the same
// backends gets the same table, whatever their order.
func ExampleBuild() {
	table, err := maglev.Build([]maglev.Backend{{Name: "10.1.0.7:8080", Weight: 1}, {Name: "10.1.0.8:8080", Weight: 1},
		{Name: "10.1.0.9:8080", Weight: 2}}, 251)
	if err != nil {
		fmt.Println(err)
		return
	}
	share := map[uint32]int{}
	for _, b := range table {
		share[b]++
	}
	fmt.Println(len(table), "slots:", share[0], share[1], share[2])
	fmt.Println(maglev.ValidSize(250))
	// Output:
	// 251 slots: 63 63 125
	// maglev table size 250: out of range 251-131071
}
