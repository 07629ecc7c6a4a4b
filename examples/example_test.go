package examples_test

import (
	"fmt"
	"io/fs"

	"github.com/sluice-net/sluice/examples"
)

// The demo's manifests are embedded: `sluice demo` serves them with no file
// on disk, and a test can read them the same way.
func Example() {
	names, err := fs.Glob(examples.Manifests, "*.yaml")
	fmt.Println(names, err)
	// Output: [demo.yaml] <nil>
}
