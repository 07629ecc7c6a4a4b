// Package apiservertest runs a real kube-apiserver backed by a real etcd on
// loopback, for integration tests and benchmarks. The kube-apiserver binary is
// built from k8s.io/kubernetes at the version matching client-go by the
// test-only module test/kubernetes (.ci/run builds it and sets
// SLUICE_KUBE_APISERVER); etcd comes from Debian's etcd-server package.
package apiservertest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-net/sluice/gen/bpftest"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// BinaryEnv names the environment variable holding the kube-apiserver path.
const BinaryEnv = "SLUICE_KUBE_APISERVER"

// Server is a running API server.
type Server struct {
	URL    string
	Config *rest.Config
	Client kubernetes.Interface
	Dir    string // kubeconfig and logs live here
	// Kubeconfig is a kubeconfig file for the server (a system:masters token).
	Kubeconfig string
	// EtcdURL is the server's etcd, reached with Dial: a test may write
	// objects straight into the store there (the server's watch cache
	// follows it), where creating them through the server would take too
	// long (each ClusterIP allocation walks every IPAddress object: N
	// Services cost O(N²)).
	EtcdURL string
	token   string
	ns      *bpftest.NetNS
}

// Dial connects from the server's namespace: the socket is made on a thread
// inside it (client-go's transport dials from goroutines of its own).
func (s *Server) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if s.ns == nil {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	var c net.Conn
	err := s.ns.Do(func() (err error) { c, err = (&net.Dialer{}).DialContext(ctx, network, addr); return err })
	return c, err
}

// Binaries returns the kube-apiserver and etcd paths, or why they are missing.
func Binaries() (apiserver, etcd string, err error) {
	apiserver = os.Getenv(BinaryEnv)
	if apiserver == "" {
		return "", "", fmt.Errorf("%s is not set (build test/kubernetes; .ci/run does)", BinaryEnv)
	}
	if _, err := os.Stat(apiserver); err != nil {
		return "", "", fmt.Errorf("kube-apiserver: %w", err)
	}
	if etcd, err = exec.LookPath("etcd"); err != nil {
		return "", "", fmt.Errorf("etcd not found (apt-get install etcd-server): %w", err)
	}
	return apiserver, etcd, nil
}

// Require skips tb when the binaries are missing, or fails it under
// SLUICE_REQUIRE_BPF=1, like every other environment-dependent test.
func Require(tb testing.TB) (apiserver, etcd string) {
	tb.Helper()
	a, e, err := Binaries()
	if err != nil {
		if bpftest.Required() {
			tb.Fatalf("API server integration cannot run: %v", err)
		}
		tb.Skipf("skipping API server integration: %v", err)
	}
	return a, e
}

