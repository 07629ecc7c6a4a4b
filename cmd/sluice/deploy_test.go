package main

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-net/sluice/cmd/internal/agent"
	"github.com/sluice-net/sluice/kubeproxy"
	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The deployment manifests are accepted by a real API server (server-side dry
// run: admission and validation, nothing stored), and the ConfigMap's config
// file uses only keys the agent knows.
func TestDeployManifestsValidate(t *testing.T) {
	s := apiservertest.Start(t)
	objs, errs := kubeproxy.ReadManifests(os.DirFS(filepath.Join("..", "..", "deploy")))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	ctx := context.Background()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	kinds := map[string]bool{}
	for _, o := range objs {
		var err error
		switch obj := o.Obj.(type) {
		case *v1.ServiceAccount:
			_, err = s.Client.CoreV1().ServiceAccounts(obj.Namespace).Create(ctx, obj, dry)
		case *rbacv1.ClusterRole:
			_, err = s.Client.RbacV1().ClusterRoles().Create(ctx, obj, dry)
		case *rbacv1.ClusterRoleBinding:
			_, err = s.Client.RbacV1().ClusterRoleBindings().Create(ctx, obj, dry)
		case *v1.ConfigMap:
			_, err = s.Client.CoreV1().ConfigMaps(obj.Namespace).Create(ctx, obj, dry)
			checkConfigFile(t, obj.Data["config.yaml"])
		case *appsv1.DaemonSet:
			_, err = s.Client.AppsV1().DaemonSets(obj.Namespace).Create(ctx, obj, dry)
		default:
			t.Fatalf("%s: unexpected object %T", o.File, obj)
		}
		if err != nil {
			t.Fatalf("%s: %T rejected by the API server: %v", o.File, o.Obj, err)
		}
		kinds[o.Obj.GetObjectKind().GroupVersionKind().Kind] = true
	}
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"} {
		if !kinds[k] {
			t.Errorf("deploy/ has no %s", k)
		}
	}
}

func checkConfigFile(t *testing.T, content string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	var cfg agent.Config
	agentFlags(fs, &cfg)
	if ignored, err := applyConfigFile(fs, path); err != nil || len(ignored) > 0 {
		t.Fatalf("the ConfigMap's config file: %v (ignored %v)", err, ignored)
	}
	if cfg.PinDir != "/sys/fs/bpf/sluice" || len(cfg.WorkloadPrefixes) != 3 {
		t.Fatalf("config file not applied: %+v", cfg)
	}
}
