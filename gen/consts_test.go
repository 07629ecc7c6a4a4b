package gen_test

import (
	"testing"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// The constants the Go side takes from the C headers say what the C says
// (bpftest.Define reads the #define).
func TestConstantsMatchTheC(t *testing.T) {
	for name, want := range map[string]uint64{
		"SNAT_PORT_MIN_DEFAULT": gen.SNATPortMinDefault,
		"SNAT_PORT_MAX_DEFAULT": gen.SNATPortMaxDefault,
		"MAGLEV_DEFAULT_SIZE":   gen.MaglevDefaultTableSize,
		"MAGLEV_MAX_SIZE":       gen.MaglevMaxTableSize,
		"SL_CT_MAX":             gen.ConntrackEntries,
		"IFSTATE_NO_POLICY":     gen.IfstateNoPolicy,
	} {
		if got := bpftest.Define(t, name); got != want {
			t.Errorf("%s is %d in the C headers, %d in gen", name, got, want)
		}
	}
}