func freePort(tb testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func start(tb testing.TB, ns *bpftest.NetNS, dir, name string, args ...string) {
	StartProcess(tb, ns, filepath.Join(dir, name+".log"), args...)
}

// StartProcess runs args (inside ns when not nil) with output to logPath until
// the test ends: then SIGTERM, and SIGKILL after 10 s. It returns the
// process (the command itself: ip netns exec execs it).
func StartProcess(tb testing.TB, ns *bpftest.NetNS, logPath string, args ...string) *os.Process {
	tb.Helper()
	name := filepath.Base(logPath)
	log, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	if ns != nil {
		args = append([]string{"ip", "netns", "exec", ns.Name}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	// No Pdeathsig: it fires when the forking OS thread exits, and Go retires
	// threads (namespace helpers lock and discard them). Cleanup stops it.
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", name, err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		log.Close()
	})
	return cmd.Process // ip netns exec execs the command: this is its process
}

// etcdDataDir is where etcd keeps its data: in memory (/dev/shm) where the
// machine has room there (etcd preallocates 64 MB write-ahead log files),
// as a test's cluster needs no durability and etcd's fsyncs on a disk slow
// every write; else under the test's own folder.
func etcdDataDir(tb testing.TB, dir string) string {
	var fs syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &fs); err != nil || fs.Bavail*uint64(fs.Bsize) < 1<<30 {
		return filepath.Join(dir, "etcd")
	}
	d, err := os.MkdirTemp("/dev/shm", "sluice-etcd-")
	if err != nil {
		return filepath.Join(dir, "etcd")
	}
	tb.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// Start runs etcd and kube-apiserver on loopback until the test ends.
func Start(tb testing.TB) *Server { return StartIn(tb, nil) }

// An Option changes how StartIn starts the API server.
type Option func(*options)

type options struct{ serviceCIDR string }

// ServiceCIDR sets the range ClusterIPs are drawn from (default
// 10.96.0.0/16, 65,534 Services): a test of more Services needs a wider
// one, up to the /12 the API server accepts.
func ServiceCIDR(prefix string) Option { return func(o *options) { o.serviceCIDR = prefix } }

// StartIn runs them on the loopback of a test's network namespace (nil: the
// current one). The client dials through sockets made inside it.
func StartIn(tb testing.TB, ns *bpftest.NetNS, opts ...Option) *Server {
	tb.Helper()
	o := options{serviceCIDR: "10.96.0.0/16"}
	for _, opt := range opts {
		opt(&o)
	}
	apiserver, etcd := Require(tb)
	dir := tb.TempDir()
	clientPort, peerPort, apiPort := freePort(tb), freePort(tb), freePort(tb)
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	etcdDir := etcdDataDir(tb, dir)
	start(tb, ns, dir, "etcd", etcd, "--data-dir", etcdDir, "--name", "sluice",
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "sluice="+peerURL, "--log-level", "warn")

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		tb.Fatal(err)
	}
	keyFile := filepath.Join(dir, "sa.key")
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(keyFile, pemKey, 0o600); err != nil {
		tb.Fatal(err)
	}
	// A static token in system:masters: the simplest credential the server
	// accepts (anonymous requests are refused by this version's defaults).
	token := fmt.Sprintf("sluice-%d", apiPort)
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(token+",sluice-test,sluice-test,system:masters\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	start(tb, ns, dir, "kube-apiserver", apiserver, "--token-auth-file", tokenFile,
		"--etcd-servers", etcdURL, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(apiPort), "--cert-dir", filepath.Join(dir, "certs"),
		"--service-cluster-ip-range", o.serviceCIDR, "--service-node-port-range", "30000-32767",
		"--authorization-mode", "AlwaysAllow",
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", keyFile,
		"--service-account-signing-key-file", keyFile, "--enable-priority-and-fairness=false",
		"--disable-admission-plugins", "ServiceAccount", "--endpoint-reconciler-type", "none")

	s := &Server{URL: "https://127.0.0.1:" + strconv.Itoa(apiPort), Dir: dir, token: token, ns: ns, EtcdURL: etcdURL}
	s.Config = &rest.Config{Host: s.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 1000, Burst: 2000,
		Dial: s.Dial}
	if s.Client, err = kubernetes.NewForConfig(s.Config); err != nil {
		tb.Fatal(err)
	}
	s.Kubeconfig = filepath.Join(dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q, insecure-skip-tls-verify: true}}]
contexts: [{name: test, context: {cluster: test, user: sluice-test}}]
users: [{name: sluice-test, user: {token: %q}}]
current-context: test
`, s.URL, token)
	if err := os.WriteFile(s.Kubeconfig, []byte(kc), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := s.waitReady(90 * time.Second); err != nil {
		logs, _ := os.ReadFile(filepath.Join(dir, "kube-apiserver.log"))
		if len(logs) > 4000 {
			logs = logs[len(logs)-4000:]
		}
		tb.Fatalf("kube-apiserver not ready: %v\n%s", err, logs)
	}
	return s
}

func (s *Server) waitReady(timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: s.Dial, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+s.token)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("readyz: %s", resp.Status)
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return last
}

// CRD is a CustomResourceDefinition of a cluster-scoped kind whose objects
// may hold any content (the tests write valid ones): enough for an informer
// to follow it. Create it with the dynamic client, then WaitServed.
func CRD(r schema.GroupVersionResource, kind string) *unstructured.Unstructured {
	meta := map[string]any{"name": r.Resource + "." + r.Group}
	if strings.HasSuffix(r.Group, ".k8s.io") {
		// k8s.io groups need it; the project's own CRDs carry the URL of its API review.
		meta["annotations"] = map[string]any{"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/network-policy-api/pull/347"}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": meta,
		"spec": map[string]any{
			"group": r.Group, "scope": "Cluster",
			"names": map[string]any{"plural": r.Resource, "kind": kind},
			"versions": []any{map[string]any{"name": r.Version, "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}}
}
