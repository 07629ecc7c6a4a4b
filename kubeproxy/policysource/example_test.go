package policysource_test

import (
	"fmt"
	"testing/fstest"

	"github.com/sluice-net/sluice/kubeproxy/policysource"
	"github.com/sluice-net/sluice/kubeproxy/source"
)

// A folder of manifests, as `sluice agent --manifests` reads it: the
// policy inputs are picked out of its objects (the Service is not one).
func ExampleFromObjects() {
	folder := fstest.MapFS{"demo.yaml": {Data: []byte(`
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: demo, labels: {app: web}}
status: {podIP: 10.1.0.5}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-friends, namespace: demo}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: friend}}}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec: {ports: [{port: 80}]}
`)}}
	objs, errs := source.ReadManifests(folder)
	if len(errs) != 0 {
		fmt.Println(errs)
		return
	}
	c := policysource.FromObjects(objs)
	fmt.Println(len(c.Namespaces), "namespace,", len(c.Pods), "pod,", len(c.Policies), "policy:", c.Policies[0].Name)
	// Output: 1 namespace, 1 pod, 1 policy: web-from-friends
}
