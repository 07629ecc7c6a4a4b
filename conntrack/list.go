package conntrack

import (
	"slices"
	"time"

	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// ListFlows reads every flow in the maps of both families (ct6 may be nil),
// decoded as of now (kernel monotonic time): one Flow per forward entry, plus
// reverse entries whose forward entry is missing (orphans).
func ListFlows(ct *maps.Map[gen.SluiceCtKey, gen.SluiceCtValue], ct6 *maps.Map[Key, Entry], now time.Duration) ([]Flow, error) {
	entries := map[Key]Entry{}
	for _, t := range tables(ct, ct6) {
		if err := t.iterate(func(k Key, v Entry) bool { entries[k] = v; return true }); err != nil {
			return nil, err
		}
	}
	var flows []Flow
	for k, v := range entries {
		var p Pair
		if v.Type == gen.SluiceCtTypeCT_FORWARD {
			p = Pair{FwdKey: k, Fwd: v, HasFwd: true, RevKey: v.Peer}
			p.Rev, p.HasRev = entries[v.Peer]
		} else if fwd, ok := entries[v.Peer]; ok && fwd.Peer == k {
			continue // listed with its forward entry
		} else {
			p = Pair{RevKey: k, Rev: v, HasRev: true}
		}
		flows = append(flows, Decode(&p, now))
	}
	slices.SortFunc(flows, func(a, b Flow) int {
		if c := a.Frontend.Compare(b.Frontend); c != 0 {
			return c
		}
		return a.Client.Compare(b.Client)
	})
	return flows, nil
}
