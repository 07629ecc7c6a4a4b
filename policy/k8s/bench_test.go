package k8s

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
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

// realisticPod is a Deployment's pod as the API server returns it once it
// runs: three managers' managed fields, the controller's owner reference
// and annotations, one container with its environment, mounts, probes and
// resources, the service account token volume, the default tolerations,
// and the kubelet's status.
func realisticPod(i int) *v1.Pod {
	fields := func(n int) *metav1.FieldsV1 {
		return &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{"f:app":{},"f:pod-template-hash":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"app\"}":{` +
			strings.Repeat(`"f:env":{},"f:image":{},"f:ports":{},"f:resources":{},`, n) + `}}}}`)}
	}
	probe := &v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 10}
	now := metav1.Now()
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: fmt.Sprintf("web-7d4b9c8f6-%05d", i), UID: types.UID(fmt.Sprintf("9f0c2a7e-0000-4000-8000-%012d", i)),
			ResourceVersion: fmt.Sprint(100000 + i), CreationTimestamp: now, GenerateName: "web-7d4b9c8f6-",
			Labels:          map[string]string{"app": "web", "pod-template-hash": "7d4b9c8f6", "version": "v3"},
			Annotations:     map[string]string{"kubectl.kubernetes.io/restartedAt": now.String(), "prometheus.io/scrape": "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-7d4b9c8f6", UID: "5b1d", Controller: ptr(true)}},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: "Update", FieldsType: "FieldsV1", FieldsV1: fields(4), Time: &now},
				{Manager: "kube-scheduler", Operation: "Update", FieldsType: "FieldsV1", FieldsV1: fields(1), Time: &now},
				{Manager: "kubelet", Operation: "Update", Subresource: "status", FieldsType: "FieldsV1", FieldsV1: fields(6), Time: &now}}},
		Spec: v1.PodSpec{NodeName: fmt.Sprintf("node-%d", i%100), ServiceAccountName: "web", RestartPolicy: v1.RestartPolicyAlways,
			Containers: []v1.Container{{Name: "app", Image: "registry.example/shop/web:3.14.1", Command: []string{"/web", "--listen=:8080"},
				Ports:         []v1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: v1.ProtocolTCP}},
				Env:           []v1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "DB_HOST", Value: "db.shop.svc"}, {Name: "POD_NAME", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
				VolumeMounts:  []v1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
				LivenessProbe: probe, ReadinessProbe: probe, TerminationMessagePath: "/dev/termination-log", ImagePullPolicy: v1.PullIfNotPresent}},
			Volumes: []v1.Volume{{Name: "kube-api-access", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
				{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr(int64(3607))}},
				{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []v1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}}}}}}},
			Tolerations: []v1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))},
				{Key: "node.kubernetes.io/unreachable", Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))}}},
		Status: v1.PodStatus{Phase: v1.PodRunning, HostIP: "10.0.0.7", PodIP: fmt.Sprintf("10.1.%d.%d", i/250, i%250), StartTime: &now,
			PodIPs: []v1.PodIP{{IP: fmt.Sprintf("10.1.%d.%d", i/250, i%250)}},
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: now}, {Type: v1.ContainersReady, Status: v1.ConditionTrue, LastTransitionTime: now},
				{Type: v1.PodInitialized, Status: v1.ConditionTrue, LastTransitionTime: now}, {Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: now}},
			ContainerStatuses: []v1.ContainerStatus{{Name: "app", Ready: true, Image: "registry.example/shop/web:3.14.1", ImageID: "registry.example/shop/web@sha256:" + strings.Repeat("ab", 32),
				ContainerID: "containerd://" + strings.Repeat("cd", 32), State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}}}}},
	}
}

// BenchmarkPodCacheMemory: the bytes a policy informer's cache holds per
// Pod, whole (as decoded) and as Slim keeps it, for 10,000 realistic pods
// (the heap's growth after a collection; one op is the whole list).
func BenchmarkPodCacheMemory(b *testing.B) {
	for _, slim := range []bool{false, true} {
		b.Run(fmt.Sprintf("slim=%v", slim), func(b *testing.B) {
			var perPod float64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				pods := make([]any, 10_000)
				for i := range pods {
					pods[i] = realisticPod(i)
					if slim {
						pods[i], _ = Slim(pods[i])
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perPod = float64(after.HeapAlloc-before.HeapAlloc) / float64(len(pods))
				runtime.KeepAlive(pods)
			}
			b.ReportMetric(perPod, "B/pod")
		})
	}
}
