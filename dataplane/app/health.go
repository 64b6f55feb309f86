package app

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/podnet/podnet/dataplane/health"
)

// Health is a daemon's health, part of its skeleton: the checks its parts
// contribute (Checker: a state each part sets, or a check asked at every
// request), answered on the daemon's health endpoint, which Daemon serves
// from before the daemon's run starts until it returns. Each path of the
// endpoint answers the verdict of every check, 200 "OK" or 503 naming each
// failing one, unless the daemon puts a handler of its own there (Handle:
// proxyd's /healthz and /livez answer as kube-proxy's).
type Health struct {
	Checker *health.Checker

	mu       sync.RWMutex
	handlers map[string]http.Handler
}

// NewHealth returns a Health with no checks (healthy).
func NewHealth() *Health {
	return &Health{Checker: health.NewChecker(), handlers: make(map[string]http.Handler)}
}

// Handle makes h answer path instead of the checks' verdict.
func (h *Health) Handle(path string, handler http.Handler) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.handlers[path] = handler
}

// ServeHTTP answers a health path: its handler, or the checks' verdict.
func (h *Health) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.RLock()
	handler := h.handlers[r.URL.Path]
	h.mu.RUnlock()
	if handler != nil {
		handler.ServeHTTP(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	var bad []string
	for name, err := range h.Checker.States() {
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", name, err))
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, strings.Join(bad, "\n"))
		return
	}
	fmt.Fprintln(w, "OK")
}

// HealthEndpoint is where a daemon's health is served.
type HealthEndpoint struct {
	// Addr is the address to listen on; "": not served.
	Addr string
	// Flag sets Addr, named when Addr cannot be listened on.
	Flag string
	// Paths answer the health: "/healthz" and "/livez" for proxyd,
	// "/health" for dnsd.
	Paths []string
}

// serve listens on e's address now (an error names the flag) and serves
// h on its paths in a group of its own until stop is called; the group
// ends with the server's failure.
func (e HealthEndpoint) serve(h *Health, log *slog.Logger) (*Group, error) {
	g := NewGroup(context.Background())
	var eps []Endpoint
	for _, p := range e.Paths {
		eps = append(eps, Endpoint{Name: "health", Addr: e.Addr, Flag: e.Flag, Path: p, Handler: h})
	}
	if err := Serve(g, log, eps...); err != nil {
		return nil, err
	}
	return g, nil
}

// Run is what a daemon runs once its flags are parsed.
type Run struct {
	// Health is where the daemon's health is served.
	Health HealthEndpoint
	// Main runs the daemon until ctx ends; its parts add their checks to
	// h.Checker as they are built.
	Main func(ctx context.Context, h *Health) error
}

// run serves the health endpoint, then runs Main until it returns: the
// health is answered while Main drains after ctx ended, and a health
// server that fails ends Main (its error is returned).
func (r Run) run(ctx context.Context, log *slog.Logger) error {
	h := NewHealth()
	g, err := r.Health.serve(h, log)
	if err != nil {
		return err
	}
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(g.Context(), cancel)
	err = r.Main(mctx, h)
	stop()
	g.Cancel()
	if gerr := g.Wait(); err == nil {
		err = gerr
	}
	return err
}
