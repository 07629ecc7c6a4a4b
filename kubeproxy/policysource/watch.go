//go:build !sluice_nokube

package policysource

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/sluice-net/sluice/kubeproxy"
	"github.com/sluice-net/sluice/policy/k8s"
	v1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	coreinformers "k8s.io/client-go/informers/core/v1"
	networkinginformers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	npav1alpha1 "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	npav1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// adminPolicyResources are the network policy API's kinds and Sluice's
// HostEndpoint, custom resources a cluster serves once their CRDs are
// installed.
var adminPolicyResources = []schema.GroupVersionResource{
	npav1beta1.SchemeGroupVersion.WithResource("clusternetworkpolicies"),
	npav1alpha1.SchemeGroupVersion.WithResource("adminnetworkpolicies"),
	npav1alpha1.SchemeGroupVersion.WithResource("baselineadminnetworkpolicies"),
	k8s.SchemeGroupVersion.WithResource("hostendpoints"),
}

// servedResources lists which of resources the API server serves.
func servedResources(d discovery.DiscoveryInterface, resources []schema.GroupVersionResource) ([]schema.GroupVersionResource, error) {
	var out []schema.GroupVersionResource
	for _, r := range resources {
		list, err := d.ServerResourcesForGroupVersion(r.GroupVersion().String())
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("discovering %s: %w", r.GroupVersion(), err)
		}
		if slices.ContainsFunc(list.APIResources, func(a metav1.APIResource) bool { return a.Name == r.Resource }) {
			out = append(out, r)
		}
	}
	return out, nil
}

// addAdminPolicies adds what a dynamic informer holds to c: the typed
// objects typedTransform made. An object still unstructured is converted
// here, or named in the error when it does not convert.
func addAdminPolicies(c *k8s.Cluster, r schema.GroupVersionResource, items []any) error {
	for _, item := range items {
		if u, ok := item.(*unstructured.Unstructured); ok {
			typed, err := typedAdminPolicy(r, u)
			if err != nil {
				return fmt.Errorf("%s %s: %w", r.Resource, u.GetName(), err)
			}
			item = typed
		}
		addObject(c, item)
	}
	return nil
}

// typedAdminPolicy converts a dynamic informer's object to its typed kind.
func typedAdminPolicy(r schema.GroupVersionResource, u *unstructured.Unstructured) (any, error) {
	var obj any
	switch r.Resource {
	case "clusternetworkpolicies":
		obj = &npav1beta1.ClusterNetworkPolicy{}
	case "adminnetworkpolicies":
		obj = &npav1alpha1.AdminNetworkPolicy{}
	case "baselineadminnetworkpolicies":
		obj = &npav1alpha1.BaselineAdminNetworkPolicy{}
	case "hostendpoints":
		obj = &k8s.HostEndpoint{}
	default:
		return nil, fmt.Errorf("resource %s is not an admin policy", r.Resource)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// typedTransform is a dynamic informer's transform: its cache keeps each
// object converted once, as it arrives, so that every translation is given
// the same object while it does not change (the translator keeps its work
// for the objects it saw before). One that does not convert stays as it
// is, and addAdminPolicies reports it.
func typedTransform(r schema.GroupVersionResource) cache.TransformFunc {
	return func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil
		}
		typed, err := typedAdminPolicy(r, u)
		if err != nil {
			return u, nil
		}
		if m, err := meta.Accessor(typed); err == nil {
			m.SetManagedFields(nil) // the translation never reads them
		}
		return typed, nil
	}
}

