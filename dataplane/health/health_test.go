package health

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestChecker(t *testing.T) {
	c := NewChecker()
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, _ := get(); code != http.StatusOK {
		t.Fatalf("no components: %d", code)
	}
	c.Set("routes", errors.New("node has no podCIDR"))
	c.Set("service-proxy", nil)
	code, body := get()
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "routes: node has no podCIDR") || strings.Contains(body, "service-proxy") {
		t.Fatalf("one unhealthy component: %d %q", code, body)
	}
	c.Set("service-proxy", errors.New("no sync"))
	if err := c.Err(); err == nil || !strings.Contains(err.Error(), "routes") || !strings.Contains(err.Error(), "service-proxy") {
		t.Fatalf("Err does not name both: %v", err)
	}
	c.Set("routes", nil)
	c.Set("service-proxy", nil)
	if code, body := get(); code != http.StatusOK || strings.TrimSpace(body) != "ok" {
		t.Fatalf("recovered: %d %q", code, body)
	}
}
