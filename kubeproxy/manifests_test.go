package kubeproxy_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/sluice-net/sluice/kubeproxy"
	"github.com/sluice-net/sluice/kubeproxy/source"
)

const webYAML = `# two services and a slice in one file
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: 10.96.0.10
  ports:
  - name: http
    port: 80
---
apiVersion: v1
kind: Service
metadata:
  name: dns
  namespace: kube-system
spec:
  clusterIP: 10.96.0.53
  ports:
  - name: dns
    port: 53
    protocol: UDP
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  port: 8080
endpoints:
- addresses: ["10.2.0.1"]
- addresses: ["10.2.0.2"]
---
this: is: not: yaml
`

const dnsJSON = `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice",
 "metadata":{"name":"dns-1","namespace":"kube-system","labels":{"kubernetes.io/service-name":"dns"}},
 "addressType":"IPv4","ports":[{"name":"dns","port":5353,"protocol":"UDP"}],
 "endpoints":[{"addresses":["10.2.0.53"]}]}`

func TestManifestFolderSource(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{})
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("web.yaml", webYAML)
	write("dns.json", dnsJSON)
	write("README.txt", "not a manifest")
	// Polling, as where inotify is not available.
	src := &source.ManifestSource{Dir: dir, Interval: 20 * time.Millisecond, Poll: true}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go src.Run(ctx, e.p)
	e.eventually("services from the folder", func() bool {
		fe := e.frontends()
		return fe["10.96.0.10:80/6"].Count == 2 && fe["10.96.0.53:53/17"].Count == 1
	})

	// Edit a file: the change is followed.
	write("web.yaml", webYAML[:len(webYAML)-len("- addresses: [\"10.2.0.2\"]\n---\nthis: is: not: yaml\n")])
	e.eventually("edited slice followed", func() bool { return e.frontends()["10.96.0.10:80/6"].Count == 1 })
	// A slice relabelled to another service leaves its own; back, it returns.
	write("dns.json", strings.Replace(dnsJSON, `service-name":"dns"`, `service-name":"dns-old"`, 1))
	e.eventually("relabelled slice left its service", func() bool { return e.frontends()["10.96.0.53:53/17"].Count == 0 })
	write("dns.json", dnsJSON)
	e.eventually("slice labelled back", func() bool { return e.frontends()["10.96.0.53:53/17"].Count == 1 })
	// Remove a file: its objects go.
	if err := os.Remove(filepath.Join(dir, "dns.json")); err != nil {
		t.Fatal(err)
	}
	e.eventually("removed file's slice gone", func() bool { return e.frontends()["10.96.0.53:53/17"].Count == 0 })
}

func TestReadManifestsReportsBadDocuments(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(webYAML), 0o644)
	objs, errs := source.ReadManifests(os.DirFS(dir))
	if len(objs) != 3 {
		t.Fatalf("%d objects, want 3", len(objs))
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "a.yaml: document 4") {
		t.Fatalf("errors %v: want the bad document named by file and position", errs)
	}
}

// Kinds of API groups Sluice reads nothing of are skipped, not errors (a
// chart's folder holds Deployments and ConfigMaps too), also inside a List;
// an unknown kind in a group it reads is a typo, and an error.
func TestReadManifestsSkipsOtherGroups(t *testing.T) {
	dir := t.TempDir()
	other := `apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec: {replicas: 2}
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: ConfigMap, metadata: {name: c}}
- {apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRole, metadata: {name: r}}
- {apiVersion: v1, kind: Service, metadata: {name: in-list}, spec: {clusterIP: 10.96.0.11, ports: [{port: 80}]}}
---
apiVersion: v1
kind: Servce
metadata: {name: typo}
`
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, errs := source.ReadManifests(os.DirFS(dir))
	var names []string
	for _, o := range objs {
		names = append(names, fmt.Sprintf("%T", o.Obj))
	}
	// The ConfigMap is core/v1, a group Sluice reads: decoded, then unused.
	if len(objs) != 2 {
		t.Fatalf("objects %v, want the List's ConfigMap and Service only", names)
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "a.yaml: document 3") || !strings.Contains(errs[0].Error(), "Servce") {
		t.Fatalf("errors %v: want the typo'd kind named by file and position, and nothing for the Deployment or ClusterRole", errs)
	}
	// Asked for apps/v1, the Deployment is read too.
	objs, errs = source.ReadManifestsWith(os.DirFS(dir), appsv1.AddToScheme)
	if len(objs) != 3 || len(errs) != 1 {
		t.Fatalf("with apps/v1: %d objects, errors %v; want the Deployment as a third object", len(objs), errs)
	}
	if _, ok := objs[0].Obj.(*appsv1.Deployment); !ok {
		t.Fatalf("with apps/v1: first object %T, want the Deployment", objs[0].Obj)
	}
}

