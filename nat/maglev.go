package nat

// Maglev tables: one per service id whose frontends pick by Maglev, written
// into the datapath's sl_maglev_v1 (bpf/include/maglev.h).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat/maglev"
)

// MaglevOptions turns Maglev consistent hashing on: every node then picks the
// same backend for a flow from outside, so a connection that an upstream
// router moves to another node keeps its backend, and one backend leaving
// moves few flows.
type MaglevOptions struct {
	// Tables is the datapath's sl_maglev_v1: the pinned map of a maps.Set
	// opened with MaglevTableSize = TableSize, which the programs use
	// (gen.Load with the same MaglevTableSize).
	Tables *ebpf.Map
	// TableSize is the slots of a table: a prime (maglev.ValidSize); 0 is
	// maglev.DefaultSize. Each table takes 4 bytes a slot.
	TableSize int
	// ClusterIP makes ClusterIP frontends pick by Maglev too; otherwise only
	// NodePorts, load balancer IPs and external IPs do.
	ClusterIP bool
}

func (o *MaglevOptions) size() int {
	if o.TableSize == 0 {
		return maglev.DefaultSize
	}
	return o.TableSize
}

// maglevTable builds the table of a service id: each slot an ordinal of the
// cluster backends list[start:start+count]. Names are addresses (the same on
// every node); weights come from the endpoints.
func maglevTable(list []gen.SluiceBe6Value, start, count uint32, eps []Endpoint, size int) ([]uint32, error) {
	if count == 0 {
		return nil, nil
	}
	weights := map[string]uint32{}
	for i := range eps {
		weights[eps[i].Addr.String()] = eps[i].Weight
	}
	cluster := list[start : start+count]
	bs := make([]maglev.Backend, len(cluster))
	for i, v := range cluster {
		name := backendAddr(v).String()
		bs[i] = maglev.Backend{Name: name, Weight: weights[name]}
	}
	table, err := maglev.Build(bs, size)
	if err != nil {
		return nil, err
	}
	for i := range table {
		table[i] += start
	}
	return table, nil
}

// maglevWriter keeps sl_maglev_v1 in step with the tables desired. A table is
// replaced whole: a new inner map, filled, then put in the outer map in one
// update.
type maglevWriter struct {
	outer   *ebpf.Map
	inner   *ebpf.MapSpec
	desired map[uint32][]uint32
	written map[uint32][]uint32
	// built holds each service id's last table with what it was built
	// from: a plan whose cluster backends did not change (a node address
	// change plans every Service again) reuses it rather than build 16,381
	// slots again, and the write finds it already written.
	built  map[uint32]builtTable
	builds int // tables built since the last Apply's stats
	size   int
}

type builtTable struct {
	from  string // tableInputs
	table []uint32
}

func newMaglevWriter(o *MaglevOptions) (*maglevWriter, error) {
	if err := maglev.ValidSize(o.size()); err != nil {
		return nil, err
	}
	if o.Tables == nil || o.Tables.Type() != ebpf.HashOfMaps {
		return nil, fmt.Errorf("nat syncer: maglev: Tables is not the datapath's %s", gen.SluiceMapSlMaglevV1)
	}
	w := &maglevWriter{
		outer: o.Tables,
		inner: &ebpf.MapSpec{Name: "sl_maglev_tbl", Type: ebpf.Array, KeySize: 4,
			ValueSize: uint32(o.size()) * 4, MaxEntries: 1},
		desired: map[uint32][]uint32{}, written: map[uint32][]uint32{},
		built: map[uint32]builtTable{}, size: o.size(),
	}
	// Tables a previous agent pinned serve packets until this one replaces
	// them (their content unknown: each is written again) or deletes them.
	var id uint32
	it := w.outer.Iterate()
	for it.Next(&id, new(uint32)) {
		w.written[id] = nil
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("nat syncer: maglev tables: %w", err)
	}
	return w, nil
}

// table is maglevTable for service id, reusing the table it built last when
// the same backends, weights and table size are asked for.
func (w *maglevWriter) table(id uint32, list []gen.SluiceBe6Value, start, count uint32, eps []Endpoint) ([]uint32, error) {
	from := tableInputs(list, start, count, eps, w.size)
	if b, ok := w.built[id]; ok && b.from == from {
		return b.table, nil
	}
	table, err := maglevTable(list, start, count, eps, w.size)
	if err == nil {
		w.built[id] = builtTable{from: from, table: table}
		w.builds++
	}
	return table, err
}

// tableInputs is what a table is built from, as a comparable string.
func tableInputs(list []gen.SluiceBe6Value, start, count uint32, eps []Endpoint, size int) string {
	b := binary.LittleEndian.AppendUint32(nil, uint32(size))
	b = binary.LittleEndian.AppendUint32(b, start)
	weights := map[netip.AddrPort]uint32{}
	for i := range eps {
		weights[eps[i].Addr] = eps[i].Weight
	}
	for _, v := range list[start : start+count] {
		b = append(b, v.Addr[:]...)
		b = binary.LittleEndian.AppendUint16(b, v.Port)
		b = binary.LittleEndian.AppendUint32(b, weights[backendAddr(v)])
	}
	return string(b)
}

// sameTable: a reused table is the slice written before, which needs no
// slot-by-slot comparison.
func sameTable(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	return len(a) == 0 || &a[0] == &b[0] || slices.Equal(a, b)
}

func (w *maglevWriter) set(id uint32, table []uint32) {
	if table == nil {
		delete(w.desired, id)
		return
	}
	w.desired[id] = table
}

// applyUpdates writes every desired table the map does not hold yet. A
// table that cannot be written (the map full, say) leaves its service id
// picking at random, or from its older table; the others are written.
func (w *maglevWriter) applyUpdates() (writes int, err error) {
	var errs []error
	for id, t := range w.desired {
		if sameTable(w.written[id], t) {
			continue
		}
		if err := w.write(id, t); err != nil {
			errs = append(errs, fmt.Errorf("maglev table of service id %d: %w", id, err))
			continue
		}
		w.written[id] = t
		writes++
	}
	return writes, errors.Join(errs...)
}

func (w *maglevWriter) write(id uint32, t []uint32) error {
	inner, err := ebpf.NewMap(w.inner)
	if err != nil {
		return err
	}
	defer inner.Close() // the outer map holds it once put
	if err := inner.Put(uint32(0), t); err != nil {
		return err
	}
	if err := w.outer.Put(id, inner); err != nil {
		return maps.UpdateError(gen.SluiceMapSlMaglevV1, w.outer, err)
	}
	return nil
}

// applyDeletions removes the tables no service id wants any more.
func (w *maglevWriter) applyDeletions() (deletes int, err error) {
	for id := range w.built {
		if _, ok := w.desired[id]; !ok {
			delete(w.built, id)
		}
	}
	for id := range w.written {
		if _, ok := w.desired[id]; ok {
			continue
		}
		if err := w.outer.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return deletes, fmt.Errorf("maglev table of service id %d: %w", id, err)
		}
		delete(w.written, id)
		deletes++
	}
	return deletes, nil
}
