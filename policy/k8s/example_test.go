package k8s_test

import (
	"fmt"

	"github.com/sluice-net/sluice/policy/k8s"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NetworkPolicy becomes the policy model of this node's pods: a pod a policy
// selects for ingress gets a tier whose default denies; a pod no policy
// selects gets no tier (not isolated). Pods of other nodes are not
// translated.
func ExampleTranslate() {
	pod := func(name, node, ip, app string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Labels: map[string]string{"app": app}},
			Spec: v1.PodSpec{NodeName: node}, Status: v1.PodStatus{PodIP: ip}}
	}
	denyWeb := &netv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny-web", Namespace: "shop"},
		Spec: netv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeIngress}}}
	res := k8s.Translate(k8s.Cluster{
		Pods:       []*v1.Pod{pod("web", "node-1", "10.244.1.5", "web"), pod("db", "node-1", "10.244.1.6", "db"), pod("web2", "node-2", "10.244.2.5", "web")},
		Namespaces: []*v1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}},
		Policies:   []*netv1.NetworkPolicy{denyWeb},
	}, "node-1")
	for _, name := range []string{"shop/web", "shop/db", "shop/web2"} {
		ep, ok := res.Endpoints[name]
		fmt.Println(name, ok, len(ep.Ingress.Tiers), len(ep.Egress.Tiers))
	}
	fmt.Println(res.Errors)
	// Output:
	// shop/web true 1 0
	// shop/db true 0 0
	// shop/web2 false 0 0
	// []
}
