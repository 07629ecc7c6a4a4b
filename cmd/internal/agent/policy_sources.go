package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-net/sluice/kubeproxy"
	"github.com/sluice-net/sluice/policy/k8s"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	npav1alpha1 "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
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
		case *npav1beta1.ClusterNetworkPolicy:
			c.ClusterNetworkPolicies = append(c.ClusterNetworkPolicies, x)
		case *npav1alpha1.AdminNetworkPolicy:
			c.AdminNetworkPolicies = append(c.AdminNetworkPolicies, x)
		case *npav1alpha1.BaselineAdminNetworkPolicy:
			c.BaselineAdminNetworkPolicies = append(c.BaselineAdminNetworkPolicies, x)
		}
	}
	return c
}

// policyInformers follows Pods, Namespaces and NetworkPolicies and returns
// the loop that translates them: once the caches are synced, and again on
// changes, coalesced by the shim's bounded-frequency runner (at most every
// 200 ms, and every 15 minutes anyway).
func policyInformers(ctx context.Context, client kubernetes.Interface, feed *policyFeed) (func() error, error) {
	f := informers.NewSharedInformerFactory(client, 15*time.Minute)
	pods, nss, pols := f.Core().V1().Pods(), f.Core().V1().Namespaces(), f.Networking().V1().NetworkPolicies()
	runner := kubeproxy.NewRunner(func() error {
		var c k8s.Cluster
		var err error
		if c.Pods, err = pods.Lister().List(labels.Everything()); err == nil {
			if c.Namespaces, err = nss.Lister().List(labels.Everything()); err == nil {
				c.Policies, err = pols.Lister().List(labels.Everything())
			}
		}
		if err != nil {
			return fmt.Errorf("listing policy inputs: %w", err) // retried with backoff
		}
		feed.Update(c)
		return nil
	}, 200*time.Millisecond, 15*time.Minute)
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { runner.Trigger() },
		UpdateFunc: func(any, any) { runner.Trigger() },
		DeleteFunc: func(any) { runner.Trigger() },
	}
	for _, inf := range []cache.SharedIndexInformer{pods.Informer(), nss.Informer(), pols.Informer()} {
		if _, err := inf.AddEventHandler(poke); err != nil {
			return nil, err
		}
	}
	f.Start(ctx.Done())
	return func() error {
		if !cache.WaitForCacheSync(ctx.Done(), pods.Informer().HasSynced, nss.Informer().HasSynced, pols.Informer().HasSynced) {
			return ctx.Err()
		}
		runner.Trigger()
		runner.Run(ctx)
		return nil
	}, nil
}
