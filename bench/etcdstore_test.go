package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// etcdTxnOps is how many writes go in one etcd transaction: etcd's default
// bound (--max-txn-ops).
const etcdTxnOps = 128

// storeServicesWithEndpoints writes what createServicesWithEndpoints
// creates, straight into the API server's etcd: each Service with its
// ClusterIP (from the first address of scaleServiceCIDR past 10.64.4.0)
// and that address's IPAddress object, as the API server's allocator would
// have written them, and its EndpointSlice. The API server's watch cache
// follows etcd, so watchers (the proxies) see them arrive as created. The
// server-side fields the API server would add (managedFields for kubectl's
// and the controller's field managers) are copied from a Service and a
// slice created through it first. Through the API server, 100,000 Services
// would take about two hours: each ClusterIP allocation walks every
// IPAddress object (bench/README.md).
//
// Objects are written as JSON, which the API server reads beside the
// protobuf it writes itself.
func (e *baselineEnv) storeServicesWithEndpoints(b *testing.B, n, perService int) {
	b.Helper()
	ctx := context.Background()
	// The templates: created through the API server, then deleted.
	tmplSvc, err := manifestService(n)
	if err != nil {
		b.Fatal(err)
	}
	tmplSvc.Name = "template"
	created, err := e.api.Client.CoreV1().Services("default").Create(ctx, tmplSvc, metav1.CreateOptions{FieldManager: "kubectl-client-side-apply"})
	if err != nil {
		b.Fatal(err)
	}
	tmplSlice := controllerSlice(n, perService)
	tmplSlice.Name, tmplSlice.Labels["kubernetes.io/service-name"] = "template-1", "template"
	createdSlice, err := e.api.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, tmplSlice, metav1.CreateOptions{FieldManager: "endpointslice-controller"})
	if err != nil {
		b.Fatal(err)
	}
	if err := e.api.Client.DiscoveryV1().EndpointSlices("default").Delete(ctx, "template-1", metav1.DeleteOptions{}); err != nil {
		b.Fatal(err)
	}
	if err := e.api.Client.CoreV1().Services("default").Delete(ctx, "template", metav1.DeleteOptions{}); err != nil {
		b.Fatal(err)
	}

	c, err := clientv3.New(clientv3.Config{Endpoints: []string{e.api.EtcdURL}, DialTimeout: 10 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return e.api.Dial(ctx, "tcp", addr)
		})}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()

	first := netip.MustParseAddr("10.64.4.0").As4()
	base := uint32(first[0])<<24 | uint32(first[1])<<16 | uint32(first[2])<<8 | uint32(first[3])
	now := metav1.Now()
	var ops []clientv3.Op
	flush := func() {
		if len(ops) == 0 {
			return
		}
		if _, err := c.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.Fatalf("etcd: %v", err)
		}
		ops = ops[:0]
	}
	put := func(key string, obj any) {
		data, err := json.Marshal(obj)
		if err != nil {
			b.Fatal(err)
		}
		ops = append(ops, clientv3.OpPut(key, string(data)))
		if len(ops) == etcdTxnOps {
			flush()
		}
	}
	for i := range n {
		a := base + uint32(i)
		ip := netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}).String()
		svc, err := manifestService(i)
		if err != nil {
			b.Fatal(err)
		}
		svc.UID, svc.CreationTimestamp, svc.ManagedFields = serviceUID(i), now, created.ManagedFields
		// The spec as the API server defaulted the template's, with this
		// Service's selector and address.
		spec := created.Spec.DeepCopy()
		spec.Selector, spec.ClusterIP, spec.ClusterIPs = svc.Spec.Selector, ip, []string{ip}
		svc.Spec = *spec
		addr := &networking.IPAddress{TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "IPAddress"},
			ObjectMeta: metav1.ObjectMeta{Name: ip, UID: svc.UID + "-ip", CreationTimestamp: now, Labels: map[string]string{
				networking.LabelIPAddressFamily: string(v1.IPv4Protocol), networking.LabelManagedBy: "ipallocator.k8s.io"}},
			Spec: networking.IPAddressSpec{ParentRef: &networking.ParentReference{Resource: "services", Namespace: "default", Name: svc.Name}}}
		s := controllerSlice(i, perService)
		s.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
		s.UID, s.CreationTimestamp, s.Generation, s.ManagedFields = svc.UID+"-slice", now, 1, createdSlice.ManagedFields
		put("/registry/ipaddresses/"+ip, addr)
		put("/registry/services/specs/default/"+svc.Name, svc)
		put("/registry/endpointslices/default/"+s.Name, s)
	}
	flush()

	// What was written reads back through the API server.
	last := fmt.Sprintf("m%d", n-1)
	got, err := e.api.Client.CoreV1().Services("default").Get(ctx, last, metav1.GetOptions{})
	if err != nil || got.Spec.ClusterIP == "" || !strings.HasPrefix(got.Spec.ClusterIP, "10.") {
		b.Fatalf("Service %s written to etcd, read back: %v, %v", last, got, err)
	}
}
