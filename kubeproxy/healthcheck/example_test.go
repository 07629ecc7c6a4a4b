package healthcheck_test

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/sluice-net/sluice/kubeproxy/healthcheck"
)

// /healthz answers as kube-proxy's does, 200 or 503 with a JSON body, and
// says more: a source that cannot be read makes it 503 (the node may serve
// a stale state), a warning keeps it 200 and is listed.
func ExampleProxyHealth() {
	h := healthcheck.NewProxyHealth(time.Minute)
	code := func() int {
		rec := httptest.NewRecorder()
		h.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		return rec.Code
	}
	fmt.Println("fresh:", code())
	h.SetSourceError("manifests", errors.New("folder /m: no such file or directory"))
	fmt.Println("a source gone:", code())
	h.SetSourceError("manifests", nil)
	h.Warn("pins", "in a bpffs that goes with the agent")
	fmt.Println("a warning:", code())
	// Output:
	// fresh: 200
	// a source gone: 503
	// a warning: 200
}
