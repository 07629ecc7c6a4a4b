// Package healthcheck serves kube-proxy's health endpoints: the proxy's own
// /healthz and /livez (ProxyHealth) and one health-check NodePort per
// Service with externalTrafficPolicy Local (ServiceHealth), with the bodies
// kube-proxy writes, so load balancers and probes read Sluice as they read
// kube-proxy. It owns those listeners and nothing else.
package healthcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// ProxyHealth is kube-proxy's health model: healthy unless an update has been
// queued and not applied for longer than the timeout (2 × syncPeriod). An idle
// proxy stays healthy. /healthz is also unhealthy while the Node is being
// deleted.
type ProxyHealth struct {
	mu           sync.Mutex
	timeout      time.Duration
	lastQueued   time.Time
	lastUpdated  time.Time
	nodeEligible bool
	sourceErrs   map[string]string // source -> why it cannot be read
	repairs      map[string]repairBody
	warnings     map[string]string // part -> what is wrong that no restart or resync fixes
	now          func() time.Time
	onRequest    func(path string, code int)
}

// NewProxyHealth returns a health model with the given timeout.
func NewProxyHealth(timeout time.Duration) *ProxyHealth {
	return &ProxyHealth{timeout: timeout, nodeEligible: true, now: time.Now}
}

// QueuedUpdate records that a change waits to be applied (the first one counts).
func (h *ProxyHealth) QueuedUpdate() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lastQueued.IsZero() || !h.lastUpdated.Before(h.lastQueued) {
		h.lastQueued = h.now()
	}
}

// Updated records a successful sync.
func (h *ProxyHealth) Updated() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastUpdated = h.now()
}

// SetNodeEligible records whether the Node is usable (false while it is being
// deleted).
func (h *ProxyHealth) SetNodeEligible(ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeEligible = ok
}

// SetSourceError records that a source of objects (the manifests folder),
// or a part of the dataplane (the interfaces' programs), is not right, or
// (nil) that it is again. /healthz answers 503 while any is not, with the
// reasons in its body: the node serves a state that may be stale or
// incomplete and must not look fine. /livez does not: restarting the agent
// would not fix them.
func (h *ProxyHealth) SetSourceError(source string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		delete(h.sourceErrs, source)
		return
	}
	if h.sourceErrs == nil {
		h.sourceErrs = map[string]string{}
	}
	h.sourceErrs[source] = err.Error()
}

// Repaired records that a part of the dataplane removed behind the agent's
// back (a map pin, an interface's attachment) was put back. /healthz stays
// 200, since the node is whole again, but lists every kind of repair with its
// count, its last time and what it was, so that tampering shows there and not
// only in the log.
func (h *ProxyHealth) Repaired(kind, what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.repairs == nil {
		h.repairs = map[string]repairBody{}
	}
	r := h.repairs[kind]
	r.Count++
	r.Last, r.What = h.now().String(), what
	h.repairs[kind] = r
}

// Warn records that a part of the node's setup is wrong in a way that does
// not stop serving but that a person must fix (pins in a bpffs that goes with
// the agent's mount namespace). /healthz stays 200, since traffic flows, and
// lists it under warnings; an empty what clears it.
func (h *ProxyHealth) Warn(part, what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if what == "" {
		delete(h.warnings, part)
		return
	}
	if h.warnings == nil {
		h.warnings = map[string]string{}
	}
	h.warnings[part] = what
}

// OnRequest calls fn with the path and status code of every request served
// (the proxier counts /healthz answers in a metric). Set it before serving.
func (h *ProxyHealth) OnRequest(fn func(path string, code int)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onRequest = fn
}

// Live reports kube-proxy's own rule alone (no update waits too long),
// without the source errors: what the Services' health-check NodePorts
// report, since traffic still flows from the last good state and one pod's
// interface must not take a node out of every load balancer.
func (h *ProxyHealth) Live() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.live(h.now())
}

// Healthy reports the proxy's health, as of now.
func (h *ProxyHealth) Healthy() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.healthy(h.now())
}

func (h *ProxyHealth) healthy(now time.Time) bool {
	return len(h.sourceErrs) == 0 && h.live(now)
}

// live is kube-proxy's rule alone: no update waits too long. /livez uses it:
// restarting the agent does not bring a missing folder back.
func (h *ProxyHealth) live(now time.Time) bool {
	pending := !h.lastQueued.IsZero() && h.lastUpdated.Before(h.lastQueued)
	return !pending || now.Sub(h.lastQueued) < h.timeout
}

