package health

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestProgressAsKubeProxy(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	reg := prometheus.NewRegistry()
	p := NewProgress(time.Minute, reg)
	p.now = func() time.Time { return now }
	get := func(h http.Handler) (int, map[string]any) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("body %q: %v", rec.Body, err)
		}
		return rec.Code, body
	}
	step := func(d time.Duration) { now = now.Add(d) }

	// Nothing queued: healthy for ever, however long since the last sync
	// (an API server that is away sends no changes).
	step(time.Hour)
	if code, body := get(p.Healthz()); code != 200 || body["nodeEligible"] != true || body["currentTime"] != body["lastUpdated"] {
		t.Errorf("idle proxy: %d %v, want 200 with lastUpdated = currentTime", code, body)
	}
	// A change waits; within the timeout still healthy, past it not.
	p.Queued()
	step(59 * time.Second)
	if code, _ := get(p.Livez()); code != 200 {
		t.Errorf("change pending 59 s of 60: %d, want 200", code)
	}
	taken := now
	step(2 * time.Second)
	p.Queued() // arrives while the sync that took the first one runs
	if code, body := get(p.Healthz()); code != 503 || body["lastUpdated"] == body["currentTime"] {
		t.Errorf("change pending 61 s: %d %v, want 503 with the last update time", code, body)
	}
	// The sync succeeds; the change that came after it is measured anew.
	p.Updated(taken)
	if s := p.State(); !s.Healthy || s.Pending != 0 {
		t.Errorf("after the sync: %+v, want healthy with the later change just queued", s)
	}
	step(61 * time.Second)
	if code, _ := get(p.Healthz()); code != 503 {
		t.Errorf("later change pending 61 s: %d, want 503", code)
	}
	p.Updated(now)
	if code, _ := get(p.Healthz()); code != 200 {
		t.Errorf("everything synced: %d, want 200", code)
	}
	for _, c := range []struct {
		vec  *prometheus.CounterVec
		code string
		want float64
	}{{p.healthz, "200", 2}, {p.healthz, "503", 2}, {p.livez, "200", 1}} {
		if got := testutil.ToFloat64(c.vec.WithLabelValues(c.code)); got != c.want {
			t.Errorf("probe counter %s: %v, want %v", c.code, got, c.want)
		}
	}
}

func TestProgressNodeLeaving(t *testing.T) {
	p := NewProgress(time.Minute, nil)
	code := func(h http.Handler) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		return rec.Code
	}
	p.SetNodeLeaving(true)
	if code(p.Healthz()) != 503 || code(p.Livez()) != 200 {
		t.Errorf("node leaving: /healthz %d, /livez %d; want 503 (load balancers move away) and 200 (no restart)", code(p.Healthz()), code(p.Livez()))
	}
	p.SetNodeLeaving(false)
	if code(p.Healthz()) != 200 {
		t.Errorf("node back: /healthz %d, want 200", code(p.Healthz()))
	}
}

func TestProgressNotesDoNotFail(t *testing.T) {
	p := NewProgress(time.Minute, nil)
	c := NewChecker()
	p.Note(c)
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		p.Healthz().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	c.Set("cluster-state", nil)
	if code, body := get(); code != 200 || strings.Contains(body, "notes") {
		t.Errorf("all components ok: %d %q; want 200 without notes", code, body)
	}
	c.Set("cluster-state", errors.New("state/svc.yaml:3: not parsed"))
	code, body := get()
	if code != 200 {
		t.Errorf("a noted component failing changed the verdict: %d, want 200", code)
	}
	var got struct {
		Notes map[string]string `json:"notes"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil || got.Notes["cluster-state"] != "state/svc.yaml:3: not parsed" {
		t.Errorf("/healthz body %q (%v); want notes naming the cluster state's error", body, err)
	}
}
