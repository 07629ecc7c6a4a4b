package k8s

import (
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// podIndex finds the pods a selector can match without looking at every pod:
// by namespace, and by label (key, then value). Each peer selector then
// checks only the pods of its narrowest equality requirement instead of
// the whole cluster, which made a node's translation cost (pods with
// policy) x (all pods). A Translator keeps it from one translation to the
// next and updates it for the pods that changed (update).
type podIndex struct {
	all     []*v1.Pod
	byNS    map[string][]*v1.Pod
	byLabel map[string]map[string][]*v1.Pod
	// seen are the indexed pods; listed, the entries of the last update's
	// list, in its order (an entry's generation is the last update that
	// listed its pod).
	seen       map[*v1.Pod]*podEntry
	listed     []*podEntry
	generation uint64
}

type podEntry struct {
	pod        *v1.Pod
	generation uint64
}

// update makes x the index of pods. A pod is the pod indexed while its
// object is the same one: objects are not changed in place (an informer's
// update is a new object). Only the pods added and removed since the last
// update are indexed and unindexed, unless they are most of them; update
// returns them, or reindexed when it indexed every pod anew.
func (x *podIndex) update(pods []*v1.Pod) (added, removed []*v1.Pod, reindexed bool) {
	x.all = pods
	x.generation++
	listed := make([]*podEntry, 0, len(pods))
	for _, p := range pods {
		switch e := x.seen[p]; {
		case e == nil:
			added = append(added, p)
		case e.generation != x.generation: // else listed twice
			e.generation = x.generation
			listed = append(listed, e)
		}
	}
	gone := len(x.seen) - len(listed)
	if x.seen == nil || len(added)+gone > len(pods)/2 {
		x.byNS, x.byLabel, x.seen = map[string][]*v1.Pod{}, map[string]map[string][]*v1.Pod{}, make(map[*v1.Pod]*podEntry, len(pods))
		added, listed, reindexed = pods, listed[:0], true
	} else if gone > 0 {
		for _, e := range x.listed {
			if e.generation != x.generation {
				x.remove(e.pod)
				delete(x.seen, e.pod)
				removed = append(removed, e.pod)
				e.pod = nil // its block may outlive it: not the pod
			}
		}
	}
	block := make([]podEntry, len(added)) // one allocation for them all
	for i, p := range added {
		if x.seen[p] != nil {
			continue // listed twice
		}
		e := &block[i]
		*e = podEntry{pod: p, generation: x.generation}
		x.seen[p] = e
		listed = append(listed, e)
		x.byNS[p.Namespace] = append(x.byNS[p.Namespace], p)
		for k, v := range p.Labels {
			if x.byLabel[k] == nil {
				x.byLabel[k] = map[string][]*v1.Pod{}
			}
			x.byLabel[k][v] = append(x.byLabel[k][v], p)
		}
	}
	x.listed = listed
	return added, removed, reindexed
}

// remove unindexes p. The lists are not in any order: the last pod takes
// p's place.
func (x *podIndex) remove(p *v1.Pod) {
	unlist := func(list []*v1.Pod) []*v1.Pod {
		i := slices.Index(list, p)
		if i < 0 {
			return list
		}
		list[i] = list[len(list)-1]
		list[len(list)-1] = nil
		return list[:len(list)-1]
	}
	if list := unlist(x.byNS[p.Namespace]); len(list) > 0 {
		x.byNS[p.Namespace] = list
	} else {
		delete(x.byNS, p.Namespace)
	}
	for k, v := range p.Labels {
		if list := unlist(x.byLabel[k][v]); len(list) > 0 {
			x.byLabel[k][v] = list
		} else if delete(x.byLabel[k], v); len(x.byLabel[k]) == 0 {
			delete(x.byLabel, k)
		}
	}
}

// candidates returns pods among which are all the pods sel matches (in
// namespace ns, when ns is not ""): the fewest of the namespace's pods and,
// for each requirement that the label equal one of some values, the pods
// with one of those values. The caller still matches each of them.
func (x *podIndex) candidates(sel labels.Selector, ns string) []*v1.Pod {
	best := x.all
	if ns != "" {
		best = x.byNS[ns]
	}
	if sel == nil {
		return best
	}
	reqs, selectable := sel.Requirements()
	if !selectable {
		return best
	}
	for _, r := range reqs {
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals, selection.In:
		default:
			continue
		}
		var pods []*v1.Pod
		values := r.Values().UnsortedList()
		for _, v := range values {
			pods = append(pods, x.byLabel[r.Key()][v]...) // a pod has one value per key: no duplicates
		}
		if len(pods) < len(best) {
			best = pods
		}
	}
	return best
}

// inNamespaces returns candidates for a namespace selector and a pod
// selector: the pods of the namespaces nsSel matches, unless podSel's
// candidates are fewer. A selector that matches a namespace without labels
// also matches pods of namespaces not listed: then every pod is one.
func (x *podIndex) inNamespaces(nsSel labels.Selector, namespaces []*v1.Namespace, podSel labels.Selector) []*v1.Pod {
	best := x.candidates(podSel, "")
	if nsSel.Matches(labels.Set{}) {
		return best
	}
	var pods []*v1.Pod
	for _, ns := range namespaces {
		if nsSel.Matches(labels.Set(ns.Labels)) {
			pods = append(pods, x.byNS[ns.Name]...)
		}
	}
	if len(pods) < len(best) {
		return pods
	}
	return best
}
