package policysource

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
	"github.com/sluice-net/sluice/policy/k8s"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
)

// Against a real kube-apiserver: without the CRDs the agent follows
// NetworkPolicy only; once they are installed — after it started, as a
// chart that ships the CRDs beside the DaemonSet may do — it follows
// ClusterNetworkPolicies, AdminNetworkPolicies and HostEndpoints created
// through the API, without a restart. A Watch started after them follows
// them from its first update.
func TestPolicyInformersFollowAdminPolicyCRDs(t *testing.T) {
	s := apiservertest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if served, err := servedResources(s.Client.Discovery(), adminPolicyResources); err != nil || len(served) != 0 {
		t.Fatalf("before the CRDs: served %v (%v), want none", served, err)
	}
	dyn, err := dynamic.NewForConfig(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	defer func(d time.Duration) { CRDPollInterval = d }(CRDPollInterval)
	CRDPollInterval = 200 * time.Millisecond
	var logs syncBuffer
	updates := make(chan k8s.Cluster, 100)
	run, err := Watch(ctx, s.Client, dyn, 0, slog.New(slog.NewTextHandler(&logs, nil)), func(c k8s.Cluster) { updates <- c })
	if err != nil {
		t.Fatal(err)
	}
	go run()
	select {
	case c := <-updates:
		if len(c.ClusterNetworkPolicies)+len(c.AdminNetworkPolicies)+len(c.HostEndpoints) != 0 {
			t.Fatalf("admin policies before their CRDs: %+v", c)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no first update")
	}

	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	kinds := []string{"ClusterNetworkPolicy", "AdminNetworkPolicy", "BaselineAdminNetworkPolicy", "HostEndpoint"}
	for i, r := range adminPolicyResources {
		if _, err := crds.Create(ctx, apiservertest.CRD(r, kinds[i]), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		served, err := servedResources(s.Client.Discovery(), adminPolicyResources)
		if err == nil && len(served) == len(adminPolicyResources) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRDs not served: %v %v", served, err)
		}
	}

	create := func(r schema.GroupVersionResource, obj map[string]any) {
		t.Helper()
		if _, err := dyn.Resource(r).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create(adminPolicyResources[0], map[string]any{"apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
		"metadata": map[string]any{"name": "deny-guests"},
		"spec": map[string]any{"tier": "Admin", "priority": int64(7), "subject": map[string]any{"namespaces": map[string]any{}},
			"ingress": []any{map[string]any{"action": "Deny", "from": []any{map[string]any{"namespaces": map[string]any{
				"matchLabels": map[string]any{"team": "guest"}}}}}}}})
	create(adminPolicyResources[1], map[string]any{"apiVersion": "policy.networking.k8s.io/v1alpha1", "kind": "AdminNetworkPolicy",
		"metadata": map[string]any{"name": "pass-ops"},
		"spec": map[string]any{"priority": int64(3), "subject": map[string]any{"namespaces": map[string]any{}},
			"ingress": []any{map[string]any{"action": "Pass", "from": []any{map[string]any{"namespaces": map[string]any{}}}}}}})
	create(adminPolicyResources[3], map[string]any{"apiVersion": "sluice.dev/v1alpha1", "kind": "HostEndpoint",
		"metadata": map[string]any{"name": "edge"}, "spec": map[string]any{"interfaceName": "*", "policyTypes": []any{"Ingress"}}})
	for deadline := time.After(20 * time.Second); ; {
		select {
		case c := <-updates:
			if len(c.ClusterNetworkPolicies) == 1 && len(c.AdminNetworkPolicies) == 1 && len(c.HostEndpoints) == 1 {
				cnp, anp := c.ClusterNetworkPolicies[0], c.AdminNetworkPolicies[0]
				if cnp.Spec.Priority != 7 || cnp.Spec.Ingress[0].Action != "Deny" || anp.Spec.Priority != 3 || anp.Spec.Ingress[0].Action != "Pass" ||
					c.HostEndpoints[0].Spec.InterfaceName != "*" {
					t.Fatalf("read back %+v and %+v", cnp.Spec, anp.Spec)
				}
				if len(cnp.ManagedFields) != 0 {
					t.Errorf("the cache keeps managed fields")
				}
				// Another change: the admin policies, unchanged, are the
				// same objects (the translator keeps its work while they are).
				if _, err := s.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "later"}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				for {
					select {
					case next := <-updates:
						if !slices.ContainsFunc(next.Namespaces, func(ns *v1.Namespace) bool { return ns.Name == "later" }) {
							continue
						}
						if next.ClusterNetworkPolicies[0] != cnp || next.AdminNetworkPolicies[0] != anp || next.HostEndpoints[0] != c.HostEndpoints[0] {
							t.Fatal("an update hands over new copies of the admin policies that did not change")
						}
						if !strings.Contains(logs.String(), "their CRD was installed after the agent started") {
							t.Errorf("the late CRDs are not logged:\n%s", logs.String())
						}
						checkFromTheStart(ctx, t, s.Client, dyn)
						return
					case <-deadline:
						t.Fatal("the namespace's update never came")
					}
				}
			}
		case <-deadline:
			t.Fatal("the informers never delivered the three objects")
		}
	}
}

// checkFromTheStart: a Watch started while the CRDs are served hands over
// their objects in its first update.
func checkFromTheStart(ctx context.Context, t *testing.T, client kubernetes.Interface, dyn dynamic.Interface) {
	t.Helper()
	updates := make(chan k8s.Cluster, 100)
	run, err := Watch(ctx, client, dyn, 0, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c k8s.Cluster) { updates <- c })
	if err != nil {
		t.Fatal(err)
	}
	go run()
	select {
	case c := <-updates:
		if len(c.ClusterNetworkPolicies) != 1 || len(c.AdminNetworkPolicies) != 1 || len(c.HostEndpoints) != 1 {
			t.Fatalf("a Watch started after the CRDs: first update has %d, %d, %d admin objects",
				len(c.ClusterNetworkPolicies), len(c.AdminNetworkPolicies), len(c.HostEndpoints))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a Watch started after the CRDs: no first update")
	}
}

// syncBuffer is a strings.Builder a logger and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A pod's status changing (readiness flapping, a container restarting) or a
// node's heartbeat cannot change any policy, so it must not cost a
// translation of the whole cluster's policies; a label change of either
// must.
func TestPolicyInformersTranslateOnlyForChangesThatMatter(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	web := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", Labels: map[string]string{"app": "web"}},
		Spec: v1.PodSpec{NodeName: "node-a"}, Status: v1.PodStatus{PodIP: "10.1.0.10"}}
	nodeA := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.200.0.1"}}}}
	client := fake.NewSimpleClientset(web, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, nodeA)
	updates := make(chan k8s.Cluster, 100)
	run, err := Watch(ctx, client, nil, 0, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c k8s.Cluster) { updates <- c })
	if err != nil {
		t.Fatal(err)
	}
	go run()
	select {
	case <-updates:
	case <-time.After(10 * time.Second):
		t.Fatal("no first translation")
	}

	pods := client.CoreV1().Pods("shop")
	for i := range 5 {
		p, err := pods.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady, Status: []v1.ConditionStatus{v1.ConditionTrue, v1.ConditionFalse}[i%2]}}
		p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "c", RestartCount: int32(i)}}
		if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A node's heartbeats and conditions cannot change a policy either.
	nodes := client.CoreV1().Nodes()
	for i := range 3 {
		n, err := nodes.Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.NewTime(time.Now().Add(time.Duration(i) * time.Second))}}
		if _, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The runner coalesces triggers within 200 ms: a second is long enough
	// for one it was given to run.
	select {
	case <-updates:
		t.Fatal("a pod's status changes or a node's heartbeats were translated again")
	case <-time.After(time.Second):
	}

	// A node's labels can (nodes peers select by them).
	n, err := nodes.Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels = map[string]string{"role": "infra"}
	if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := awaitUpdate(t, updates, "a node's label change", func(c k8s.Cluster) bool {
		return len(c.Nodes) == 1 && c.Nodes[0].Labels["role"] == "infra"
	})
	if len(c.Nodes[0].Status.Conditions) != 0 {
		t.Error("the cache keeps a node's conditions (k8s.Slim)")
	}

	p, err := pods.Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels = map[string]string{"app": "web2"}
	if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	awaitUpdate(t, updates, "a pod's label change", func(c k8s.Cluster) bool {
		return len(c.Pods) == 1 && c.Pods[0].Labels["app"] == "web2"
	})
}

// awaitUpdate returns the first update within 10 s that done accepts.
func awaitUpdate(t *testing.T, updates <-chan k8s.Cluster, what string, done func(k8s.Cluster) bool) k8s.Cluster {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case c := <-updates:
			if done(c) {
				return c
			}
		case <-deadline:
			t.Fatalf("%s was not translated", what)
		}
	}
}
