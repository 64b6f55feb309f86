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

// TestCheckerCheckIsAskedEachTime: a component given by a check has the
// check's answer at every read, and Set replaces the check.
func TestCheckerCheckIsAskedEachTime(t *testing.T) {
	c := NewChecker()
	var bad error
	c.Check("service-proxy", func() error { return bad })
	if err := c.Err(); err != nil {
		t.Fatalf("check healthy: %v", err)
	}
	bad = errors.New("no successful sync for 1m0s")
	if err := c.Err(); err == nil || !strings.Contains(err.Error(), "service-proxy: no successful sync for 1m0s") {
		t.Fatalf("check turned bad, Err = %v", err)
	}
	if s := c.States(); s["service-proxy"] != bad {
		t.Fatalf("States = %v", s)
	}
	c.Set("service-proxy", nil)
	if err := c.Err(); err != nil {
		t.Fatalf("Set after Check: %v, want the set state", err)
	}
}
