package k8s

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// podIndex finds the pods a selector can match without looking at every pod:
// by namespace, and by label (key, then value). A translation builds it
// once; each peer selector then checks only the pods of its narrowest
// equality requirement instead of the whole cluster, which made a node's
// translation cost (pods with policy) x (all pods).
type podIndex struct {
	all     []*v1.Pod
	byNS    map[string][]*v1.Pod
	byLabel map[string]map[string][]*v1.Pod
}

func newPodIndex(pods []*v1.Pod) *podIndex {
	x := &podIndex{all: pods, byNS: map[string][]*v1.Pod{}, byLabel: map[string]map[string][]*v1.Pod{}}
	for _, p := range pods {
		x.byNS[p.Namespace] = append(x.byNS[p.Namespace], p)
		for k, v := range p.Labels {
			if x.byLabel[k] == nil {
				x.byLabel[k] = map[string][]*v1.Pod{}
			}
			x.byLabel[k][v] = append(x.byLabel[k][v], p)
		}
	}
	return x
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
