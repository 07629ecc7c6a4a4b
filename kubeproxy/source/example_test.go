package source_test

import (
	"fmt"
	"testing/fstest"

	"github.com/sluice-net/sluice/kubeproxy/source"
)

// A folder of manifests is read as kubectl would apply it: many objects a
// file, split at ---; what does not parse is reported, naming the file,
// and the rest still counts.
func ExampleReadManifests() {
	folder := fstest.MapFS{
		"web.yaml": {Data: []byte(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {clusterIP: 10.96.7.7, ports: [{port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.1.0.7]}]
ports: [{port: 8080}]
`)},
		"broken.yaml": {Data: []byte("apiVersion: v1\nkind: Service\nmetadata: [not, a, map]\n")},
	}
	objs, errs := source.ReadManifests(folder)
	for _, o := range objs {
		fmt.Println(o.File, o.Obj.GetObjectKind().GroupVersionKind().Kind)
	}
	fmt.Println(len(errs), "error")
	// Output:
	// web.yaml Service
	// web.yaml EndpointSlice
	// 1 error
}