// runSource starts a manifest source on dir with a fast interval.
// runSource runs a source on dir that sees changes only through inotify.
func runSource(t *testing.T, e *env, dir string, log *slog.Logger) {
	t.Helper()
	// Checks far apart: what a test sees in time, inotify told.
	src := &source.ManifestSource{Dir: dir, Interval: time.Hour, Recheck: time.Hour, Log: log}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go src.Run(ctx, e.p)
}

// markerYAML is a Service that tests write after a change, to know when
// the change has been read.
const markerYAML = `apiVersion: v1
kind: Service
metadata: {name: marker, namespace: default}
spec:
  clusterIP: 10.96.2.1
  ports: [{name: http, port: 80, protocol: TCP}]
`

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// gauge reads a gauge of the env's registry by name and label value.
func (e *env) gauge(name, label string) float64 {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// A folder that disappears (renamed, unmounted) is not an empty folder: the
// Services stay, the proxy turns unhealthy and says why, and everything
// resumes when the folder is back.
func TestManifestFolderThatVanishesKeepsTheLastState(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{})
	parent := t.TempDir()
	dir := filepath.Join(parent, "manifests")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "web.yaml"), webYAML)
	var logs lockedBuffer
	runSource(t, e, dir, slog.New(slog.NewTextHandler(&logs, nil)))
	e.eventually("services from the folder", func() bool { return e.frontends()["10.96.0.10:80/6"].Count == 2 })

	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	e.eventually("unhealthy while the folder is gone", func() bool { return !e.p.Health.Healthy() })
	// Whatever the pass that found the folder gone sent is synced by now:
	// a change made after it is programmed.
	e.p.Tracker().OnService(svc("marker", "10.96.2.1"), false)
	e.eventually("a change after the pass programmed", func() bool { _, ok := e.frontends()["10.96.2.1:80/6"]; return ok })
	if e.frontends()["10.96.0.10:80/6"].Count != 2 {
		t.Fatal("a vanished folder removed its Services")
	}
	if v := e.gauge("sluice_source_unreadable", "manifests"); v != 1 {
		t.Fatalf("sluice_source_unreadable = %v while the folder is gone", v)
	}
	if !strings.Contains(logs.String(), "manifests folder cannot be read") {
		t.Fatalf("no log line says the folder is gone:\n%s", logs.String())
	}

	if err := os.Rename(dir+".moved", dir); err != nil {
		t.Fatal(err)
	}
	e.eventually("healthy again", func() bool { return e.p.Health.Healthy() })
	writeFile(t, filepath.Join(dir, "web.yaml"), strings.Replace(webYAML, `- addresses: ["10.2.0.2"]`, "", 1))
	e.eventually("changes followed again", func() bool { return e.frontends()["10.96.0.10:80/6"].Count == 1 })
	if v := e.gauge("sluice_source_unreadable", "manifests"); v != 0 {
		t.Fatalf("sluice_source_unreadable = %v once the folder is back", v)
	}
}

// A document that does not parse keeps the objects its file held before:
// half an edit must not delete live Services.
func TestManifestFileWithASyntaxErrorKeepsItsObjects(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{})
	dir := t.TempDir()
	good := strings.TrimSuffix(webYAML, "---\nthis: is: not: yaml\n")
	writeFile(t, filepath.Join(dir, "web.yaml"), good)
	runSource(t, e, dir, nil)
	e.eventually("services from the folder", func() bool { return e.frontends()["10.96.0.10:80/6"].Count == 2 })

	// An editor saved half a file: the slice's document is broken.
	broken := good[:strings.Index(good, "kind: EndpointSlice")] + "kind: EndpointSlice\nmetadata: [unclosed\n"
	writeFile(t, filepath.Join(dir, "web.yaml"), broken)
	// A second file written after it: once its Service is programmed, the
	// broken file has been read and its pass synced (inotify reports the
	// writes in order).
	writeFile(t, filepath.Join(dir, "zz-marker.yaml"), markerYAML)
	e.eventually("the marker file programmed", func() bool { _, ok := e.frontends()["10.96.2.1:80/6"]; return ok })
	fe := e.frontends()
	if _, dns := fe["10.96.0.53:53/17"]; fe["10.96.0.10:80/6"].Count != 2 || !dns {
		t.Fatalf("objects of a file with a syntax error were removed: %v", fe)
	}
	// Fixed, without the slice: now it goes.
	writeFile(t, filepath.Join(dir, "web.yaml"), good[:strings.Index(good, "---\napiVersion: discovery.k8s.io/v1")])
	e.eventually("the slice removed once the file parses", func() bool { return e.frontends()["10.96.0.10:80/6"].Count == 0 })
}

