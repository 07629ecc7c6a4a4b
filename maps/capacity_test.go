package maps_test

import (
	"testing"

	"github.com/sluice-net/sluice/maps"
)

func TestConntrackCapacity(t *testing.T) {
	for _, c := range []struct {
		perCore, min, cpus int
		want               uint32
	}{
		{0, 131072, 64, 0},                  // per-core 0: the built-in size
		{32768, 131072, 2, 2 * 131072},      // the minimum wins on a small node
		{32768, 131072, 64, 2 * 32768 * 64}, // per core on a large one
		{1 << 30, 0, 64, 1 << 30},           // capped
	} {
		got := maps.ConntrackCapacity(c.perCore, c.min, c.cpus)
		if c.want == 0 {
			if got != nil {
				t.Errorf("ConntrackCapacity(%d, %d, %d) = %v, want nil", c.perCore, c.min, c.cpus, got)
			}
			continue
		}
		if got[maps.Conntrack.Name] != c.want || got[maps.Conntrack6.Name] != c.want || len(got) != 2 {
			t.Errorf("ConntrackCapacity(%d, %d, %d) = %v, want %d for both tables", c.perCore, c.min, c.cpus, got, c.want)
		}
	}
}
