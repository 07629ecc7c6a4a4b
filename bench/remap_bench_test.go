package bench

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// BenchmarkRemapSearch measures what a clashing flow's port search costs
// (ct_create, PORT_TRIES): a direct SYN from a client whose own port is held
// at the backend, with a share of the remap range (1024-65535) held too.
// With every port held each try fails and the flow is refused: the first
// such search on a CPU tries 128 ports (held=all/first), the next ones on
// that CPU 8 (held=all/crowded: PORT_TRIES_CROWDED). The first marks the
// destination full, and a flood's next flows are refused without a search
// (held=all/marked: sl_snatfull_v1), but for one full search every
// SNAT_FULL_NS.
func BenchmarkRemapSearch(b *testing.B) {
	backend := netip.MustParseAddrPort("10.2.0.7:8080")
	for _, c := range []struct {
		name    string
		held    func(port int) bool
		want    uint32
		uncrowd bool // clear the CPUs' crowding before each packet
		unmark  bool // clear the destinations marked full before each packet
	}{
		{"held=none-but-own", func(port int) bool { return port == int(clientAP.Port()) }, bpftest.ActOK, false, false},
		{"held=all/first", func(int) bool { return true }, bpftest.ActShot, true, true},
		{"held=all/crowded", func(int) bool { return true }, bpftest.ActShot, false, true},
		{"held=all/marked", func(int) bool { return true }, bpftest.ActShot, false, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			d := bpftest.NewDatapath(b, nodeIP)
			var keys []gen.SluiceCtKey
			var vals []gen.SluiceCtValue
			for port := 1024; port <= 65535; port++ {
				if c.held(port) {
					keys = append(keys, bpftest.CtKey(backend, netip.AddrPortFrom(clientAP.Addr(), uint16(port)), bpftest.ProtoTCP))
					vals = append(vals, gen.SluiceCtValue{Type: gen.SluiceCtTypeCT_REVERSE})
				}
			}
			if _, err := d.Objs.SlCtV2.BatchUpdate(keys, vals, nil); err != nil {
				b.Fatal(err)
			}
			syn := bpftest.TCPPacket(clientAP, backend, bpftest.SYN)
			// A successful search leaves the flow's entries: removed before
			// the next packet, outside the timed run, so each packet searches
			// the same range.
			measureNew(b, nil, d.Objs.SlFromWl, c.want, func(int) []byte {
				if c.uncrowd {
					if err := d.Objs.SlPortcrowdV1.Put(uint32(0), make([]gen.SluicePortCrowded, ebpf.MustPossibleCPU())); err != nil {
						b.Fatal(err)
					}
				}
				if c.unmark {
					if err := d.Objs.SlSnatfullV1.Delete(bpftest.CtKey(backend, netip.AddrPortFrom(clientAP.Addr(), 0), bpftest.ProtoTCP)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
						b.Fatal(err)
					}
				}
				if c.want == bpftest.ActOK {
					d.ClearConntrack()
					if _, err := d.Objs.SlCtV2.BatchUpdate(keys, vals, nil); err != nil {
						b.Fatal(err)
					}
				}
				return syn
			})
		})
	}
}
