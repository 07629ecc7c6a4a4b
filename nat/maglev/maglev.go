// Package maglev builds Maglev lookup tables (Eisenbud et al., "Maglev: A Fast
// and Reliable Software Network Load Balancer", NSDI 2016, section 3.4).
//
// A table has a prime number of slots; each slot names a backend. A packet's
// flow hash picks a slot, so every node holding the same table picks the same
// backend for a flow, with no state shared between them. When one of N
// backends leaves, about 1/N of the slots change owner (the minimum), and each
// backend owns nearly the same number of slots.
//
// The table depends only on the backends' names, weights and the table size,
// never on the order in which they are given: two nodes that list the same
// backends in another order (each puts its own local ones first) build the
// same table.
package maglev

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/sluice-net/sluice/gen"
)

// DefaultSize is the default number of slots: a prime above 100 times the
// backends of a large Service (Maglev's rule of thumb for an even spread).
// A table of it takes 64 KiB as 32-bit slots.
const DefaultSize = gen.MaglevDefaultTableSize

// MinSize and MaxSize bound the table sizes Build accepts.
const (
	MinSize = 251
	MaxSize = gen.MaglevMaxTableSize
)

// Backend is one backend: a name stable across nodes (its address and port)
// and a weight. A weight of 0 counts as 1; a backend of weight 2 gets twice
// the slots of one of weight 1.
type Backend struct {
	Name   string
	Weight uint32
}

// ValidSize reports whether m can size a table: a prime in [MinSize, MaxSize].
func ValidSize(m int) error {
	if m < MinSize || m > MaxSize {
		return fmt.Errorf("maglev table size %d: out of range %d-%d", m, MinSize, MaxSize)
	}
	for d := 2; d*d <= m; d++ {
		if m%d == 0 {
			return fmt.Errorf("maglev table size %d: not a prime (divisible by %d)", m, d)
		}
	}
	return nil
}

// Build returns a table of m slots, each holding an index into backends. With
// no backends it returns nil. m must satisfy ValidSize.
func Build(backends []Backend, m int) ([]uint32, error) {
	if err := ValidSize(m); err != nil {
		return nil, err
	}
	if len(backends) == 0 {
		return nil, nil
	}
	// Fill in name order, so the given order does not matter; equal names
	// (a caller's mistake) keep theirs.
	order := make([]int, len(backends))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(backends[a].Name, backends[b].Name) })

	type perm struct{ offset, skip, next uint64 }
	perms := make([]perm, len(order))
	maxWeight := uint32(1)
	for i, b := range order {
		offset, skip := hashes(backends[b].Name)
		perms[i] = perm{offset: offset % uint64(m), skip: skip%uint64(m-1) + 1}
		maxWeight = max(maxWeight, weight(backends[b]))
	}

	const empty = ^uint32(0)
	table := make([]uint32, m)
	for i := range table {
		table[i] = empty
	}
	// Each round, a backend earns its weight in credit and claims one slot
	// per maxWeight of credit: with equal weights, one slot each per round,
	// as the paper's algorithm; with unequal ones, slots in proportion.
	credit := make([]uint32, len(order))
	filled := 0
	for filled < m {
		for i, b := range order {
			credit[i] += weight(backends[b])
			for credit[i] >= maxWeight && filled < m {
				credit[i] -= maxWeight
				p := &perms[i]
				slot := (p.offset + p.next*p.skip) % uint64(m)
				for table[slot] != empty {
					p.next++
					slot = (p.offset + p.next*p.skip) % uint64(m)
				}
				table[slot] = uint32(b)
				p.next++
				filled++
			}
		}
	}
	return table, nil
}

func weight(b Backend) uint32 { return max(b.Weight, 1) }

// hashes are the two independent hashes of a backend's name that give its
// permutation: where it starts, and its step.
func hashes(name string) (offset, skip uint64) {
	h := fnv.New64a()
	h.Write([]byte("sluice-maglev-offset:"))
	h.Write([]byte(name))
	offset = h.Sum64()
	h.Reset()
	h.Write([]byte("sluice-maglev-skip:"))
	h.Write([]byte(name))
	return offset, h.Sum64()
}
