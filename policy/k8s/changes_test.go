package k8s

import (
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// changeCluster: web is isolated for ingress, open to api on its named
// port http; api is isolated for egress, open to web.
func changeCluster(web, api *v1.Pod, shop *v1.Namespace) Cluster {
	return Cluster{
		Pods:       []*v1.Pod{web, api},
		Namespaces: []*v1.Namespace{shop},
		Policies: []*netv1.NetworkPolicy{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-in"}, Spec: netv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				Ingress: []netv1.NetworkPolicyIngressRule{{
					From:  []netv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}}}},
					Ports: []netv1.NetworkPolicyPort{{Protocol: ptr(v1.ProtocolTCP), Port: ptr(intstr.FromString("http"))}}}},
			}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api-out"}, Spec: netv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
				PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeEgress},
				Egress: []netv1.NetworkPolicyEgressRule{{To: []netv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "shop"}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}}},
			}},
		},
	}
}

// Each change to the pod api or the namespace shop either leaves the
// translation as it was, and then the filter lets it pass, or changes it,
// and then the filter must not: a change it wrongly calls irrelevant would
// leave a node's policies stale.
func TestChangesThatCannotAlterATranslationAreRecognised(t *testing.T) {
	web := pod("shop", "web", "10.1.0.10", map[string]string{"app": "web"}, v1.ContainerPort{Name: "http", ContainerPort: 8080, Protocol: v1.ProtocolTCP})
	api := pod("shop", "api", "10.1.0.20", map[string]string{"app": "api"})
	shop := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"team": "shop"}}}
	before := Translate(changeCluster(web, api, shop), "node-a")
	if len(before.Errors) != 0 {
		t.Fatal(before.Errors)
	}

	podChanges := []struct {
		name     string
		pod      *v1.Pod // web or api, changed
		change   func(p *v1.Pod)
		relevant bool
	}{
		{"readiness", api, func(p *v1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionFalse})
		}, false},
		{"container restarted", api, func(p *v1.Pod) {
			p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "c", RestartCount: 3}}
		}, false},
		{"annotation", api, func(p *v1.Pod) { p.Annotations = map[string]string{"x": "y"} }, false},
		{"resync", api, func(p *v1.Pod) {}, false},
		{"resource version", api, func(p *v1.Pod) { p.ResourceVersion = "42" }, false},
		{"phase", api, func(p *v1.Pod) { p.Status.Phase = v1.PodRunning }, false},
		{"image", api, func(p *v1.Pod) { p.Spec.Containers[0].Image = "nginx:2" }, false},
		{"label", api, func(p *v1.Pod) { p.Labels = map[string]string{"app": "api2"} }, true},
		{"IP", api, func(p *v1.Pod) { p.Status.PodIP = "10.1.0.21" }, true},
		{"second IP", api, func(p *v1.Pod) { p.Status.PodIPs = []v1.PodIP{{IP: "10.1.0.20"}, {IP: "fd00::20"}} }, true},
		{"node", api, func(p *v1.Pod) { p.Spec.NodeName = "node-b" }, true},
		{"host network", api, func(p *v1.Pod) { p.Spec.HostNetwork = true }, true},
		{"named port", web, func(p *v1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = 8081 }, true},
	}
	for _, c := range podChanges {
		changed := c.pod.DeepCopy()
		c.change(changed)
		w, a := web, api
		if c.pod == web {
			w = changed
		} else {
			a = changed
		}
		after := Translate(changeCluster(w, a, shop), "node-a")
		differs := !reflect.DeepEqual(before, after)
		matters := PodChangeMatters(c.pod, changed)
		if differs && !matters {
			t.Errorf("%s: the translation changed, but PodChangeMatters says it cannot", c.name)
		}
		if differs != c.relevant || matters != c.relevant {
			t.Errorf("%s: translation changed %v, PodChangeMatters %v; want both %v", c.name, differs, matters, c.relevant)
		}
	}

	nsChanges := []struct {
		name     string
		change   func(ns *v1.Namespace)
		relevant bool
	}{
		{"annotation", func(ns *v1.Namespace) { ns.Annotations = map[string]string{"x": "y"} }, false},
		{"status", func(ns *v1.Namespace) { ns.Status.Phase = v1.NamespaceTerminating }, false},
		{"label", func(ns *v1.Namespace) { ns.Labels = map[string]string{"team": "ops"} }, true},
	}
	for _, c := range nsChanges {
		changed := shop.DeepCopy()
		c.change(changed)
		after := Translate(changeCluster(web, api, changed), "node-a")
		differs := !reflect.DeepEqual(before, after)
		matters := NamespaceChangeMatters(shop, changed)
		if differs != c.relevant || matters != c.relevant {
			t.Errorf("namespace %s: translation changed %v, NamespaceChangeMatters %v; want both %v", c.name, differs, matters, c.relevant)
		}
	}
}

