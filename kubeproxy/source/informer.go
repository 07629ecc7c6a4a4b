//go:build !sluice_nokube

package source

import (
	"context"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	networkinginformers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/sluice-net/sluice/kubeproxy"
)

// RunInformers feeds the proxier from the API server with shared informers, as
// kube-proxy does: Services without the service-proxy-name label,
// EndpointSlices without the headless label, this Node (every Node too,
// when Config.Routes is set), and the ServiceCIDRs. It returns once
// the informers have started; they stop with ctx.
func RunInformers(ctx context.Context, client kubernetes.Interface, p *kubeproxy.Proxier, resync time.Duration) error {
	// Services and slices have informers of their own, without the
	// namespace index a factory's informers keep for listers: the proxier
	// lists nothing, and the index held every object's key once more.
	noIndexes := cache.Indexers{}
	svcInf := coreinformers.NewFilteredServiceInformer(client, metav1.NamespaceAll, resync, noIndexes,
		func(o *metav1.ListOptions) { o.LabelSelector = "!" + kubeproxy.LabelServiceProxyName })
	sliceInf := discoveryinformers.NewFilteredEndpointSliceInformer(client, metav1.NamespaceAll, resync, noIndexes,
		func(o *metav1.ListOptions) { o.LabelSelector = "!" + kubeproxy.LabelHeadless })
	for _, inf := range []cache.SharedIndexInformer{svcInf, sliceInf} {
		if err := inf.SetTransform(p.Tracker().Transform); err != nil {
			return err
		}
	}
	// This Node only: its labels and addresses.
	nodeInf := coreinformers.NewFilteredNodeInformer(client, resync, noIndexes, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.NodeName()).String()
	})
	if err := nodeInf.SetTransform(kubeproxy.Slim); err != nil {
		return err
	}

	t := p.Tracker()
	// The proxier waits for the handlers' registrations, not the informers:
	// an informer has synced once its cache holds the initial list, while
	// its handler may still be receiving it. A first sync of part of the
	// list would delete what a restarted agent adopted for the rest.
	svcs, err := svcInf.AddEventHandler(trackerHandler(t))
	if err != nil {
		return err
	}
	slices, err := sliceInf.AddEventHandler(trackerHandler(t))
	if err != nil {
		return err
	}
	if _, err := nodeInf.AddEventHandler(handler(func(n *v1.Node, deleted bool) {
		if deleted {
			p.Health.SetNodeEligible(false)
			return
		}
		p.OnNode(n)
	})); err != nil {
		return err
	}
	run := []cache.SharedIndexInformer{svcInf, sliceInf, nodeInf}
	if cidrInf, err := serviceCIDRInformer(ctx, client, p, resync); err != nil {
		return err
	} else if cidrInf != nil {
		run = append(run, cidrInf)
	}
	if routes := p.Routes(); routes != nil {
		// Every Node, for the route lookup (the informer above sees this
		// node only).
		all := coreinformers.NewNodeInformer(client, resync, noIndexes)
		if err := all.SetTransform(kubeproxy.Slim); err != nil {
			return err
		}
		if _, err := all.AddEventHandler(handler(routes.OnNode)); err != nil {
			return err
		}
		run = append(run, all)
	}
	// Informers of their own rather than a SharedInformerFactory: the
	// factory package imports every API group's informers and listers (118
	// packages; a fifth of the CPU of sluice's first build) for four types.
	for _, inf := range run {
		go inf.RunWithContext(ctx)
	}
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), svcs.HasSynced) {
			p.OnServicesSynced()
		}
	}()
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), slices.HasSynced) {
			p.OnEndpointSlicesSynced()
		}
	}()
	return nil
}

// serviceCIDRInformer follows the ServiceCIDRs as kube-proxy watches them:
// the union of every object's CIDRs, handed over whole on each change and
// once the first list is in (so that "none" is known too). They do not hold
// up the first sync: until they are known the datapath keeps the ranges it
// has. An API server that does not serve them (before Kubernetes 1.33) gets
// no informer, whose list would fail and be retried forever: the proxier is
// told there are none, and the log says so. It returns the informer to run,
// or nil.
func serviceCIDRInformer(ctx context.Context, client kubernetes.Interface, p *kubeproxy.Proxier, resync time.Duration) (cache.SharedIndexInformer, error) {
	served, err := servesResource(client, networkingv1.SchemeGroupVersion.String(), "servicecidrs")
	switch {
	case err != nil:
		// Discovery failed, not the resource: watch anyway; the informer
		// retries as it does for Services.
		p.Log().Warn("ServiceCIDRs: discovery failed; watching them anyway", "err", err)
	case !served:
		p.Log().Info("ServiceCIDRs: the API server does not serve networking.k8s.io/v1 servicecidrs; unallocated service addresses are not refused")
		p.OnServiceCIDRsChanged(nil)
		return nil, nil
	}
	inf := networkinginformers.NewServiceCIDRInformer(client, resync, cache.Indexers{})
	var mu sync.Mutex
	cidrsByName := map[string][]string{}
	report := func() {
		mu.Lock()
		defer mu.Unlock()
		all := []string{}
		for _, cidrs := range cidrsByName {
			all = append(all, cidrs...)
		}
		p.OnServiceCIDRsChanged(all)
	}
	reg, err := inf.AddEventHandler(handler(func(c *networkingv1.ServiceCIDR, deleted bool) {
		mu.Lock()
		if deleted {
			delete(cidrsByName, c.Name)
		} else {
			cidrsByName[c.Name] = c.Spec.CIDRs
		}
		mu.Unlock()
		report()
	}))
	if err != nil {
		return nil, err
	}
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			report()
		}
	}()
	return inf, nil
}

// servesResource tells whether the API server serves resource in groupVersion.
func servesResource(client kubernetes.Interface, groupVersion, resource string) (bool, error) {
	list, err := client.Discovery().ServerResourcesForGroupVersion(groupVersion)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, r := range list.APIResources {
		if r.Name == resource {
			return true, nil
		}
	}
	return false, nil
}

// trackerHandler hands a Tracker its informers' events, with the object
// before an update.
func trackerHandler(t *kubeproxy.Tracker) cache.ResourceEventHandlerFuncs {
	h := handler(t.OnTransformed)
	h.UpdateFunc = t.OnTransformedUpdate
	return h
}

// handler adapts typed add/update/delete callbacks, unwrapping tombstones.
func handler[T any](on func(obj T, deleted bool)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { callTyped(o, false, on) },
		UpdateFunc: func(_, o any) { callTyped(o, false, on) },
		DeleteFunc: func(o any) {
			if tomb, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = tomb.Obj
			}
			callTyped(o, true, on)
		},
	}
}

func callTyped[T any](o any, deleted bool, on func(T, bool)) {
	if typed, ok := o.(T); ok {
		on(typed, deleted)
		return
	}
	panic(fmt.Sprintf("informer delivered %T", o))
}
