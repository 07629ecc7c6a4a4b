package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// CachingMap keeps a cache of what a map holds in the dataplane and the
// changes the desired contents make to it, and writes only those.
//
// Use: LoadDataplaneState once (it reads the map back, so a restarted agent
// adopts what is there), then SetDesired / DeleteDesired freely, then one of the
// Apply methods. Only keys whose desired value differs from the cached dataplane
// value are written; keys that are no longer desired are deleted. A key already
// gone from the map counts as deleted.
//
// The cost of an Apply follows the number of keys changed since the last one,
// not the size of the map: SetDesired and DeleteDesired record the keys they
// touch, and Apply looks only at those. The desired contents are the
// dataplane cache with the pending changes over it, not a second copy of
// the map: at 10,000 services the copies were a tenth of the agent's heap.
//
// Not safe for concurrent use.
type CachingMap[K comparable, V comparable] struct {
	m         *Map[K, V]
	dataplane map[K]V
	// pending are the keys whose desired value differs, or may differ, from
	// the dataplane's.
	pending map[K]change[V]
	desired int // how many keys are desired
}

// change is a key's desired state where it differs from the dataplane.
type change[V any] struct {
	v      V
	remove bool // not desired
}

// ApplyStats counts the map operations one Apply performed.
type ApplyStats struct {
	Writes  int
	Deletes int
}

// Add returns the sum of two stats.
func (s ApplyStats) Add(o ApplyStats) ApplyStats {
	return ApplyStats{Writes: s.Writes + o.Writes, Deletes: s.Deletes + o.Deletes}
}

// NewCachingMap wraps m with empty desired and dataplane caches.
func NewCachingMap[K comparable, V comparable](m *Map[K, V]) *CachingMap[K, V] {
	return &CachingMap[K, V]{m: m, dataplane: map[K]V{}, pending: map[K]change[V]{}}
}

// Map returns the wrapped map.
func (c *CachingMap[K, V]) Map() *Map[K, V] { return c.m }

// LoadDataplaneState replaces the dataplane cache with the map's contents;
// the desired contents stay what they were.
func (c *CachingMap[K, V]) LoadDataplaneState() error {
	state := make(map[K]V, len(c.dataplane))
	err := c.m.Iterate(func(k K, v V) bool {
		state[k] = v
		return true
	})
	if err != nil {
		return err
	}
	pending := map[K]change[V]{}
	differs := func(k K, want V) {
		if have, ok := state[k]; !ok || have != want {
			pending[k] = change[V]{v: want}
		}
	}
	for k, v := range c.dataplane {
		if _, changed := c.pending[k]; !changed {
			differs(k, v)
		}
	}
	for k, ch := range c.pending {
		if !ch.remove {
			differs(k, ch.v)
		}
	}
	for k := range state {
		if _, wanted := c.GetDesired(k); !wanted {
			pending[k] = change[V]{remove: true}
		}
	}
	c.dataplane, c.pending = state, pending
	return nil
}

// SetDesired makes k→v part of the desired state.
func (c *CachingMap[K, V]) SetDesired(k K, v V) {
	if _, was := c.GetDesired(k); !was {
		c.desired++
	}
	if cur, ok := c.dataplane[k]; ok && cur == v {
		delete(c.pending, k)
		return
	}
	c.pending[k] = change[V]{v: v}
}

// DeleteDesired removes k from the desired state.
func (c *CachingMap[K, V]) DeleteDesired(k K) {
	if _, was := c.GetDesired(k); was {
		c.desired--
	}
	if _, present := c.dataplane[k]; present {
		c.pending[k] = change[V]{remove: true}
	} else {
		delete(c.pending, k)
	}
}

// ClearDesired empties the desired state (ApplyAll then deletes everything).
func (c *CachingMap[K, V]) ClearDesired() {
	c.pending = make(map[K]change[V], len(c.dataplane))
	for k := range c.dataplane {
		c.pending[k] = change[V]{remove: true}
	}
	c.desired = 0
}

// DesiredLen is the number of desired entries.
func (c *CachingMap[K, V]) DesiredLen() int { return c.desired }

// GetDesired returns the desired value of k.
func (c *CachingMap[K, V]) GetDesired(k K) (V, bool) {
	if ch, ok := c.pending[k]; ok {
		return ch.v, !ch.remove
	}
	v, ok := c.dataplane[k]
	return v, ok
}

