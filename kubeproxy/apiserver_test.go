package kubeproxy_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-net/sluice/kubeproxy"
	"github.com/sluice-net/sluice/kubeproxy/apiservertest"
	"github.com/sluice-net/sluice/kubeproxy/source"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Against a real kube-apiserver and etcd: the maps follow Services and
// EndpointSlices created, scaled, retyped and deleted through the API.
func TestAgainstRealAPIServer(t *testing.T) {
	s := apiservertest.Start(t)
	e := newEnv(t, kubeproxy.Config{})
	ctx := context.Background()
	if err := source.RunInformers(ctx, s.Client, e.p, 0); err != nil {
		t.Fatal(err)
	}
	follow := func(what string, cond func() bool) {
		t.Helper()
		start := time.Now()
		e.eventually(what, cond)
		t.Logf("%s: followed in %v", what, time.Since(start).Round(time.Millisecond))
	}
	services := s.Client.CoreV1().Services("default")
	slices := s.Client.DiscoveryV1().EndpointSlices("default")

	if _, err := services.Create(ctx, svc("web", "10.96.5.10"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := slices.Create(ctx, endpointSlice("web", "web-1", "10.2.0.1", "10.2.0.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	follow("create", func() bool { return e.frontends()["10.96.5.10:80/6"].Count == 2 })

	if _, err := slices.Update(ctx, endpointSlice("web", "web-1", "10.2.0.1", "10.2.0.2", "10.2.0.3", "10.2.0.4"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	follow("scale up", func() bool { return e.frontends()["10.96.5.10:80/6"].Count == 4 })

	web, err := services.Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	web.Spec.Type = v1.ServiceTypeNodePort
	if web, err = services.Update(ctx, web, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodePort := web.Spec.Ports[0].NodePort
	if nodePort == 0 {
		t.Fatal("API server allocated no NodePort")
	}
	follow("type change to NodePort", func() bool {
		fe := e.frontends()
		return fe["10.0.0.1:"+itoa(nodePort)+"/6"].Count == 4 && fe["255.255.255.255:"+itoa(nodePort)+"/6"].Count == 4
	})

	if err := services.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	follow("delete", func() bool {
		_, ok := e.frontends()["10.96.5.10:80/6"]
		return !ok
	})
}

// The first sync programs the whole initial list, not the part of it the
// proxier's handlers had received when the informers' caches were full: a
// partial first sync would delete, for the rest, what a restarted agent
// adopted from the maps.
func TestFirstSyncProgramsTheWholeInitialList(t *testing.T) {
	s := apiservertest.Start(t)
	ctx := context.Background()
	const n = 2000
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				name := fmt.Sprintf("s%d", i)
				if _, err := s.Client.CoreV1().Services("default").Create(ctx, svc(name, "", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil }),
					metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
				ip := fmt.Sprintf("10.2.%d.%d", i>>8, i&0xff)
				if _, err := s.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, endpointSlice(name, name+"-1", ip), metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, kubeproxy.Config{})
	if err := source.RunInformers(ctx, s.Client, e.p, 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.p.Programmed():
	case <-time.After(2 * time.Minute):
		t.Fatal("no sync programmed the initial list")
	}
	balanced := 0
	for key, fe := range e.frontends() {
		if strings.HasSuffix(key, ":80/6") && fe.Count == 1 {
			balanced++
		}
	}
	if balanced != n {
		t.Fatalf("the first sync programmed %d of the %d Services with their endpoint", balanced, n)
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }
