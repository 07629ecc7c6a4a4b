package healthcheck

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestHealthWarnings checks that a warning shows in /healthz without making
// it fail (traffic flows; a person must act), and goes when cleared.
func TestHealthWarnings(t *testing.T) {
	h := NewProxyHealth(time.Minute)
	get := func() (int, healthBody) {
		rec := httptest.NewRecorder()
		h.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		var body healthBody
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("/healthz body %q: %v", rec.Body, err)
		}
		return rec.Code, body
	}
	h.Warn("pins", "mounted privately")
	code, body := get()
	if code != http.StatusOK || body.Warnings["pins"] != "mounted privately" {
		t.Fatalf("with a warning: %d %+v, want 200 naming it", code, body)
	}
	h.Warn("pins", "")
	if code, body = get(); code != http.StatusOK || body.Warnings != nil {
		t.Fatalf("cleared: %d %+v, want 200 without warnings", code, body)
	}
}