// Slim keeps what a translation reads: a cluster of slimmed objects
// translates as the whole objects do, PodChangeMatters sees no change
// between a pod and its slimmed self, and what the informer's cache would
// keep has lost the rest (status, annotations, managed fields, volumes).
func TestSlimKeepsWhatTranslateReads(t *testing.T) {
	r := &randomCluster{rng: rand.New(rand.NewPCG(7, 1))}
	for i := range 4 {
		r.c.Namespaces = append(r.c.Namespaces, r.namespace(i))
	}
	for range 80 {
		p := r.pod()
		p.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 500)}
		p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
		p.Spec.Volumes = []v1.Volume{{Name: "data"}}
		p.Spec.Containers[0].Image, p.Spec.Containers[0].Env = "registry/app:1", []v1.EnvVar{{Name: "A", Value: "b"}}
		p.Status.Phase, p.Status.Conditions = v1.PodRunning, []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}
		p.Status.PodIPs = []v1.PodIP{{IP: p.Status.PodIP}, {IP: "fd00::" + strconv.Itoa(len(r.c.Pods)+1)}}
		r.c.Pods = append(r.c.Pods, p)
	}
	for range 15 {
		np := r.policy()
		np.Annotations = map[string]string{"note": "x"}
		r.c.Policies = append(r.c.Policies, np)
	}
	slim := Cluster{}
	for _, p := range r.c.Pods {
		o, err := Slim(p)
		if err != nil {
			t.Fatal(err)
		}
		sp := o.(*v1.Pod)
		if PodChangeMatters(p, sp) {
			t.Fatalf("slimming pod %s changed what matters", p.Name)
		}
		if sp.Annotations != nil || sp.ManagedFields != nil || sp.Spec.Volumes != nil || sp.Spec.Containers[0].Image != "" ||
			sp.Spec.Containers[0].Env != nil || sp.Status.Phase != "" || sp.Status.Conditions != nil {
			t.Fatalf("the slimmed pod kept more than the translation reads: %+v", sp)
		}
		slim.Pods = append(slim.Pods, sp)
	}
	for _, ns := range r.c.Namespaces {
		o, _ := Slim(ns.DeepCopy())
		if NamespaceChangeMatters(ns, o.(*v1.Namespace)) {
			t.Fatalf("slimming namespace %s changed what matters", ns.Name)
		}
		slim.Namespaces = append(slim.Namespaces, o.(*v1.Namespace))
	}
	for _, np := range r.c.Policies {
		o, _ := Slim(np.DeepCopy())
		if o.(*netv1.NetworkPolicy).Annotations != nil {
			t.Fatal("a slimmed NetworkPolicy kept its annotations")
		}
		slim.Policies = append(slim.Policies, o.(*netv1.NetworkPolicy))
	}
	for _, node := range []string{"", "node-1"} {
		got, want := Translate(slim, node), Translate(r.c, node)
		if !reflect.DeepEqual(comparable(got), comparable(want)) {
			t.Fatalf("node %q: the slimmed cluster translates differently:\n got %+v\nwant %+v", node, comparable(got), comparable(want))
		}
		if len(want.Endpoints) == 0 || len(want.IPSets) == 0 {
			t.Fatalf("node %q: too little translated to judge", node)
		}
	}
	if o, err := Slim("other"); err != nil || o != "other" {
		t.Fatalf("another object: %v %v", o, err)
	}
}
