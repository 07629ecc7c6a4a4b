// Package source feeds a kubeproxy.Proxier its objects, as kube-proxy's
// pkg/proxy/config does: informers on an API server (RunInformers), or a
// folder of manifests, followed with inotify (ManifestSource). It reads;
// it writes nothing to the API server or the folder.
//
// Built with the tag sluice_nokube it has no RunInformers, and does not
// import client-go's clientset and informers: a program that reads
// manifests only (`sluice demo`) builds in a fraction of the time.
package source

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	npav1alpha1 "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/sluice-net/sluice/kubeproxy"
)

// Object is one object read from a manifest file.
type Object struct {
	File string
	Obj  runtime.Object
}

// decoder reads the kinds Sluice reads — core/v1, discovery.k8s.io/v1 and
// networking.k8s.io/v1 — and the network policy API's (ClusterNetworkPolicy,
// and the older AdminNetworkPolicy and BaselineAdminNetworkPolicy), which are
// custom resources in a cluster. Not client-go's scheme of every API group:
// its packages are much of a first build, for kinds that would be ignored.
var decoder = newDecoder(nil)

// manifestDecoder decodes the kinds of its scheme, and tells the documents
// of other API groups (a Deployment beside a Service), which are skipped.
type manifestDecoder struct {
	runtime.Decoder
	scheme *runtime.Scheme
}

// newDecoder is the decoder of the default kinds and more (a kind's
// AddToScheme).
func newDecoder(kinds []func(*runtime.Scheme) error) manifestDecoder {
	s := runtime.NewScheme()
	defaults := []func(*runtime.Scheme) error{v1.AddToScheme, discovery.AddToScheme, networkingv1.AddToScheme,
		npav1beta1.AddToScheme, npav1alpha1.AddToScheme}
	for _, add := range append(defaults, kinds...) {
		if err := add(s); err != nil {
			panic(err) // registrations of Go types: a bug if they fail
		}
	}
	return manifestDecoder{serializer.NewCodecFactory(s).UniversalDeserializer(), s}
}

// decode decodes one JSON document. A kind of an API group the scheme does
// not hold is skipped (nil, nil): Sluice reads none of that group. A kind
// the scheme does not know in a group it holds ("Servce") is an error.
func (d manifestDecoder) decode(js []byte) (runtime.Object, error) {
	obj, _, err := d.Decode(js, nil, nil)
	if err != nil && runtime.IsNotRegisteredError(err) {
		var tm metav1.TypeMeta
		if json.Unmarshal(js, &tm) == nil && tm.Kind != "" {
			if gv, perr := schema.ParseGroupVersion(tm.APIVersion); perr == nil && !d.scheme.IsGroupRegistered(gv.Group) {
				return nil, nil
			}
		}
	}
	return obj, err
}

// isManifest tells a manifest file by its name.
func isManifest(name string) bool {
	switch filepath.Ext(name) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// ReadManifests reads every .yaml, .yml and .json file under dir: many objects
// per file, YAML documents separated by "---" lines, `kind: List` expanded. A
// document that does not decode is reported with its file and position, and
// the others still count.
func ReadManifests(fsys fs.FS) ([]Object, []error) {
	return readManifests(fsys, decoder)
}

// ReadManifestsWith is ReadManifests that also decodes the kinds kinds
// register (an AddToScheme each): client-go's scheme.AddToScheme reads
// every built-in kind, a Deployment too.
func ReadManifestsWith(fsys fs.FS, kinds ...func(*runtime.Scheme) error) ([]Object, []error) {
	return readManifests(fsys, newDecoder(kinds))
}

func readManifests(fsys fs.FS, decoder manifestDecoder) ([]Object, []error) {
	var objs []Object
	var errs []error
	err := fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !isManifest(path) {
			return err
		}
		data, err := fs.ReadFile(fsys, path)
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		o, e := parseManifest(decoder, path, data)
		objs, errs = append(objs, o...), append(errs, e...)
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	return objs, errs
}

// parseManifest decodes the documents of one file.
func parseManifest(decoder manifestDecoder, path string, data []byte) ([]Object, []error) {
	var objs []Object
	var errs []error
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
		obj, err := decoder.decode(js)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: document %d: %w", path, i+1, err))
			continue
		}
		if obj == nil {
			continue // another API group's kind
		}
		list, ok := obj.(*v1.List)
		if !ok {
			objs = append(objs, Object{File: path, Obj: obj})
			continue
		}
		for j, item := range list.Items {
			o, err := decoder.decode(item.Raw)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: document %d: list item %d: %w", path, i+1, j+1, err))
				continue
			}
			if o == nil {
				continue
			}
			objs = append(objs, Object{File: path, Obj: o})
		}
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

// CheckManifestDir tells whether dir can serve as a manifest folder: it must
// exist and be a directory (a symbolic link to one is followed). The agent
// refuses to start otherwise, rather than take a missing folder for an empty
// cluster.
func CheckManifestDir(dir string) error {
	info, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("manifests folder %s: %w", dir, err)
	}
	if !info.IsDir() {
		return fmt.Errorf("manifests folder %s is not a directory", dir)
	}
	return nil
}

