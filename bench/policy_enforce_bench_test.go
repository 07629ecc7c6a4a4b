package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/sluice-net/sluice/gen/bpftest"
	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
)

var clusterNetworkPolicies = schema.GroupVersionResource{Group: "policy.networking.k8s.io", Version: "v1beta1", Resource: "clusternetworkpolicies"}

// BenchmarkPolicyEnforcement measures how long after a policy's creation
// (the create request sent) the agent enforces it, on real
// traffic, against a real API server holding n Pods: a client pod dials a
// backend pod of the node again and again, and the policy (a NetworkPolicy
// isolating the backend, or an Admin-tier ClusterNetworkPolicy denying it
// all ingress) is enforced when the first dial fails. The policy is then
// deleted and the time until a dial succeeds again is measured too. It
// reports p50 and p99 of each (ms) over the samples, and p99 of the API
// server's answer to the create (the part of the wait that is not the
// agent's). The other pods live on
// other nodes: they are the selectors' work, not the node's interfaces.
// Each case runs with the agent's --min-sync-period at its default (20 ms)
// and at 200 ms, the policy updates' fixed minimum before it bounded them.
// SLUICE_BENCH_FULL=1 adds 10,000 pods.
func BenchmarkPolicyEnforcement(b *testing.B) {
	bpftest.Require(b)
	if _, _, err := apiservertest.Binaries(); err != nil {
		b.Skip(err)
	}
	sluice, kubeProxy := proxyBinaries(b)
	counts := []int{100, 1_000}
	if os.Getenv("SLUICE_BENCH_FULL") == "1" {
		counts = append(counts, 10_000)
	}
	const samples = 40
	for _, n := range counts {
		for _, kind := range []string{"NetworkPolicy", "ClusterNetworkPolicy"} {
			for _, period := range []string{"20ms", "200ms"} {
				b.Run(fmt.Sprintf("pods=%d/%s/min-sync-period=%s", n, kind, period), func(b *testing.B) {
					var enforced, lifted, apiCreate []time.Duration
					first := true
					for b.Loop() {
						if !first {
							continue // one measurement: an API server run per case
						}
						first = false
						e := newBaselineEnv(b)
						dyn, err := dynamic.NewForConfig(e.api.Config)
						if err != nil {
							b.Fatal(err)
						}
						e.installCRD(b, dyn)
						e.createPods(b, n)
						e.startProxy(b, "sluice", sluice, kubeProxy, "--min-sync-period="+period)
						target := e.backendIPs[0] + ":8080"
						e.waitFor(b, target, "b1", time.Minute)
						// A first policy, not counted: it waits for the agent's
						// policy informers to have synced.
						create, remove := e.policyOps(dyn, kind, "warm-up")
						at, _ := timed(b, create)
						e.turn(b, at, target, false)
						at, _ = timed(b, remove)
						e.turn(b, at, target, true)
						for i := range samples {
							create, remove := e.policyOps(dyn, kind, fmt.Sprintf("isolate-b1-%d", i))
							at, api := timed(b, create)
							took := e.turn(b, at, target, false)
							enforced = append(enforced, took)
							apiCreate = append(apiCreate, api)
							if took > 100*time.Millisecond {
								b.Logf("sample %d (created at %s): enforced after %v; the API server answered the create after %v", i, at.UTC().Format("15:04:05.000"), took, api)
							}
							at, _ = timed(b, remove)
							lifted = append(lifted, e.turn(b, at, target, true))
							time.Sleep(100 * time.Millisecond) // each creation from an idle agent
						}
					}
					b.Logf("creation -> enforced, sorted: %v", sorted(enforced))
					b.Logf("deletion -> lifted, sorted: %v", sorted(lifted))
					b.ReportMetric(percentileMs(enforced, 50), "enforced-p50-ms")
					b.ReportMetric(percentileMs(enforced, 99), "enforced-p99-ms")
					b.ReportMetric(percentileMs(lifted, 50), "lifted-p50-ms")
					b.ReportMetric(percentileMs(lifted, 99), "lifted-p99-ms")
					b.ReportMetric(percentileMs(apiCreate, 99), "api-create-p99-ms")
				})
			}
		}
	}
}

// installCRD makes the API server serve ClusterNetworkPolicies before the
// agent starts.
func (e *baselineEnv) installCRD(b *testing.B, dyn dynamic.Interface) {
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if _, err := crds.Create(context.Background(), apiservertest.CRD(clusterNetworkPolicies, "ClusterNetworkPolicy"), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := dyn.Resource(clusterNetworkPolicies).List(context.Background(), metav1.ListOptions{}); err == nil {
			return
		} else if time.Now().After(deadline) {
			b.Fatalf("ClusterNetworkPolicies not served: %v", err)
		}
	}
}

