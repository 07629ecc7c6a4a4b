//go:build !sluice_nokube

package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-net/sluice/kubeproxy/policysource"
	"github.com/sluice-net/sluice/kubeproxy/source"
	"github.com/sluice-net/sluice/policy/k8s"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// kubeClient tells whether this build can watch an API server (see
// nokube.go).
const kubeClient = true

// errNoKubeClient is nokube.go's; this build never returns it.
var errNoKubeClient error

// watchAPIServer feeds the proxier and the policy from the API server's
// informers; policy updates come at most minSync apart.
func (a *Agent) watchAPIServer(ctx context.Context, minSync time.Duration, updatePolicy func(k8s.Cluster)) error {
	rc, err := a.restConfig()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	if err := source.RunInformers(ctx, client, a.Proxier, 15*time.Minute); err != nil {
		return err
	}
	policies, err := policysource.Watch(ctx, client, dyn, minSync, a.log, updatePolicy)
	if err != nil {
		return err
	}
	a.spawn(ctx, "policy informers", policies)
	return nil
}

// restConfig is how the agent reaches the API server: in-cluster, or by
// --kubeconfig/--master, with the configured rate and content type.
func (a *Agent) restConfig() (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if a.cfg.Kubeconfig == "" && a.cfg.Master == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags(a.cfg.Master, a.cfg.Kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("API server configuration: %w", err)
	}
	if a.cfg.KubeAPIQPS > 0 {
		rc.QPS = a.cfg.KubeAPIQPS
	}
	if a.cfg.KubeAPIBurst > 0 {
		rc.Burst = a.cfg.KubeAPIBurst
	}
	if a.cfg.KubeAPIContentType != "" {
		rc.ContentType = a.cfg.KubeAPIContentType
	}
	return rc, nil
}