// Watch follows Pods, Namespaces, NetworkPolicies, Nodes and, where the API
// server serves them, ClusterNetworkPolicies, AdminNetworkPolicies,
// BaselineAdminNetworkPolicies and HostEndpoints: those whose CRDs are
// installed when it starts, and those installed later (discovery is asked
// again after CRDPollInterval, then at doubling intervals up to CRDPollMax,
// until all are followed; no restart needed). It
// returns the loop that hands them to update: once the caches are synced,
// and again on changes, coalesced by the shim's bounded-frequency runner (at
// most every minInterval: DefaultMinInterval when 0, none when negative; and
// every 15 minutes anyway). dyn may be nil: then NetworkPolicy only.
func Watch(ctx context.Context, client kubernetes.Interface, dyn dynamic.Interface, minInterval time.Duration, log *slog.Logger, update func(k8s.Cluster)) (func() error, error) {
	if minInterval == 0 {
		minInterval = DefaultMinInterval
	}
	// The caches keep what the translation reads: they hold every Pod of
	// the cluster. Informers of their own, not a SharedInformerFactory
	// (whose package imports every API group's informers), and without
	// indexes: the translation lists each kind whole.
	const resync = 15 * time.Minute
	noIndexes := cache.Indexers{}
	pods := coreinformers.NewPodInformer(client, metav1.NamespaceAll, resync, noIndexes)
	nss := coreinformers.NewNamespaceInformer(client, resync, noIndexes)
	pols := networkinginformers.NewNetworkPolicyInformer(client, metav1.NamespaceAll, resync, noIndexes)
	nodes := coreinformers.NewNodeInformer(client, resync, noIndexes) // what ClusterNetworkPolicies' nodes peers select
	toRun := []cache.SharedIndexInformer{pods, nss, pols, nodes}
	for _, inf := range toRun {
		if err := inf.SetTransform(k8s.Slim); err != nil {
			return nil, err
		}
	}
	var served []schema.GroupVersionResource
	if dyn != nil {
		var err error
		if served, err = servedResources(client.Discovery(), adminPolicyResources); err != nil {
			return nil, err
		}
		if len(served) == 0 {
			log.Info("the API server serves no ClusterNetworkPolicy, AdminNetworkPolicy or BaselineAdminNetworkPolicy (CRDs not installed); NetworkPolicy only until they are")
		}
	}
	// admin holds the admin policy informers a translation reads: those of
	// the start, and each one added later once its cache is synced (a
	// translation never sees half of a kind).
	var mu sync.Mutex
	admin := map[schema.GroupVersionResource]cache.SharedIndexInformer{}
	runner := kubeproxy.NewRunner(func() error {
		var c k8s.Cluster
		var err error
		if c.Pods, err = listAs[*v1.Pod](pods); err == nil {
			if c.Namespaces, err = listAs[*v1.Namespace](nss); err == nil {
				if c.Policies, err = listAs[*netv1.NetworkPolicy](pols); err == nil {
					c.Nodes, err = listAs[*v1.Node](nodes)
				}
			}
		}
		mu.Lock()
		for _, r := range adminPolicyResources {
			if inf, ok := admin[r]; ok && err == nil {
				err = addAdminPolicies(&c, r, inf.GetStore().List())
			}
		}
		mu.Unlock()
		if err != nil {
			return fmt.Errorf("listing policy inputs: %w", err) // retried with backoff
		}
		update(c)
		return nil
	}, minInterval, 15*time.Minute)
	informerOf := func(r schema.GroupVersionResource) (cache.SharedIndexInformer, error) {
		inf := dynamicInformer(dyn.Resource(r), resync)
		if err := inf.SetTransform(typedTransform(r)); err != nil {
			return nil, err
		}
		if _, err := inf.AddEventHandler(changeTrigger(runner.Trigger)); err != nil {
			return nil, err
		}
		return inf, nil
	}
	synced := []cache.InformerSynced{}
	for _, inf := range toRun {
		if _, err := inf.AddEventHandler(changeTrigger(runner.Trigger)); err != nil {
			return nil, err
		}
		synced = append(synced, inf.HasSynced)
	}
	for _, r := range served {
		inf, err := informerOf(r)
		if err != nil {
			return nil, err
		}
		admin[r] = inf
		synced = append(synced, inf.HasSynced)
		toRun = append(toRun, inf)
		log.Info("following admin network policies", "resource", r.String())
	}
	for _, inf := range toRun {
		go inf.RunWithContext(ctx)
	}
	// followLater asks discovery for the kinds not followed yet, and
	// follows those now served.
	followLater := func() (done bool) {
		var missing []schema.GroupVersionResource
		mu.Lock()
		for _, r := range adminPolicyResources {
			if _, ok := admin[r]; !ok {
				missing = append(missing, r)
			}
		}
		mu.Unlock()
		if len(missing) == 0 {
			return true
		}
		now, err := servedResources(client.Discovery(), missing)
		if err != nil {
			log.Debug("discovery of admin network policy CRDs", "err", err)
			return false
		}
		for _, r := range now {
			inf, err := informerOf(r)
			if err != nil {
				log.Error("following admin network policies installed after start", "resource", r.String(), "err", err)
				continue
			}
			go inf.RunWithContext(ctx)
			if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
				return true
			}
			mu.Lock()
			admin[r] = inf
			mu.Unlock()
			log.Info("following admin network policies: their CRD was installed after the agent started", "resource", r.String())
			runner.Trigger()
		}
		return len(now) == len(missing)
	}
	return func() error {
		if !cache.WaitForCacheSync(ctx.Done(), synced...) {
			return ctx.Err()
		}
		if dyn != nil {
			go func() {
				// The interval doubles up to CRDPollMax: a chart that
				// installs the CRDs beside the agent is followed within
				// seconds, and a cluster that never installs one costs
				// its API server a few requests per node every 5 minutes.
				interval := CRDPollInterval
				t := time.NewTimer(interval)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-t.C:
						if followLater() {
							return
						}
						interval = min(2*interval, max(CRDPollMax, CRDPollInterval))
						t.Reset(interval)
					}
				}
			}()
		}
		runner.Trigger()
		runner.Run(ctx)
		return nil
	}, nil
}