// createPods creates n Running Pods: the environment's own three on this
// node (client, b1, b2, in default) and the rest on other nodes, in ten
// namespaces, labelled as ten apps.
func (e *baselineEnv) createPods(b *testing.B, n int) {
	ctx := context.Background()
	c := e.api.Client
	for i := range 10 {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns%d", i)}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	pod := func(i int) (ns, name, node, ip string, labels map[string]string) {
		switch i {
		case 0:
			return "default", "client", "node", "10.200.0.2", map[string]string{"app": "client"}
		case 1, 2:
			return "default", fmt.Sprintf("b%d", i), "node", e.backendIPs[i-1], map[string]string{"app": fmt.Sprintf("b%d", i)}
		}
		return fmt.Sprintf("ns%d", i%10), fmt.Sprintf("pod%d", i), fmt.Sprintf("node-%d", i%50),
			fmt.Sprintf("10.100.%d.%d", i/250, i%250+1), map[string]string{"app": fmt.Sprintf("app%d", i%10)}
	}
	inParallel(b, 8, n, func(i int) error {
		ns, name, node, ip, labels := pod(i)
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec: v1.PodSpec{NodeName: node, Containers: []v1.Container{{Name: "c", Image: "none"}}}}
		created, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		created.Status = v1.PodStatus{Phase: v1.PodRunning, PodIP: ip, PodIPs: []v1.PodIP{{IP: ip}}}
		_, err = c.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		return err
	})
}

// policyOps are the create and delete of one policy of kind that denies b1
// every ingress.
func (e *baselineEnv) policyOps(dyn dynamic.Interface, kind, name string) (create, remove func() error) {
	ctx := context.Background()
	if kind == "NetworkPolicy" {
		nps := e.api.Client.NetworkingV1().NetworkPolicies("default")
		np := &netv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: netv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "b1"}},
				PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeIngress}}}
		return func() error { _, err := nps.Create(ctx, np, metav1.CreateOptions{}); return err },
			func() error { return nps.Delete(ctx, name, metav1.DeleteOptions{}) }
	}
	cnps := dyn.Resource(clusterNetworkPolicies)
	cnp := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{"tier": "Admin", "priority": int64(10),
			"subject": map[string]any{"pods": map[string]any{"namespaceSelector": map[string]any{},
				"podSelector": map[string]any{"matchLabels": map[string]any{"app": "b1"}}}},
			"ingress": []any{map[string]any{"action": "Deny", "from": []any{map[string]any{"namespaces": map[string]any{}}}}}},
	}}
	return func() error { _, err := cnps.Create(ctx, cnp, metav1.CreateOptions{}); return err },
		func() error { return cnps.Delete(ctx, name, metav1.DeleteOptions{}) }
}

// timed runs op and returns when it was sent: the agent may see the change
// before the API server's answer reaches the client, so its sending is the
// one start that is never after the change.
func timed(b *testing.B, op func() error) (sent time.Time, answered time.Duration) {
	start := time.Now()
	if err := op(); err != nil {
		b.Fatal(err)
	}
	return start, time.Since(start)
}

// turn dials addr from the client pod until a dial's outcome is open (the
// connection made) or not, and returns how long after since the first such
// dial started. A dial is given 5 ms (one takes a tenth of a millisecond
// here); one that fails counts only when a second, given 100 ms, fails too:
// a busy machine (the agent starting) can delay an answer past 5 ms.
// Connections close with a RST: no TIME_WAIT piles up on the client's ports.
func (e *baselineEnv) turn(b *testing.B, since time.Time, addr string, open bool) time.Duration {
	var took time.Duration
	dial := func(timeout time.Duration) bool {
		c, err := net.DialTimeout("tcp4", addr, timeout)
		if err == nil {
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
		return err == nil
	}
	err := e.client.Do(func() error {
		for time.Since(since) < 30*time.Second {
			start := time.Now()
			ok := dial(5 * time.Millisecond)
			if !ok && open == false && dial(100*time.Millisecond) {
				ok = true // slow, not refused
			}
			if ok == open {
				took = max(start.Sub(since), 0)
				return nil
			}
			time.Sleep(200 * time.Microsecond)
		}
		return fmt.Errorf("%s never turned open=%v within 30 s", addr, open)
	})
	if err != nil {
		b.Fatal(err)
	}
	return took
}

// percentileMs is the p-th percentile of ds (nearest rank), in ms.
func percentileMs(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := sorted(ds)
	i := (len(s)*p + 99) / 100
	return float64(s[max(i-1, 0)].Microseconds()) / 1000
}

func sorted(ds []time.Duration) []time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	for i := range s {
		s[i] = s[i].Round(100 * time.Microsecond)
	}
	return s
}