// ManifestSource feeds a proxier from a folder of manifests and follows
// changes to it: the embedded default that runs Sluice without a cluster.
//
// A folder that cannot be read is not an empty folder: while it is missing,
// unmounted or unreadable, every object stays as last read, the proxier is
// unhealthy (/healthz 503) and sluice_source_unreadable{source="manifests"} is
// 1. A file with a document that does not parse keeps the objects it held
// before until it parses again. Only files whose size or time changed are
// read again.
type ManifestSource struct {
	Dir string
	// Interval is how often the folder is checked when inotify cannot watch
	// it (default 1 s).
	Interval time.Duration
	// Recheck is how often the folder is checked anyway while inotify
	// watches it, for changes inotify does not see, such as those made on
	// another host of a network filesystem (default 30 s).
	Recheck time.Duration
	// Poll turns inotify off: the folder is checked every Interval.
	Poll bool
	Log  *slog.Logger
	// OnObjects, if set, receives every object read (the agent takes Nodes,
	// Pods, Namespaces and NetworkPolicies from it).
	OnObjects func([]Object)
	// Kinds registers kinds to read beyond client-go's and the network
	// policy API's (the agent adds Sluice's HostEndpoint).
	Kinds []func(*runtime.Scheme) error

	dec        *manifestDecoder
	files      map[string]*manifestFile // by path relative to Dir
	seen       map[string]Object        // by kind/namespace/name
	stamp      string
	unreadable error
}

func (m *ManifestSource) decoder() manifestDecoder {
	if m.dec == nil {
		d := newDecoder(m.Kinds)
		m.dec = &d
	}
	return *m.dec
}

// manifestFile is what one file gave when it was last read.
type manifestFile struct {
	stamp string // size and modification time
	objs  []Object
	errs  []error
}

// settleTime lets a burst of inotify events (an editor's save, a ConfigMap
// swap, a copy of many files) end before the folder is read.
const settleTime = 20 * time.Millisecond

// Run reads the folder, tells the proxier that Services and EndpointSlices are
// listed, and re-reads it whenever a file changes, until ctx ends.
func (m *ManifestSource) Run(ctx context.Context, p *kubeproxy.Proxier) {
	if m.Interval == 0 {
		m.Interval = time.Second
	}
	if m.Recheck == 0 {
		m.Recheck = 30 * time.Second
	}
	m.Sync(p)
	p.OnServicesSynced()
	p.OnEndpointSlicesSynced()

	var watch *folderWatch
	var changed <-chan struct{}
	period := m.Interval
	if !m.Poll {
		w, err := newFolderWatch(m.Dir)
		if err != nil {
			m.log().Warn("cannot watch the manifests folder with inotify; checking it every interval instead",
				"dir", m.Dir, "interval", m.Interval, "err", err)
		} else {
			defer w.Close()
			watch, changed, period = w, w.changed, max(m.Recheck, m.Interval)
			m.Sync(p) // whatever changed between the first read and the watch
		}
	}
	t := time.NewTicker(period)
	defer t.Stop()
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	var partial error // inotify could not watch every folder (logged once)
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			settle.Reset(settleTime)
		case <-settle.C:
			m.Sync(p)
		case <-t.C:
			m.Sync(p)
		}
		if watch == nil {
			continue
		}
		// A folder that came back or is new has no watch yet, and what
		// changed in it before the watch was not seen: look once more.
		added, err := watch.refresh()
		if err != nil && partial == nil {
			m.log().Warn("inotify cannot watch every manifests folder; some changes are seen only at the next check",
				"dir", m.Dir, "recheck", period, "err", err)
		}
		partial = err
		if added {
			settle.Reset(0)
		}
	}
}

func (m *ManifestSource) log() *slog.Logger {
	if m.Log == nil {
		return slog.Default()
	}
	return m.Log
}