// GetDataplane returns the cached dataplane value of k.
func (c *CachingMap[K, V]) GetDataplane(k K) (V, bool) {
	v, ok := c.dataplane[k]
	return v, ok
}

// IterDataplane calls fn for every cached dataplane entry until it returns false.
func (c *CachingMap[K, V]) IterDataplane(fn func(K, V) bool) {
	for k, v := range c.dataplane {
		if !fn(k, v) {
			return
		}
	}
}

// Pending counts the writes and deletes the next ApplyAll would do.
func (c *CachingMap[K, V]) Pending() ApplyStats {
	var st ApplyStats
	for k, ch := range c.pending {
		cur, present := c.dataplane[k]
		switch {
		case !ch.remove && (!present || cur != ch.v):
			st.Writes++
		case ch.remove && present:
			st.Deletes++
		}
	}
	return st
}

// settled forgets the pending table once it is empty: a Go map keeps its
// largest size, and the first sync's is the size of the whole map.
func (c *CachingMap[K, V]) settled() {
	if len(c.pending) == 0 {
		c.pending = map[K]change[V]{}
	}
}

// applyChunk bounds one batch syscall, so a failure loses little progress.
const applyChunk = 1024

// ApplyUpdatesOnly writes desired entries that are missing or different in the
// dataplane, and deletes nothing.
func (c *CachingMap[K, V]) ApplyUpdatesOnly() (ApplyStats, error) {
	var stats ApplyStats
	keys := make([]K, 0, applyChunk)
	vals := make([]V, 0, applyChunk)
	flush := func() error {
		n, err := c.m.BatchUpdate(keys, vals, ebpf.UpdateAny)
		for i := range n {
			c.dataplane[keys[i]] = vals[i]
			delete(c.pending, keys[i])
		}
		stats.Writes += n
		keys, vals = keys[:0], vals[:0]
		return err
	}
	defer c.settled()
	for k, ch := range c.pending {
		if ch.remove {
			continue // a deletion: ApplyDeletionsOnly's job
		}
		v := ch.v
		if cur, ok := c.dataplane[k]; ok && cur == v {
			delete(c.pending, k)
			continue
		}
		keys = append(keys, k)
		vals = append(vals, v)
		if len(keys) == applyChunk {
			if err := flush(); err != nil {
				return stats, err
			}
		}
	}
	return stats, flush()
}

// ApplyDeletionsOnly deletes dataplane entries that are not desired, and writes
// nothing.
func (c *CachingMap[K, V]) ApplyDeletionsOnly() (ApplyStats, error) {
	var stats ApplyStats
	keys := make([]K, 0, applyChunk)
	defer c.settled()
	for k, ch := range c.pending {
		if !ch.remove {
			continue // an update: ApplyUpdatesOnly's job
		}
		if _, ok := c.dataplane[k]; !ok {
			delete(c.pending, k)
			continue
		}
		keys = append(keys, k)
		if len(keys) == applyChunk {
			n, err := c.deleteAll(keys)
			stats.Deletes += n
			if err != nil {
				return stats, err
			}
			keys = keys[:0]
		}
	}
	n, err := c.deleteAll(keys)
	stats.Deletes += n
	return stats, err
}

// deleteAll deletes keys in batches. A batch stops at a key that is already gone;
// that key is dropped from the cache as deleted and the batch resumes after it.
func (c *CachingMap[K, V]) deleteAll(keys []K) (int, error) {
	deleted := 0
	for len(keys) > 0 {
		n, err := c.m.BatchDelete(keys)
		for _, k := range keys[:n] {
			delete(c.dataplane, k)
			delete(c.pending, k)
		}
		deleted += n
		keys = keys[n:]
		if err == nil {
			break
		}
		if !errors.Is(err, ErrKeyNotExist) || len(keys) == 0 {
			return deleted, err
		}
		delete(c.dataplane, keys[0])
		delete(c.pending, keys[0])
		keys = keys[1:]
	}
	return deleted, nil
}

// ApplyAll writes updates first, then deletions, so a reader of the map never
// misses an entry that is desired both before and after.
func (c *CachingMap[K, V]) ApplyAll() (ApplyStats, error) {
	up, err := c.ApplyUpdatesOnly()
	if err != nil {
		return up, fmt.Errorf("apply updates: %w", err)
	}
	del, err := c.ApplyDeletionsOnly()
	if err != nil {
		return up.Add(del), fmt.Errorf("apply deletions: %w", err)
	}
	return up.Add(del), nil
}
