package apiservertest_test

import (
	"context"
	"testing"

	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A test against a real kube-apiserver (and its etcd), started for the test
// and stopped with it: SLUICE_KUBE_APISERVER names the binary (.ci/install
// builds it). Without it the test skips, or fails with SLUICE_REQUIRE_BPF=1.
func ExampleStart() {
	_ = func(t *testing.T) {
		s := apiservertest.Start(t)
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
			Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Port: 80}}}}
		created, err := s.Client.CoreV1().Services("default").Create(context.Background(), svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the API server gave web the ClusterIP %s", created.Spec.ClusterIP)
	}
}
