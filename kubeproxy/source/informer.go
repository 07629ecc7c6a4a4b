package source

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
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
	slim := informers.WithTransform(kubeproxy.Slim)
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(client, resync, slim,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.NodeName()).String()
		}))

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
	nodeInf := nodeFactory.Core().V1().Nodes().Informer()
	if _, err := nodeInf.AddEventHandler(handler(func(n *v1.Node, deleted bool) {
		if deleted {
			p.Health.SetNodeEligible(false)
			return
		}
		p.OnNode(n)
	})); err != nil {
		return err
	}
	// ServiceCIDRs, as kube-proxy watches them: the union of every object's
	// CIDRs, handed over whole on each change. They do not hold up the
	// first sync: without them only unallocated addresses are not refused.
	cidrFactory := informers.NewSharedInformerFactoryWithOptions(client, resync)
	cidrsByName := map[string][]string{}
	if _, err := cidrFactory.Networking().V1().ServiceCIDRs().Informer().AddEventHandler(handler(func(c *networkingv1.ServiceCIDR, deleted bool) {
		if deleted {
			delete(cidrsByName, c.Name)
		} else {
			cidrsByName[c.Name] = c.Spec.CIDRs
		}
		var all []string
		for _, cidrs := range cidrsByName {
			all = append(all, cidrs...)
		}
		p.OnServiceCIDRsChanged(all)
	})); err != nil {
		return err
	}
	factories := []informers.SharedInformerFactory{nodeFactory, cidrFactory}
	if routes := p.Routes(); routes != nil {
		// Every Node, for the route lookup (the factory above sees this
		// node only).
		all := informers.NewSharedInformerFactoryWithOptions(client, resync, slim)
		if _, err := all.Core().V1().Nodes().Informer().AddEventHandler(handler(routes.OnNode)); err != nil {
			return err
		}
		factories = append(factories, all)
	}
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	go svcInf.Run(ctx.Done())
	go sliceInf.Run(ctx.Done())
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
