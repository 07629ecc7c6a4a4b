package agent

import (
	"context"
	"log/slog"
	"time"

	"github.com/sluice-net/sluice/kubeproxy"
	"github.com/sluice-net/sluice/policy/k8s"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// clusterOf picks the policy inputs out of a folder's objects.
func clusterOf(objs []kubeproxy.Object) k8s.Cluster {
	var c k8s.Cluster
	for _, o := range objs {
		switch x := o.Obj.(type) {
		case *v1.Pod:
			c.Pods = append(c.Pods, x)
		case *v1.Namespace:
			c.Namespaces = append(c.Namespaces, x)
		case *netv1.NetworkPolicy:
			c.Policies = append(c.Policies, x)
		}
	}
	return c
}

// runPolicyInformers follows Pods, Namespaces and NetworkPolicies; changes are
// gathered for a moment and translated together.
func runPolicyInformers(ctx context.Context, client kubernetes.Interface, feed *policyFeed, log *slog.Logger) error {
	f := informers.NewSharedInformerFactory(client, 15*time.Minute)
	pods, nss, pols := f.Core().V1().Pods(), f.Core().V1().Namespaces(), f.Networking().V1().NetworkPolicies()
	trigger := make(chan struct{}, 1)
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify(trigger) },
		UpdateFunc: func(any, any) { notify(trigger) },
		DeleteFunc: func(any) { notify(trigger) },
	}
	for _, inf := range []cache.SharedIndexInformer{pods.Informer(), nss.Informer(), pols.Informer()} {
		if _, err := inf.AddEventHandler(poke); err != nil {
			return err
		}
	}
	f.Start(ctx.Done())
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), pods.Informer().HasSynced, nss.Informer().HasSynced, pols.Informer().HasSynced) {
			return
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-trigger:
			}
			time.Sleep(200 * time.Millisecond) // gather a burst of changes
			var c k8s.Cluster
			var err error
			if c.Pods, err = pods.Lister().List(labels.Everything()); err == nil {
				if c.Namespaces, err = nss.Lister().List(labels.Everything()); err == nil {
					c.Policies, err = pols.Lister().List(labels.Everything())
				}
			}
			if err != nil {
				log.Error("listing policy inputs", "err", err)
				continue
			}
			feed.Update(c)
		}
	}()
	notify(trigger)
	return nil
}

func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
