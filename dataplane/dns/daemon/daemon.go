// Package daemon wires dnsd together: the cluster state source, the zone
// index, the forwarder and cache, the DNS server and the HTTP endpoints. It is
// apart from package dns so that the query path (and its fuzz test) does not
// link the Kubernetes client.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/podnet/podnet/dataplane/app"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
	"github.com/podnet/podnet/dataplane/cluster/kube"
	"github.com/podnet/podnet/dataplane/cluster/statedir"
	"github.com/podnet/podnet/dataplane/dns"
	"github.com/podnet/podnet/dataplane/runner"
	"github.com/podnet/podnet/dataplane/status"
)

// StatusSection is dnsd's section of its status board.
const StatusSection = "dns"

// Config is everything dnsd is configured with (its flags).
type Config struct {
	Listen []string
	// TCPMaxConns caps concurrent TCP connections (0: the default);
	// TCPIdleTimeout closes idle ones (0: 10 s).
	TCPMaxConns    int
	TCPIdleTimeout time.Duration
	// Drain: once told to stop, dnsd reports not ready and answers until
	// no query has come for Drain.Quiet, Drain.Max at most.
	Drain dns.DrainOptions
	// Log is query and error logging (its Logger is set by Run); the
	// config file's log section replaces it.
	Log  dns.LogOptions
	Zone dns.ZoneOptions
	// Upstreams as HOST:PORT; when empty, the nameservers of ResolvConf.
	Upstreams  []string
	ResolvConf string
	// Autopath resolves pods' search paths on the server (the domains
	// after the cluster's are ResolvConf's search line).
	Autopath bool
	Forward  dns.ForwardOptions
	Cache    dns.CacheOptions
	// NoCache turns the cache of forwarded answers off.
	NoCache bool
	// DNSServiceIP is the kube-dns VIP; an upstream there would be a loop.
	DNSServiceIP netip.Addr
	// The cluster state: StateDir, else the API server of Kubeconfig (the
	// in-cluster config when Kubeconfig is empty too).
	StateDir   string
	Kubeconfig string
	// StateLimits are what StateDir's Services are checked against.
	StateLimits convert.Limits

	// ConfigFile, when set, is the config file (dns.FileConfig), reloaded
	// when it changes.
	ConfigFile string

	MetricsAddress, ReadyAddress string
	// HealthAddress is where the daemon skeleton serves /health
	// (HealthEndpoint).
	HealthAddress string
	// Health is the daemon's health (app.Daemon serves it at
	// HealthAddress), where the DNS server puts its check; nil: one of
	// dnsd's own, served nowhere.
	Health *app.Health

	// Clock times the config file's reads; nil: the system's (tests
	// drive a runner.FakeClock).
	Clock runner.Clock
}

// Validate checks the configuration, naming the field and value at fault.
func (c *Config) Validate() error {
	if c.StateDir != "" && c.Kubeconfig != "" {
		return fmt.Errorf("state source: --state-dir %q and --kubeconfig %q both set; choose one", c.StateDir, c.Kubeconfig)
	}
	if c.Drain.Quiet < 0 || c.Drain.Max < 0 || (c.Drain.Max > 0 && c.Drain.Max < c.Drain.Quiet) {
		return fmt.Errorf("drain: --drain-quiet %v and --drain-max %v: want 0 <= quiet <= max", c.Drain.Quiet, c.Drain.Max)
	}
	if len(c.Listen) == 0 {
		return errors.New("listen: at least one address is needed")
	}
	for _, l := range c.Listen {
		if _, _, err := net.SplitHostPort(l); err != nil {
			return fmt.Errorf("listen %q: %w", l, err)
		}
	}
	for _, u := range c.Upstreams {
		if _, err := parseUpstream(u); err != nil {
			return err
		}
	}
	d := strings.Trim(c.Zone.Domain, ".")
	if d == "" || strings.Contains(d, "..") {
		return fmt.Errorf("cluster domain %q: not a domain name", c.Zone.Domain)
	}
	return nil
}

// autopathOptions is autopath's configuration, nil when it is off: the
// search domains after the cluster's are those of --resolv-conf.
func autopathOptions(cfg Config) (*dns.AutopathOptions, error) {
	if !cfg.Autopath {
		return nil, nil
	}
	search, err := dns.ReadResolvSearch(cfg.ResolvConf)
	if err != nil {
		return nil, fmt.Errorf("autopath: %w", err)
	}
	return &dns.AutopathOptions{Search: search}, nil
}

