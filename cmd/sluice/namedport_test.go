package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-net/sluice/agent"
)

// The demo's pods in three namespaces: db (backend-1) in data; the client in
// ops; two web pods (backend-2 names 8080 "http", backend-3 names 9999 so)
// in web. Container ports carry no protocol, as users write them.
const namedPortPods = `apiVersion: v1
kind: Namespace
metadata: {name: data}
---
apiVersion: v1
kind: Namespace
metadata: {name: ops, labels: {team: OPS_TEAM}}
---
apiVersion: v1
kind: Namespace
metadata: {name: web}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: ops, labels: {role: CLIENT_ROLE}}
spec: {nodeName: sluice-demo, containers: [{name: c, image: x}]}
status: {podIP: 10.200.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: db, namespace: data, labels: {tier: db}}
spec: {nodeName: sluice-demo, containers: [{name: c, image: x, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: 10.201.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: web-2, namespace: web, labels: {app: web}}
spec: {nodeName: sluice-demo, containers: [{name: c, image: x, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: 10.202.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: web-3, namespace: web, labels: {app: web}}
spec: {nodeName: sluice-demo, containers: [{name: c, image: x, ports: [{name: http, containerPort: WEB3_PORT}]}]}
status: {podIP: 10.203.0.2}
`

// The report of issue 22, on real traffic: db admits the ops team's admins
// on its port named http.
const dbAdmins = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-admins, namespace: data}
spec:
  podSelector: {matchLabels: {tier: db}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: ops}}, podSelector: {matchLabels: {role: admin}}}]
    ports: [{protocol: TCP, port: http}]
`

// The client may reach web pods of any namespace on their port named http.
const clientToWeb = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-out, namespace: ops}
spec:
  podSelector: {matchLabels: {role: admin}}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {}, podSelector: {matchLabels: {app: web}}}]
    ports: [{port: http}]
`

// Named ports through the agent, both directions, following relabels and a
// pod whose port changes: the policies are written once, the pods and
// namespaces change under them.
func TestNamedPortsFollowPodsAndLabels(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	topo, cfg, manifests := demoAgentSetup(ctx, t)
	write := func(team, role, web3Port string, policies ...string) {
		t.Helper()
		pods := strings.NewReplacer("OPS_TEAM", team, "CLIENT_ROLE", role, "WEB3_PORT", web3Port).Replace(namedPortPods)
		if err := os.WriteFile(filepath.Join(manifests, "named.yaml"), []byte(pods+"---\n"+strings.Join(policies, "---\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("dev", "guest", "9999", dbAdmins)
	a, err := agent.Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	client := topo.ns(topo.pods["client"])

	eventually(t, "db refuses a guest of another team", func() bool { return !reaches(client, "10.201.0.2:8080") })
	write("ops", "admin", "9999", dbAdmins)
	eventually(t, "db admits an admin of the ops team on its port named http", func() bool { return reaches(client, "10.201.0.2:8080") })
	write("ops", "guest", "9999", dbAdmins)
	eventually(t, "db refuses the client once it is no admin", func() bool { return !reaches(client, "10.201.0.2:8080") })

	write("ops", "admin", "9999", dbAdmins, clientToWeb)
	eventually(t, "egress: web-2 on the 8080 it names http", func() bool { return reaches(client, "10.202.0.2:8080") })
	eventually(t, "egress: not web-3 on 8080, which it does not name http", func() bool { return !reaches(client, "10.203.0.2:8080") })
	if reaches(client, "10.201.0.2:8080") {
		t.Fatal("egress: the client reached db, which its egress policy does not name")
	}
	write("ops", "admin", "8080", dbAdmins, clientToWeb)
	eventually(t, "egress: web-3 once it names 8080 http", func() bool { return reaches(client, "10.203.0.2:8080") })
}
