package kubeproxy_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-net/sluice/kubeproxy"
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
	src := &kubeproxy.ManifestSource{Dir: dir, Interval: 20 * time.Millisecond}
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
	// Remove a file: its objects go.
	if err := os.Remove(filepath.Join(dir, "dns.json")); err != nil {
		t.Fatal(err)
	}
	e.eventually("removed file's slice gone", func() bool { return e.frontends()["10.96.0.53:53/17"].Count == 0 })
}

func TestReadManifestsReportsBadDocuments(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(webYAML), 0o644)
	objs, errs := kubeproxy.ReadManifests(os.DirFS(dir))
	if len(objs) != 3 {
		t.Fatalf("%d objects, want 3", len(objs))
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "a.yaml: document 4") {
		t.Fatalf("errors %v: want the bad document named by file and position", errs)
	}
}