// HealthEndpoint is where the daemon skeleton serves dnsd's health, as
// CoreDNS's health plugin: /health.
func (c *Config) HealthEndpoint() app.HealthEndpoint {
	return app.HealthEndpoint{Addr: c.HealthAddress, Flag: "--health-address", Paths: []string{"/health"}}
}

func parseUpstream(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.AddrPortFrom(a, 53), nil
	}
	return netip.AddrPort{}, fmt.Errorf("upstream %q: want IP:PORT or IP", s)
}

// Run runs dnsd: the state source, the zone index, the forwarder, the DNS
// server and the HTTP endpoints. When ctx ends, /ready fails at once and
// the DNS server drains (cfg.Drain); everything else stops when it is done.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	src, err := newSource(cfg, log)
	if err != nil {
		return err
	}
	store := src.Store
	autopath, err := autopathOptions(cfg)
	if err != nil {
		return err
	}
	cfg.Zone.PodIndex = autopath != nil
	zone := dns.NewZone(store, cfg.Zone)

	file, applied, err := readConfigFile(cfg.ConfigFile)
	if err != nil {
		return err
	}
	fwd, err := newForwarder(cfg, file, log)
	if err != nil {
		return err
	}
	var cache *dns.Cache
	if !cfg.NoCache {
		cache = dns.NewCache(cfg.Cache)
	}

	reg := app.NewRegistry()
	metrics := dns.NewMetrics(reg, zone, cache, fwd)
	if src.StateDir != nil {
		statedir.RegisterMetrics(reg, src.StateDir)
	}
	srv := dns.NewServer(dns.ServerOptions{Listen: cfg.Listen, Zone: zone, Forwarder: fwd, Cache: cache, Metrics: metrics,
		TCPMaxConns: cfg.TCPMaxConns, TCPIdleTimeout: cfg.TCPIdleTimeout, Drain: cfg.Drain, Log: logOptions(cfg, file, log),
		Autopath: autopath})

	board := statusBoard(src, zone, fwd, cache, metrics)
	// The group outlives ctx: while the server drains, the forwarder, the
	// state and /ready (failing) go on.
	g := app.NewGroup(context.WithoutCancel(ctx))
	ready := &readiness{up: make(chan struct{}), stopping: ctx.Done(), zone: zone, stale: src.Stale}
	if cfg.Health == nil {
		cfg.Health = app.NewHealth()
	}
	cfg.Health.Checker.Check(HealthComponent, serverHealth(srv, ready.up))
	// Listen before anything else so a port conflict fails at start.
	if err := app.Serve(g, log,
		app.Endpoint{Name: "metrics", Addr: cfg.MetricsAddress, Flag: "--metrics-address", Path: "/metrics", Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})},
		app.Endpoint{Name: "metrics", Addr: cfg.MetricsAddress, Flag: "--metrics-address", Path: status.Path, Handler: board},
		app.Endpoint{Name: "ready", Addr: cfg.ReadyAddress, Flag: "--ready-address", Path: "/ready", Handler: ready},
	); err != nil {
		return err
	}

	serving := make(chan dns.Listening, 1)
	g.Go("cluster state", src.Run)
	g.Go("zone", func(ctx context.Context) error { zone.Run(ctx); return nil })
	g.Go("forwarder", func(ctx context.Context) error {
		return forwarding(ctx, cfg, fwd, applied, srv, metrics, cache, log)
	})
	g.Go("dns server", func(gctx context.Context) error { return serveDNS(ctx, gctx, g, srv, serving, cfg.Drain, log) })
	g.Go("free load garbage", func(ctx context.Context) error { freeLoadGarbage(ctx, zone); return nil })
	g.Go("listening", func(ctx context.Context) error {
		select {
		case l := <-serving:
			log.Info("serving DNS", "udp", fmt.Sprint(l.UDP), "tcp", fmt.Sprint(l.TCP))
			close(ready.up)
		case <-ctx.Done():
		}
		return nil
	})
	return g.Wait()
}

