// Package app is the skeleton podnet's daemons (proxyd's agent, dnsd) run
// on: the command line, logger and signals (Daemon), the metrics registry,
// the cluster state from one of its two sources, a group of goroutines
// that stop together when one fails, and HTTP endpoints that are listened
// on before anything starts, so a port conflict fails the daemon at once.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
	"github.com/podnet/podnet/dataplane/cluster/kube"
	"github.com/podnet/podnet/dataplane/cluster/statedir"
)

// SourceOptions choose the cluster state source.
type SourceOptions struct {
	// StateDir, when set, is the directory of Kubernetes objects to read;
	// else Kube is the API server.
	StateDir string
	// StateLimits are what StateDir's objects are checked against.
	StateLimits convert.Limits
	Kube        *rest.Config
	// Kinds the API server source watches; nil: kube.DefaultKinds.
	Kinds  []cluster.Kind
	Logger *slog.Logger
}

// Source is a cluster state source feeding Store.
type Source struct {
	Store *cluster.Store
	// Run feeds Store until ctx ends.
	Run func(context.Context) error
	// Stale says why the state may be out of date (the API server is
	// away) or, before the Store is synced, why it is not loaded yet (a
	// state file that cannot be read whole); nil when it is current.
	Stale func() error
	// FileErrors counts the state files that do not parse; nil for the
	// API server.
	FileErrors func() int
	// StateDir is the state directory source; nil for the API server.
	StateDir *statedir.Source
}

// NewSource returns the source o chooses, feeding a new Store. It starts
// nothing.
func NewSource(o SourceOptions) (Source, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	store := cluster.NewStore()
	if o.StateDir != "" {
		src := statedir.New(statedir.Options{Dir: o.StateDir, Store: store, Limits: o.StateLimits, Logger: o.Logger.With("source", "state-dir")})
		return Source{Store: store, Run: src.Run, Stale: src.Err,
			FileErrors: func() int { return len(src.FileErrors()) }, StateDir: src}, nil
	}
	if o.Kube == nil {
		return Source{}, errors.New("no cluster state source: set a state directory or an API server")
	}
	src := kube.New(kube.Options{Config: o.Kube, Store: store, Kinds: o.Kinds, Logger: o.Logger.With("source", "kubernetes")})
	return Source{Store: store, Run: src.Run, Stale: src.Err}, nil
}

// Group runs goroutines that stop together: the first to fail (while the
// context is live) cancels the others, and Wait returns its error.
type Group struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	err    error
}

// NewGroup returns a Group whose goroutines get ctx, cancelled when one of
// them fails or Cancel is called.
func NewGroup(ctx context.Context) *Group {
	g := &Group{}
	g.ctx, g.cancel = context.WithCancel(ctx)
	return g
}

// Context is the context the group's goroutines get.
func (g *Group) Context() context.Context { return g.ctx }

// Go runs f; an error it returns while the group is live ends the group
// and is reported as "name: err".
func (g *Group) Go(name string, f func(context.Context) error) {
	g.wg.Go(func() {
		if err := f(g.ctx); err != nil && g.ctx.Err() == nil {
			g.Fail(fmt.Errorf("%s: %w", name, err))
		}
	})
}

// Fail ends the group with err (the first error wins).
func (g *Group) Fail(err error) {
	g.once.Do(func() { g.err = err })
	g.cancel()
}

// Cancel ends the group without an error.
func (g *Group) Cancel() { g.cancel() }

// Wait waits for every goroutine to return, then returns the error that
// ended the group, nil when its context ended.
func (g *Group) Wait() error {
	g.wg.Wait()
	g.cancel()
	return g.err
}

// Endpoint is one HTTP endpoint: handlers by path on an address. Endpoints
// with the same address share one listener.
type Endpoint struct {
	Name string // for errors and logs: "healthz", "metrics"
	Addr string // "" disables
	// Flag sets Addr ("--healthz-bind-address"): named when Addr cannot be
	// listened on, so a port taken by another daemon (kube-proxy's 10256
	// beside proxyd) says how to move it.
	Flag    string
	Path    string
	Handler http.Handler
}

// listenError names the endpoint, its address and port, and the flag that
// moves it.
func listenError(ep Endpoint, err error) error {
	what := fmt.Sprintf("listen %s on %s", ep.Name, ep.Addr)
	if _, port, perr := net.SplitHostPort(ep.Addr); perr == nil {
		what += " (port " + port
		if ep.Flag != "" {
			what += "; " + ep.Flag + " moves it"
		}
		what += ")"
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s: the port is taken, by another daemon on this node?: %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Serve listens on every endpoint's address now, returning the first
// failure (naming the endpoint and address) before any is served; then
// serves them in g until its context ends.
func Serve(g *Group, log *slog.Logger, eps ...Endpoint) error {
	type server struct {
		ln   net.Listener
		mux  *http.ServeMux
		name string
	}
	var servers []*server
	byAddr := make(map[string]*server)
	fail := func(err error) error {
		for _, s := range servers {
			s.ln.Close()
		}
		return err
	}
	for _, ep := range eps {
		if ep.Addr == "" {
			continue
		}
		s := byAddr[ep.Addr]
		if s == nil {
			ln, err := net.Listen("tcp", ep.Addr)
			if err != nil {
				return fail(listenError(ep, err))
			}
			s = &server{ln: ln, mux: http.NewServeMux(), name: ep.Name}
			byAddr[ep.Addr] = s
			servers = append(servers, s)
		}
		s.mux.Handle(ep.Path, ep.Handler)
		if log != nil {
			log.Info("serving", "what", ep.Name, "addr", s.ln.Addr().String(), "path", ep.Path)
		}
	}
	for _, s := range servers {
		hs := &http.Server{Handler: s.mux, ReadHeaderTimeout: 5 * time.Second}
		g.Go(s.name, func(ctx context.Context) error {
			go func() { <-ctx.Done(); hs.Close() }()
			if err := hs.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	return nil
}