// listAs lists an informer's cache, whose objects are all of type T.
func listAs[T any](inf cache.SharedIndexInformer) ([]T, error) {
	objs := inf.GetStore().List()
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		t, ok := o.(T)
		if !ok {
			return nil, fmt.Errorf("informer cache holds %T, not %T", o, t)
		}
		out = append(out, t)
	}
	return out, nil
}

// dynamicInformer follows one resource of the dynamic client, as
// unstructured objects (Watch's transform types them).
func dynamicInformer(res dynamic.NamespaceableResourceInterface, resync time.Duration) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformerWithOptions(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return res.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return res.Watch(ctx, o)
		},
	}, &unstructured.Unstructured{}, cache.SharedIndexInformerOptions{ResyncPeriod: resync})
}

// CRDPollInterval is how long Watch waits before it first asks the API
// server again whether a network policy CRD it does not follow yet has been
// installed; each later ask waits twice as long, up to CRDPollMax.
var (
	CRDPollInterval = 10 * time.Second
	CRDPollMax      = 5 * time.Minute
)

// changeTrigger calls trigger for every change of an object the translation
// reads, except the Pod, Namespace and Node updates it cannot be altered by
// (k8s.PodChangeMatters, NamespaceChangeMatters, NodeChangeMatters): in a
// live cluster most Pod and Node updates are statuses,
// and each informer resync updates every object unchanged, while each
// translation goes over the whole cluster's policies.
func changeTrigger(trigger func()) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { trigger() },
		UpdateFunc: func(old, new any) {
			switch o := old.(type) {
			case *v1.Pod:
				if n, ok := new.(*v1.Pod); ok && !k8s.PodChangeMatters(o, n) {
					return
				}
			case *v1.Namespace:
				if n, ok := new.(*v1.Namespace); ok && !k8s.NamespaceChangeMatters(o, n) {
					return
				}
			case *v1.Node:
				if n, ok := new.(*v1.Node); ok && !k8s.NodeChangeMatters(o, n) {
					return
				}
			}
			trigger()
		},
		DeleteFunc: func(any) { trigger() },
	}
}
