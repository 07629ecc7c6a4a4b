package kubeproxy

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// Object is one object read from a manifest file.
type Object struct {
	File string
	Obj  runtime.Object
}

var decoder = serializer.NewCodecFactory(scheme.Scheme).UniversalDeserializer()

// ReadManifests reads every .yaml, .yml and .json file under dir: many objects
// per file, YAML documents separated by "---" lines. A document that does not
// decode is reported with its file and position, and the others still count.
func ReadManifests(fsys fs.FS) ([]Object, []error) {
	var objs []Object
	var errs []error
	err := fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch filepath.Ext(path) {
		case ".yaml", ".yml", ".json":
		default:
			return nil
		}
		data, err := fs.ReadFile(fsys, path)
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		for i, doc := range splitDocuments(data) {
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			js, err := yaml.YAMLToJSON(doc)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: document %d: %w", path, i+1, err))
				continue
			}
			if string(bytes.TrimSpace(js)) == "null" {
				continue // only comments
			}
			obj, _, err := decoder.Decode(js, nil, nil)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: document %d: %w", path, i+1, err))
				continue
			}
			objs = append(objs, Object{File: path, Obj: obj})
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	return objs, errs
}

func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur []byte
	for line := range bytes.Lines(data) {
		if t := strings.TrimRight(string(line), "\r\n"); t == "---" || strings.HasPrefix(t, "--- ") {
			docs = append(docs, cur)
			cur = nil
			continue
		}
		cur = append(cur, line...)
	}
	return append(docs, cur)
}

// ManifestSource feeds a proxier from a folder of manifests and follows
// changes to it: the embedded default that runs Sluice without a cluster.
type ManifestSource struct {
	Dir      string
	Interval time.Duration // how often the folder is checked (default 1 s)
	Log      *slog.Logger
	// OnObjects, if set, receives every object read (the agent takes Nodes,
	// Pods, Namespaces and NetworkPolicies from it).
	OnObjects func([]Object)

	seen     map[string]Object // by kind/namespace/name
	stamp    string
	reported map[string]bool
}

// Run reads the folder, tells the proxier that Services and EndpointSlices are
// listed, and re-reads it whenever a file changes, until ctx ends.
func (m *ManifestSource) Run(ctx context.Context, p *Proxier) {
	if m.Interval == 0 {
		m.Interval = time.Second
	}
	if m.Log == nil {
		m.Log = slog.Default()
	}
	m.Sync(p)
	p.OnServicesSynced()
	p.OnEndpointSlicesSynced()
	t := time.NewTicker(m.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.Sync(p)
		}
	}
}

// folderStamp summarises the folder (names, sizes, times) to notice changes.
func folderStamp(dir string) string {
	var b strings.Builder
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				fmt.Fprintf(&b, "%s %d %d\n", path, info.Size(), info.ModTime().UnixNano())
			}
		}
		return nil
	})
	return b.String()
}

// Sync re-reads the folder if it changed and sends the differences.
func (m *ManifestSource) Sync(p *Proxier) {
	stamp := folderStamp(m.Dir)
	if stamp == m.stamp && m.seen != nil {
		return
	}
	m.stamp = stamp
	objs, errs := ReadManifests(os.DirFS(m.Dir))
	if m.reported == nil {
		m.reported = map[string]bool{}
	}
	for _, err := range errs {
		if !m.reported[err.Error()] {
			m.reported[err.Error()] = true
			m.Log.Error("skipping manifest document", "dir", m.Dir, "err", err)
		}
	}
	next := map[string]Object{}
	for _, o := range objs {
		defaultNamespace(o.Obj)
		key := objectKey(o.Obj)
		if key == "" {
			continue
		}
		next[key] = o
	}
	t := p.Tracker()
	for key, o := range next {
		if old, ok := m.seen[key]; ok && equalObjects(old.Obj, o.Obj) {
			continue
		}
		switch obj := o.Obj.(type) {
		case *v1.Service:
			t.OnService(obj, false)
		case *discovery.EndpointSlice:
			t.OnEndpointSlice(obj, false)
		case *v1.Node:
			if obj.Name == p.cfg.NodeName {
				p.OnNode(obj)
			}
		}
	}
	for key, o := range m.seen {
		if _, ok := next[key]; ok {
			continue
		}
		switch obj := o.Obj.(type) {
		case *v1.Service:
			t.OnService(obj, true)
		case *discovery.EndpointSlice:
			t.OnEndpointSlice(obj, true)
		}
	}
	m.seen = next
	if m.OnObjects != nil {
		m.OnObjects(slices.Collect(func(yield func(Object) bool) {
			for _, o := range next {
				if !yield(o) {
					return
				}
			}
		}))
	}
}

// defaultNamespace puts namespaced objects without a namespace in "default",
// as kubectl would.
func defaultNamespace(o runtime.Object) {
	switch obj := o.(type) {
	case *v1.Service:
		if obj.Namespace == "" {
			obj.Namespace = "default"
		}
	case *discovery.EndpointSlice:
		if obj.Namespace == "" {
			obj.Namespace = "default"
		}
	}
}

func objectKey(o runtime.Object) string {
	type named interface {
		GetNamespace() string
		GetName() string
	}
	n, ok := o.(named)
	if !ok {
		return ""
	}
	return fmt.Sprintf("%T/%s/%s", o, n.GetNamespace(), n.GetName())
}

func equalObjects(a, b runtime.Object) bool {
	ja, errA := yaml.Marshal(a)
	jb, errB := yaml.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}