// Sync re-reads what changed in the folder and sends the differences.
func (m *ManifestSource) Sync(p *kubeproxy.Proxier) {
	stamp, err := m.readFolder(p)
	m.setUnreadable(p, err)
	if err != nil || (stamp == m.stamp && m.seen != nil) {
		return
	}
	m.stamp = stamp
	next := m.objects()
	t := p.Tracker()
	for key, o := range next {
		// Objects of files that did not change are the very same values:
		// comparing pointers first spares marshalling every object of a
		// large folder when one small file changes.
		if old, ok := m.seen[key]; ok && (old.Obj == o.Obj || equalObjects(old.Obj, o.Obj)) {
			continue
		}
		switch obj := o.Obj.(type) {
		case *v1.Service:
			t.OnService(obj, false)
		case *discovery.EndpointSlice:
			if old, ok := m.seen[key]; ok {
				t.OnTransformedUpdate(old.Obj, obj)
			} else {
				t.OnEndpointSlice(obj, false)
			}
		case *v1.Node:
			if obj.Name == p.NodeName() {
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
	// ServiceCIDRs, whole on each change of the folder, as the informer
	// hands them (informer.go).
	var cidrs []string
	for _, o := range next {
		if c, ok := o.Obj.(*networkingv1.ServiceCIDR); ok {
			cidrs = append(cidrs, c.Spec.CIDRs...)
		}
	}
	p.OnServiceCIDRsChanged(cidrs)
	if p.Routes() != nil {
		var nodes []*v1.Node
		for _, o := range next {
			if n, ok := o.Obj.(*v1.Node); ok {
				nodes = append(nodes, n)
			}
		}
		p.Routes().SetNodes(nodes)
	}
	if m.OnObjects != nil {
		m.OnObjects(slices.Collect(maps.Values(next)))
	}
}

// readFolder lists the folder's manifest files and re-reads those whose size
// or time changed, logging and counting their bad documents. It returns a
// stamp of the folder, or an error when the folder cannot be read (nothing
// is changed then).
func (m *ManifestSource) readFolder(p *kubeproxy.Proxier) (string, error) {
	if err := CheckManifestDir(m.Dir); err != nil {
		return "", err
	}
	// A folder that is a symbolic link is read where it points.
	root, err := filepath.EvalSymlinks(m.Dir)
	if err != nil {
		return "", fmt.Errorf("manifests folder %s: %w", m.Dir, err)
	}
	type file struct{ rel, stamp string }
	var list []file
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// Hidden entries are not manifests: editors' swap files, and a
		// ConfigMap volume's "..data" link and timestamped folder (its
		// files are read through their links in the folder itself).
		if path != root && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() || !isManifest(path) {
			return nil
		}
		// A file that is a symbolic link is stamped by what it points to,
		// so that an edit of the target, or the link swapped, is seen.
		info, err := os.Stat(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed while listing
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		list = append(list, file{rel, fmt.Sprintf("%d %d", info.Size(), info.ModTime().UnixNano())})
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("manifests folder %s: %w", m.Dir, err)
	}
	var stamp strings.Builder
	files := make(map[string]*manifestFile, len(list))
	for _, f := range list {
		fmt.Fprintf(&stamp, "%s %s\n", f.rel, f.stamp)
		if old := m.files[f.rel]; old != nil && old.stamp == f.stamp {
			files[f.rel] = old
			continue
		}
		mf := &manifestFile{stamp: f.stamp}
		if data, err := os.ReadFile(filepath.Join(root, f.rel)); err != nil {
			mf.errs = []error{fmt.Errorf("%s: %w", f.rel, err)}
		} else {
			mf.objs, mf.errs = parseManifest(m.decoder(), f.rel, data)
		}
		for _, err := range mf.errs {
			m.log().Error("manifest document not applied; the objects this file held before are kept until it parses",
				"dir", m.Dir, "err", err)
		}
		if p.Metrics() != nil {
			p.Metrics().ManifestErrors.Add(float64(len(mf.errs)))
		}
		files[f.rel] = mf
	}
	m.files = files
	return stamp.String(), nil
}

// objects merges the files, in the order of their names: the first file that
// defines an object wins, and a second definition is logged. A file with a
// document that does not parse keeps the objects it held before.
func (m *ManifestSource) objects() map[string]Object {
	next := map[string]Object{}
	for _, rel := range slices.Sorted(maps.Keys(m.files)) {
		f := m.files[rel]
		objs := f.objs
		for _, o := range objs {
			defaultNamespace(o.Obj)
		}
		if len(f.errs) > 0 {
			read := map[string]bool{}
			for _, o := range objs {
				read[objectKey(o.Obj)] = true
			}
			for key, o := range m.seen {
				if o.File == rel && !read[key] {
					objs = append(objs, o)
				}
			}
		}
		for _, o := range objs {
			key := objectKey(o.Obj)
			if key == "" {
				continue
			}
			if first, dup := next[key]; dup {
				m.log().Error("object defined twice; the first definition is used", "dir", m.Dir,
					"object", key, "used", first.File, "ignored", o.File)
				continue
			}
			next[key] = o
		}
	}
	return next
}

// setUnreadable records the folder's state: logged when it changes, and
// reported in the proxier's health and metrics while it lasts.
func (m *ManifestSource) setUnreadable(p *kubeproxy.Proxier, err error) {
	switch {
	case err != nil && m.unreadable == nil:
		m.log().Error("manifests folder cannot be read; keeping every object as last read", "dir", m.Dir, "err", err)
	case err == nil && m.unreadable != nil:
		m.log().Info("manifests folder readable again", "dir", m.Dir)
	}
	m.unreadable = err
	p.Health.SetSourceError("manifests", err)
	if p.Metrics() != nil {
		v := 0.0
		if err != nil {
			v = 1
		}
		p.Metrics().SourceUnreadable.WithLabelValues("manifests").Set(v)
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
