package kube

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// refusing fails the first n round trips as a stopped API server does.
type refusing struct {
	n     int
	calls int
}

func (r *refusing) RoundTrip(req *http.Request) (*http.Response, error) {
	r.calls++
	if r.calls <= r.n {
		return nil, syscall.ECONNREFUSED
	}
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("{}")), Request: req}, nil
}

func TestObserverRetriesWatchesAndReportsStaleness(t *testing.T) {
	s := New(Options{})
	rt := &refusing{n: 2}
	o := observer{rt: rt, s: s}
	req, _ := http.NewRequest(http.MethodGet, "https://api/api/v1/services?watch=true&resourceVersion=5", nil)
	start := time.Now()
	resp, err := o.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("watch: %v, %v; want it retried until the server answers", resp, err)
	}
	if rt.calls != 3 {
		t.Errorf("%d round trips, want 3", rt.calls)
	}
	if d := time.Since(start); d < 2*watchRetry {
		t.Errorf("retried after %v, want a pause of %v between tries", d, watchRetry)
	}
	if err := s.Err(); err != nil {
		t.Errorf("Err after the server answered: %v", err)
	}

	// A list fails at once (the informer retries it) and leaves the state
	// marked stale.
	rt = &refusing{n: 1}
	o = observer{rt: rt, s: s}
	req, _ = http.NewRequest(http.MethodGet, "https://api/api/v1/services", nil)
	if _, err := o.RoundTrip(req); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("list: %v, want the refusal", err)
	}
	if err := s.Err(); err == nil || !strings.Contains(err.Error(), "stale") {
		t.Errorf("Err after a refused list: %v, want staleness", err)
	}

	// A watch whose caller gives up ends with the caller.
	rt = &refusing{n: 1000}
	o = observer{rt: rt, s: s}
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, "https://api/api/v1/services?watch=true", nil)
	if _, err := o.RoundTrip(req); err == nil {
		t.Fatal("watch of a cancelled caller succeeded")
	}
	if rt.calls > 4 {
		t.Errorf("%d tries in 1.2 s, want one per %v", rt.calls, watchRetry)
	}
}
