//go:build sluice_nokube

package agent

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-net/sluice/policy/k8s"
)

// A build with the tag sluice_nokube has no Kubernetes client (client-go's
// clientset and informers are most of a first build): its agent reads a
// manifests folder (Config.Manifests) or a Source. `sluice demo` is built so.
const kubeClient = false

var errNoKubeClient = errors.New("this binary was built with the tag sluice_nokube, without a Kubernetes client: " +
	"give it a manifests folder (--manifests), or build it without the tag")

func (a *Agent) watchAPIServer(context.Context, time.Duration, func(k8s.Cluster)) error {
	return errNoKubeClient
}