type healthBody struct {
	LastUpdated  string                `json:"lastUpdated"`
	CurrentTime  string                `json:"currentTime"`
	NodeEligible *bool                 `json:"nodeEligible,omitempty"`
	SourceErrors map[string]string     `json:"sourceErrors,omitempty"`
	Repairs      map[string]repairBody `json:"repairs,omitempty"`
	Warnings     map[string]string     `json:"warnings,omitempty"`
}

type repairBody struct {
	Count int    `json:"count"`
	Last  string `json:"last"`
	What  string `json:"what"`
}

// Handler serves /healthz and /livez.
func (h *ProxyHealth) Handler() http.Handler {
	mux := http.NewServeMux()
	serve := func(withNode bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			h.mu.Lock()
			now := h.now()
			ok := h.live(now)
			body := healthBody{LastUpdated: h.lastUpdated.String(), CurrentTime: now.String()}
			if len(h.sourceErrs) > 0 {
				body.SourceErrors = maps.Clone(h.sourceErrs)
			}
			if len(h.repairs) > 0 {
				body.Repairs = maps.Clone(h.repairs)
			}
			if len(h.warnings) > 0 {
				body.Warnings = maps.Clone(h.warnings)
			}
			if withNode {
				eligible := h.nodeEligible
				body.NodeEligible = &eligible
				ok = ok && eligible && len(h.sourceErrs) == 0
			}
			onRequest := h.onRequest
			h.mu.Unlock()
			code := http.StatusOK
			if !ok {
				code = http.StatusServiceUnavailable
			}
			if onRequest != nil {
				onRequest(r.URL.Path, code)
			}
			writeJSON(w, code, body)
		}
	}
	mux.HandleFunc("/healthz", serve(true))
	mux.HandleFunc("/livez", serve(false))
	return mux
}

func writeJSON(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

// ServiceHealth serves one health-check NodePort per externalTrafficPolicy
// Local service: 200 while the service has local endpoints and the proxy is
// healthy, 503 otherwise, with kube-proxy's JSON body. Load balancers use it
// to send traffic only to nodes with local endpoints.
type ServiceHealth struct {
	mu        sync.Mutex
	bindIP    string
	proxy     *ProxyHealth
	log       *slog.Logger
	listeners map[uint16]*svcListener
}

type svcListener struct {
	name   types.NamespacedName
	local  int
	server *http.Server
}

// NewServiceHealth serves health-check NodePorts on bindIP ("" = every address).
func NewServiceHealth(bindIP string, proxy *ProxyHealth, log *slog.Logger) *ServiceHealth {
	return &ServiceHealth{bindIP: bindIP, proxy: proxy, log: log, listeners: map[uint16]*svcListener{}}
}

// HealthCheck is one service's health-check NodePort and local endpoint count
// (distinct local ready endpoint IPs).
type HealthCheck struct {
	Service        types.NamespacedName
	Port           uint16
	LocalEndpoints int
}

// Sync opens listeners for new health-check ports, closes those of services
// that no longer have one, and updates the counts.
func (s *ServiceHealth) Sync(checks []HealthCheck) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := map[uint16]HealthCheck{}
	for _, c := range checks {
		want[c.Port] = c
	}
	for port, l := range s.listeners {
		if c, ok := want[port]; !ok || c.Service != l.name {
			_ = l.server.Close()
			delete(s.listeners, port)
		}
	}
	var errs []error
	for port, c := range want {
		if l, ok := s.listeners[port]; ok {
			l.local = c.LocalEndpoints
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(s.bindIP, strconv.Itoa(int(port))))
		if err != nil {
			errs = append(errs, fmt.Errorf("health check port %d of service %s: %w", port, c.Service, err))
			continue
		}
		l := &svcListener{name: c.Service, local: c.LocalEndpoints}
		l.server = &http.Server{Handler: s.handler(l), ReadHeaderTimeout: 5 * time.Second}
		s.listeners[port] = l
		go func() {
			if err := l.server.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Warn("health check server stopped", "port", port, "err", err)
			}
		}()
	}
	return errors.Join(errs...)
}

func (s *ServiceHealth) handler(l *svcListener) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		local := l.local
		s.mu.Unlock()
		healthy := s.proxy.Live()
		code := http.StatusServiceUnavailable
		if local > 0 && healthy {
			code = http.StatusOK
		}
		writeJSON(w, code, map[string]any{
			"service":             map[string]string{"namespace": l.name.Namespace, "name": l.name.Name},
			"localEndpoints":      local,
			"serviceProxyHealthy": healthy,
		})
	})
}

// Close stops every listener.
func (s *ServiceHealth) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for port, l := range s.listeners {
		_ = l.server.Close()
		delete(s.listeners, port)
	}
}

// Ports lists the open health-check ports.
func (s *ServiceHealth) Ports() []uint16 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []uint16
	for p := range s.listeners {
		out = append(out, p)
	}
	return out
}
