package main

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/scheme"

	"github.com/sluice-net/sluice/agent"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
	"github.com/sluice-net/sluice/kubeproxy/source"
	"github.com/sluice-net/sluice/nat/maglev"
	"github.com/sluice-net/sluice/policy/k8s"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// The deployment manifests (generated from the chart, deploy/generate.sh) are
// accepted by a real API server (server-side dry run: admission and
// validation, nothing stored), and the DaemonSet passes the agent only flags
// it knows.
func TestDeployManifestsValidate(t *testing.T) {
	s := apiservertest.Start(t)
	deploy := os.DirFS(filepath.Join("..", "..", "deploy"))
	// The CRDs: TestDeployCRDs; the Grafana dashboard: TestMetricsFromTheDatapath;
	// the chart renders deploy/sluice.yaml.
	objs, errs := source.ReadManifestsWith(withoutDir{deploy, []string{"crds", "grafana", "helm"}}, scheme.AddToScheme)
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
		case *appsv1.DaemonSet:
			_, err = s.Client.AppsV1().DaemonSets(obj.Namespace).Create(ctx, obj, dry)
			checkAgentArgs(t, obj.Spec.Template.Spec.Containers[0].Args)
		default:
			t.Fatalf("%s: unexpected object %T", o.File, obj)
		}
		if err != nil {
			t.Fatalf("%s: %T rejected by the API server: %v", o.File, o.Obj, err)
		}
		kinds[o.Obj.GetObjectKind().GroupVersionKind().Kind] = true
	}
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"} {
		if !kinds[k] {
			t.Errorf("deploy/ has no %s", k)
		}
	}
}

// withoutDir hides top-level folders of a file system.
type withoutDir struct {
	fs.FS
	dirs []string
}

func (w withoutDir) ReadDir(name string) ([]fs.DirEntry, error) {
	entries, err := fs.ReadDir(w.FS, name)
	if name != "." {
		return entries, err
	}
	return slices.DeleteFunc(entries, func(e fs.DirEntry) bool { return slices.Contains(w.dirs, e.Name()) }), err
}

// The CRDs of Sluice's own kinds are accepted by a real API server, and a
// HostEndpoint written as the README shows is accepted through them and
// read back by the agent's converter.
func TestDeployCRDs(t *testing.T) {
	s := apiservertest.Start(t)
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	files, err := filepath.Glob(filepath.Join("..", "..", "deploy", "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in deploy/crds: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if err := yaml.Unmarshal(data, &obj); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if _, err := crds.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s rejected by the API server: %v", f, err)
		}
	}
	heps := dyn.Resource(k8s.SchemeGroupVersion.WithResource("hostendpoints"))
	var js map[string]any
	if err := yaml.Unmarshal([]byte(hostEndpoint), &js); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "a HostEndpoint created through the CRD", func() bool {
		_, err = heps.Create(ctx, &unstructured.Unstructured{Object: js}, metav1.CreateOptions{})
		return err == nil
	}, func() string { return fmt.Sprint(err) })
	got, err := heps.Get(ctx, "edge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var h k8s.HostEndpoint
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &h); err != nil {
		t.Fatal(err)
	}
	if h.Spec.InterfaceName != "*" || len(h.Spec.Ingress) != 1 || h.Spec.Ingress[0].Ports[0].Port.IntVal != 30080 {
		t.Fatalf("read back %+v", h.Spec)
	}
	bad := map[string]any{"apiVersion": "sluice.dev/v1alpha1", "kind": "HostEndpoint", "metadata": map[string]any{"name": "bad"},
		"spec": map[string]any{"node": "n"}}
	if _, err := heps.Create(ctx, &unstructured.Unstructured{Object: bad}, metav1.CreateOptions{}); err == nil {
		t.Fatal("a HostEndpoint without an interfaceName was accepted")
	}
}

// checkAgentArgs parses a DaemonSet's arguments as the agent's command line.
func checkAgentArgs(t *testing.T, args []string) {
	t.Helper()
	if len(args) == 0 || args[0] != "agent" {
		t.Fatalf("DaemonSet args %q: want the agent command first", args)
	}
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	var cfg agent.Config
	agentFlags(fs, &cfg)
	if err := fs.Parse(args[1:]); err != nil || fs.NArg() > 0 {
		t.Fatalf("DaemonSet args %q: %v (left %q)", args, err, fs.Args())
	}
	if cfg.PinDir != "/sys/fs/bpf/sluice" || len(cfg.WorkloadPrefixes) != 3 || cfg.ProcSysNet != "/host/proc/sys/net" {
		t.Fatalf("DaemonSet args not applied: %+v", cfg)
	}
}

// The agent's flags start from agent.DefaultConfig, so a custom agent built
// on it behaves as `sluice agent` with no flags.
func TestFlagDefaultsAreTheAgentDefaults(t *testing.T) {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	var cfg agent.Config
	agentFlags(fs, &cfg)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	cfg.NodeName = "" // the host's name, which DefaultConfig leaves to the caller
	if want := agent.DefaultConfig(); !reflect.DeepEqual(cfg, want) {
		t.Fatalf("flag defaults\n%+v\nagent.DefaultConfig\n%+v", cfg, want)
	}
}

// The README states the built-in sizes the C headers set (through gen):
// a change there must show here.
func TestREADMEStatesTheBuiltInSizes(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(readme)), " ")
	for _, want := range []string{
		"keeps the built-in " + thousands(gen.ConntrackEntries/2) + " flows",
		"for the built-in " + thousands(gen.ConntrackEntries) + " entries",
		fmt.Sprintf("is a prime from %d to %d", maglev.MinSize, maglev.MaxSize),
		fmt.Sprintf("(`sl_maglev%d`)", maglev.DefaultSize),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the README does not say %q", want)
		}
	}
}