// statusBoard is what dnsd status prints.
func statusBoard(src app.Source, zone *dns.Zone, fwd *dns.Forwarder, cache *dns.Cache, metrics *dns.Metrics) *status.Board {
	board := &status.Board{}
	board.Provide(StatusSection, func() any {
		st := dns.Report(zone, fwd, cache, metrics)
		if err := src.Stale(); err != nil {
			st.Stale = err.Error()
		}
		if src.StateDir != nil {
			sd := src.StateDir.Status()
			st.StateDir = &sd
		}
		return st
	})
	return board
}

// serveDNS runs the DNS server until stop ends (then it drains) or the
// group fails, and ends the group once the server has returned.
func serveDNS(stop, gctx context.Context, g *app.Group, srv *dns.Server, serving chan<- dns.Listening, d dns.DrainOptions, log *slog.Logger) error {
	sctx, cancel := context.WithCancel(gctx)
	defer cancel()
	after := context.AfterFunc(stop, func() {
		if d.Quiet > 0 {
			log.Info("draining: not ready, answering until no query has come for a while", "quiet", d.Quiet, "max", d.Max)
		}
		cancel()
	})
	defer after()
	if err := srv.Run(sctx, serving); err != nil {
		return err
	}
	if d.Quiet > 0 && stop.Err() != nil {
		r := srv.Drained()
		log.Info("drained", "queries", r.Queries, "lastQuery", r.LastQuery.UTC().Format("15:04:05.000"),
			"quietFor", time.Since(r.LastQuery).Round(time.Millisecond), "unanswered", r.Unread)
	}
	g.Cancel()
	return nil
}

// HealthComponent is the DNS server's name in dnsd's health.
const HealthComponent = "dns-server"

// serverHealth is the DNS server's health check (/health): healthy while
// its sockets are served (dns.Server.Health), before it listens too (a
// slow cluster state load is /ready's business, not a reason to restart).
func serverHealth(srv *dns.Server, up <-chan struct{}) func() error {
	return func() error {
		select {
		case <-up:
			return srv.Health()
		default:
			return nil
		}
	}
}

// readiness is /ready: OK once dnsd listens and its index holds the whole
// cluster state, and while that state is not stale; failing from the moment
// dnsd is told to stop, so its endpoint stops taking new queries while it
// drains.
type readiness struct {
	up       chan struct{} // closed once the DNS server listens
	stopping <-chan struct{}
	zone     *dns.Zone
	stale    func() error
}

func (r *readiness) err() error {
	select {
	case <-r.stopping:
		return errors.New("shutting down")
	default:
	}
	select {
	case <-r.up:
	default:
		return errors.New("not listening yet")
	}
	if !r.zone.Synced() {
		if err := r.stale(); err != nil {
			return fmt.Errorf("cluster state not synced yet: %w", err)
		}
		return errors.New("cluster state not synced yet")
	}
	// Once synced, ready for good, as CoreDNS's kubernetes plugin: while
	// the API server is away the last known state is answered, and every
	// dnsd turning unready at once would empty the kube-dns Service. dnsd
	// status says the state is stale.
	return nil
}

func (r *readiness) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if err := r.err(); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "OK")
}

// freeLoadGarbage gives the memory the state's parsing left behind back
// once the index is built, rather than carry it in RSS.
func freeLoadGarbage(ctx context.Context, zone *dns.Zone) {
	select {
	case <-zone.Loaded():
	case <-ctx.Done():
		return
	}
	runtime.GC()
	debug.FreeOSMemory()
}

// newSource is the cluster state source cfg chooses.
func newSource(cfg Config, log *slog.Logger) (app.Source, error) {
	if cfg.StateDir != "" {
		return app.NewSource(app.SourceOptions{StateDir: cfg.StateDir, StateLimits: cfg.StateLimits, Logger: log})
	}
	kc, err := kube.ClientConfig(cfg.Kubeconfig)
	if err != nil {
		return app.Source{}, err
	}
	// Pods only matter to verified pod records and autopath; watching
	// every Pod of a cluster costs memory CoreDNS also saves in the other
	// modes.
	kinds := []cluster.Kind{cluster.KindService, cluster.KindEndpointSlice, cluster.KindNamespace}
	if cfg.Zone.Pods == dns.PodsVerified || cfg.Autopath {
		kinds = append(kinds, cluster.KindPod)
	}
	return app.NewSource(app.SourceOptions{Kube: kc, Kinds: kinds, Logger: log})
}
