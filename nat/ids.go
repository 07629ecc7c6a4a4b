package nat

// Service ids: one per backend set, kept across restarts.

import (
	"container/heap"

	"github.com/sluice-net/sluice/gen"
)

// adoptIDs gives every service whose ClusterIP frontend is already in the maps
// (a restart) that frontend's id before any new id is handed out.
func (s *Syncer) adoptIDs(services map[ServicePortName]*ServicePort) {
	for name, svc := range services {
		if svc.Validate() != nil {
			continue
		}
		if v, ok := s.fe.GetDataplane(feKey(svc.ClusterIP, svc.Port, svc.Protocol)); ok && v.SvcId != 0 {
			s.ids.adopt(idKey{name: name}, v.SvcId)
		}
	}
}

// idFor returns the service id of a backend set: the one it has, or the one the
// dataplane's frontend fe already uses (after a restart), or a new one.
func (s *Syncer) idFor(k idKey, fe gen.SluiceFe6Key) uint32 {
	if id, ok := s.ids.get(k); ok {
		return id
	}
	if v, ok := s.fe.GetDataplane(fe); ok && v.SvcId != 0 && s.ids.adopt(k, v.SvcId) {
		return v.SvcId
	}
	return s.ids.alloc(k)
}

// ServiceID returns the id of a service port's main backend set.
func (s *Syncer) ServiceID(name ServicePortName) (uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.ids.get(idKey{name: name})
	return id, ok
}

// ServiceIDs yields every service port with the ids of its backend sets
// (its main set, and one per remote node whose NodePort it programs): the
// ids the datapath counts the service's traffic under (sl_svcstats_v1). It
// holds the syncer's lock while it yields: the caller must not call the
// syncer meanwhile.
func (s *Syncer) ServiceIDs(yield func(ServicePortName, uint32) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, id := range s.ids.byKey {
		if !yield(k.name, id) {
			return
		}
	}
}

// idAllocator hands out service ids; an id freed in one Apply is reused only
// after that Apply, when its backends are gone from the maps. It hands out
// the lowest free id, so ids stay below the number of service ports the
// node has had at once: the datapath counts traffic per service in an array
// indexed by id (sl_svcstats_v1).
type idAllocator struct {
	byKey map[idKey]uint32
	// used are the ids handed out (a set: a release names its key, and at
	// 10,000 services a key per id was a tenth of the syncer's memory).
	used    map[uint32]struct{}
	next    uint32   // the lowest id never handed out
	free    idHeap   // ids released before, lowest first
	pending []uint32 // released in this Apply
}

func newIDAllocator() *idAllocator {
	return &idAllocator{byKey: map[idKey]uint32{}, used: map[uint32]struct{}{}, next: 1}
}

func (a *idAllocator) get(k idKey) (uint32, bool) {
	id, ok := a.byKey[k]
	return id, ok
}

// adopt takes over the id a previous process gave k.
func (a *idAllocator) adopt(k idKey, id uint32) bool {
	if _, taken := a.used[id]; taken {
		return false
	}
	a.byKey[k], a.used[id] = id, struct{}{}
	return true
}

func (a *idAllocator) alloc(k idKey) uint32 {
	for a.free.Len() > 0 {
		id := heap.Pop(&a.free).(uint32)
		if _, taken := a.used[id]; !taken {
			a.byKey[k], a.used[id] = id, struct{}{}
			return id
		}
	}
	for {
		id := a.next
		a.next++
		if a.next == 0 {
			a.next = 1
		}
		if _, taken := a.used[id]; !taken && id != 0 {
			a.byKey[k], a.used[id] = id, struct{}{}
			return id
		}
	}
}

// release forgets k's id now and frees the id after the Apply.
func (a *idAllocator) release(k idKey, id uint32) {
	if _, ok := a.used[id]; ok {
		if a.byKey[k] == id {
			delete(a.byKey, k)
		}
		a.pending = append(a.pending, id)
	}
}

func (a *idAllocator) releasePending() {
	for _, id := range a.pending {
		delete(a.used, id)
		heap.Push(&a.free, id)
	}
	a.pending = a.pending[:0]
}

// idHeap is a min-heap of ids (container/heap).
type idHeap []uint32

func (h idHeap) Len() int           { return len(h) }
func (h idHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h idHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *idHeap) Push(x any)        { *h = append(*h, x.(uint32)) }
func (h *idHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
