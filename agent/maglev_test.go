package agent

import (
	"strings"
	"testing"
)

func TestMaglevFlags(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		on   bool
		size int
		err  string
	}{
		{cfg: Config{}, on: false},
		{cfg: Config{LBAlgorithm: "random", MaglevTableSize: 1000}, on: false}, // the size only matters with maglev
		{cfg: Config{LBAlgorithm: "maglev"}, on: true, size: 16381},
		{cfg: Config{LBAlgorithm: "maglev", MaglevTableSize: 4093, MaglevClusterIP: true}, on: true, size: 4093},
		{cfg: Config{LBAlgorithm: "maglev", MaglevTableSize: 4096}, err: "--maglev-table-size: maglev table size 4096: not a prime"},
		{cfg: Config{LBAlgorithm: "round-robin"}, err: `--lb-algorithm "round-robin": want random or maglev`},
	} {
		o, err := maglevOptions(c.cfg)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: error %v, want %q", c.cfg, err, c.err)
			}
			continue
		}
		if err != nil || (o != nil) != c.on || (o != nil && (o.TableSize != c.size || o.ClusterIP != c.cfg.MaglevClusterIP)) {
			t.Errorf("%+v: %+v, %v", c.cfg, o, err)
		}
	}
}
