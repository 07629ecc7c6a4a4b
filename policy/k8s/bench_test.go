package k8s

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// benchCluster is a cluster of the size: 10,000 pods in 50
// namespaces on 100 nodes, 1,000 NetworkPolicies (20 per namespace), each
// selecting one app's pods and letting in the next app's pods on a port and
// a monitoring namespace's pods on another.
func benchCluster() Cluster {
	var c Cluster
	for n := range 50 {
		lbls := map[string]string{"kubernetes.io/metadata.name": fmt.Sprintf("ns%d", n)}
		if n == 0 {
			lbls["team"] = "ops"
		}
		c.Namespaces = append(c.Namespaces, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns%d", n), Labels: lbls}})
	}
	for i := range 10_000 {
		ns := i % 50
		p := pod(fmt.Sprintf("ns%d", ns), fmt.Sprintf("pod%d", i), fmt.Sprintf("10.%d.%d.%d", 1+i>>16, (i>>8)&0xff, i&0xff),
			map[string]string{"app": fmt.Sprintf("app%d", (i/50)%20), "pod-template-hash": fmt.Sprintf("h%d", i%7)})
		p.Spec.NodeName = fmt.Sprintf("node-%d", i%100)
		c.Pods = append(c.Pods, p)
	}
	for i := range 1_000 {
		ns, app := i/20, i%20
		c.Policies = append(c.Policies, &netv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", ns), Name: fmt.Sprintf("np%d", i)},
			Spec: netv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", app)}},
				Ingress: []netv1.NetworkPolicyIngressRule{
					{From: []netv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", (app+1)%20)}}}},
						Ports: []netv1.NetworkPolicyPort{tcpPort(8080)}},
					{From: []netv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ops"}}}},
						Ports: []netv1.NetworkPolicyPort{tcpPort(9100)}},
				},
			}})
	}
	return c
}

// BenchmarkTranslate: one node's translation of the whole cluster (what a
// change costs: every change translates again), ns/op and CPU per change.
func BenchmarkTranslate(b *testing.B) {
	c := benchCluster()
	var res *Result
	for b.Loop() {
		res = Translate(c, "node-7")
	}
	if len(res.Endpoints) != 100 || len(res.Errors) != 0 {
		b.Fatalf("%d endpoints, errors %v", len(res.Endpoints), res.Errors)
	}
}

// BenchmarkTranslateChange: what a change costs a Translator that keeps
// the last translation's index and selectors: each op relabels one pod (a
// new object, as an informer's update is) and translates the cluster for
// the node again.
func BenchmarkTranslateChange(b *testing.B) {
	c := benchCluster()
	tr := NewTranslator("node-7")
	tr.Translate(c)
	var res *Result
	i := 0
	for b.Loop() {
		i++
		n := i * 7919 % len(c.Pods)
		p := c.Pods[n].DeepCopy()
		p.Labels["app"] = fmt.Sprintf("app%d", i%20)
		c.Pods[n] = p
		res = tr.Translate(c)
	}
	if len(res.Endpoints) != 100 || len(res.Errors) != 0 {
		b.Fatalf("%d endpoints, errors %v", len(res.Endpoints), res.Errors)
	}
}
