// Command kube-proxy is the upstream kube-proxy, built from k8s.io/kubernetes
// at the version matching client-go, for the benchmark baselines.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	os.Exit(cli.Run(app.NewProxyCommand()))
}