// kind: List is expanded; a Service defined in two files is taken from the
// first file by name and the second definition is logged; a folder that is a
// symbolic link is followed, edits inside it included.
func TestManifestListsDuplicatesAndSymlinks(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{})
	target := t.TempDir()
	link := filepath.Join(t.TempDir(), "current")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(target, "a.yaml"), `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: web}
  spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  ports: [{name: http, port: 8080}]
  endpoints: [{addresses: ["10.2.0.1"]}]
`)
	writeFile(t, filepath.Join(target, "b.yaml"), `apiVersion: v1
kind: Service
metadata: {name: web}
spec: {clusterIP: 10.96.0.99, ports: [{name: http, port: 80}]}
`)
	var logs lockedBuffer
	runSource(t, e, link, slog.New(slog.NewTextHandler(&logs, nil)))
	e.eventually("the List's Service", func() bool { return e.frontends()["10.96.0.10:80/6"].Count == 1 })
	if _, ok := e.frontends()["10.96.0.99:80/6"]; ok {
		t.Fatal("the second definition of a Service was programmed")
	}
	if !strings.Contains(logs.String(), "object defined twice") || !strings.Contains(logs.String(), "b.yaml") {
		t.Fatalf("the duplicate is not logged:\n%s", logs.String())
	}
	// An edit inside the linked folder is seen.
	if err := os.Remove(filepath.Join(target, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	e.eventually("the other definition takes over", func() bool {
		return e.frontends()["10.96.0.99:80/6"].Count == 0 && e.frontends()["10.96.0.10:80/6"].Count == 0
	})
	if _, ok := e.frontends()["10.96.0.99:80/6"]; !ok {
		t.Fatalf("after the first file went, the second definition should be programmed: %v", e.frontends())
	}
}

func TestCheckManifestDir(t *testing.T) {
	if err := source.CheckManifestDir(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("missing folder: %v", err)
	}
	file := filepath.Join(t.TempDir(), "f.yaml")
	writeFile(t, file, "")
	if err := source.CheckManifestDir(file); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("a file: %v", err)
	}
	if err := source.CheckManifestDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

// The folder is watched with inotify: a file in a new subfolder is seen, and
// so is a ConfigMap volume's update (new timestamped folder, "..data" link
// swapped), whose hidden entries are not read as manifests of their own.
func TestManifestFolderWatch(t *testing.T) {
	e := newEnv(t, kubeproxy.Config{})
	dir := t.TempDir()
	// A ConfigMap volume: web.yaml -> ..data/web.yaml, ..data -> ..<time>.
	version := func(name, content string) {
		writeFile(t, filepath.Join(dir, name, "web.yaml"), content)
	}
	if err := os.Mkdir(filepath.Join(dir, "..2026_12_01_a"), 0o755); err != nil {
		t.Fatal(err)
	}
	version("..2026_12_01_a", webYAML)
	for old, link := range map[string]string{"..2026_12_01_a": "..data", "..data/web.yaml": "web.yaml"} {
		if err := os.Symlink(old, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	var logs lockedBuffer
	runSource(t, e, dir, slog.New(slog.NewTextHandler(&logs, nil)))
	e.eventually("services from the ConfigMap", func() bool { return e.frontends()["10.96.0.10:80/6"].Count == 2 })

	// The kubelet's update: a new folder, a new link renamed over ..data.
	if err := os.Mkdir(filepath.Join(dir, "..2026_12_01_b"), 0o755); err != nil {
		t.Fatal(err)
	}
	version("..2026_12_01_b", strings.Replace(webYAML, `- addresses: ["10.2.0.2"]`, "", 1))
	if err := os.Symlink("..2026_12_01_b", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2026_12_01_a")); err != nil {
		t.Fatal(err)
	}
	e.eventually("the ConfigMap's update", func() bool { return e.frontends()["10.96.0.10:80/6"].Count == 1 })

	// A subfolder made after the start, and a file in it.
	if err := os.Mkdir(filepath.Join(dir, "more"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "more", "dns.json"), dnsJSON)
	e.eventually("a file in a new subfolder", func() bool { return e.frontends()["10.96.0.53:53/17"].Count == 1 })
	writeFile(t, filepath.Join(dir, "more", "dns.json"), strings.Replace(dnsJSON, `"10.2.0.53"`, `"10.2.0.53"]},{"addresses":["10.2.0.54"`, 1))
	e.eventually("an edit in the new subfolder", func() bool { return e.frontends()["10.96.0.53:53/17"].Count == 2 })

	if strings.Contains(logs.String(), "defined twice") || strings.Contains(logs.String(), "..2026") {
		t.Fatalf("hidden ConfigMap entries were read as manifests:\n%s", logs.String())
	}
}

// lockedBuffer is a log the source writes while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
