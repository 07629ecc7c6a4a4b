// Command coredns is CoreDNS with only the plugins the conformance cluster's
// DNS uses (test/cluster/coredns.yaml): the same server and plugins as
// upstream's binary, without the dozens of others (cloud DNS back ends among
// them) that would make it the slowest thing CI builds.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }
