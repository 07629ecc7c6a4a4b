package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-net/sluice/agent"
)

// The demo's pods in namespaces of their own (client in ops, backend-1 and
// backend-2 in shop, backend-3 in lab), a NetworkPolicy that isolates
// backend-1 and admits the ops namespace.
const adminTierPods = `apiVersion: v1
kind: Namespace
metadata: {name: ops, labels: {kubernetes.io/metadata.name: ops}}
---
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {kubernetes.io/metadata.name: shop}}
---
apiVersion: v1
kind: Namespace
metadata: {name: lab, labels: {kubernetes.io/metadata.name: lab}}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: ops, labels: {app: client}}
spec: {nodeName: sluice-demo, containers: [{name: c, image: x}]}
status: {podIP: 10.200.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: b1, namespace: shop, labels: {app: b1}}
spec: {nodeName: sluice-demo, containers: [{name: c, image: x}]}
status: {podIP: 10.201.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: b2, namespace: shop, labels: {app: b2}}
spec: {nodeName: sluice-demo, containers: [{name: c, image: x}]}
status: {podIP: 10.202.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: b3, namespace: lab, labels: {app: b3}}
spec: {nodeName: sluice-demo, containers: [{name: c, image: x}]}
status: {podIP: 10.203.0.2}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b1-from-ops, namespace: shop}
spec:
  podSelector: {matchLabels: {app: b1}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: ops}}}]}]
`

// An AdminNetworkPolicy (v1alpha1) denying ops to the whole shop namespace:
// it overrides the NetworkPolicy's allow of b1.
const anpDenyOps = `apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: no-ops-in-shop}
spec:
  priority: 10
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: shop}}}
  ingress:
  - {name: deny-ops, action: Deny, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: ops}}}]}
`

// A ClusterNetworkPolicy (v1beta1) of the Admin tier that passes ops to the
// NetworkPolicy tier before a lower-priority one denies it, and a Baseline
// one that denies ops wherever no NetworkPolicy decides.
const cnpPassAndBaseline = `apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: pass-ops}
spec:
  tier: Admin
  priority: 5
  subject: {namespaces: {}}
  ingress:
  - {action: Pass, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: ops}}}]}
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: deny-ops-later}
spec:
  tier: Admin
  priority: 50
  subject: {namespaces: {}}
  ingress:
  - {action: Deny, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: ops}}}]}
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: baseline}
spec:
  tier: Baseline
  priority: 0
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: lab}}}
  ingress:
  - {action: Deny, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: ops}}}]}
`

// The admin tiers through the agent, on real traffic from the client:
// an ANP Deny overrides a NetworkPolicy allow; a Pass falls through to the
// NetworkPolicy, which admits; a Baseline policy is the default where no
// NetworkPolicy decides, and pods neither selects stay open.
func TestAdminTiersOnRealTraffic(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	topo, cfg, manifests := demoAgentSetup(ctx, t)
	write := func(docs ...string) {
		t.Helper()
		body := adminTierPods
		for _, d := range docs {
			body += "---\n" + d
		}
		if err := os.WriteFile(filepath.Join(manifests, "tiers.yaml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write()
	a, err := agent.Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	client := topo.ns(topo.pods["client"])
	const b1, b2, b3 = "10.201.0.2:8080", "10.202.0.2:8080", "10.203.0.2:8080"

	eventually(t, "the NetworkPolicy admits ops to b1", func() bool { return reaches(client, b1) })
	write(anpDenyOps)
	eventually(t, "the ANP's Deny overrides the NetworkPolicy", func() bool { return !reaches(client, b1) })
	eventually(t, "the ANP denies b2 too (same namespace)", func() bool { return !reaches(client, b2) })
	if !reaches(client, b3) {
		t.Fatal("b3, outside the ANP's subject, refused the client")
	}

	write(cnpPassAndBaseline)
	eventually(t, "Pass falls through to the NetworkPolicy, which admits ops to b1", func() bool { return reaches(client, b1) })
	eventually(t, "b2 has no NetworkPolicy: after Pass, nothing denies", func() bool { return reaches(client, b2) })
	eventually(t, "the Baseline denies ops to b3, which no NetworkPolicy isolates", func() bool { return !reaches(client, b3) })
}
