package nat

import (
	"testing"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// The NodePort wildcard frontend the syncer writes is the address the
// datapath retries a node address with (FE_WILDCARD_ADDR in bpf/include).
func TestWildcardMatchesTheCHeaders(t *testing.T) {
	if c, g := bpftest.Define(t, "FE_WILDCARD_ADDR"), uint64(gen.NetAddr(wildcardIP)); c != g {
		t.Fatalf("FE_WILDCARD_ADDR is %#x in C, the syncer writes %#x", c, g)
	}
}
