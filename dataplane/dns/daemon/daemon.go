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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/podnet/podnet/dataplane/app"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
	"github.com/podnet/podnet/dataplane/cluster/kube"
	"github.com/podnet/podnet/dataplane/dns"
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
	Zone           dns.ZoneOptions
	// Upstreams as HOST:PORT; when empty, the nameservers of ResolvConf.
	Upstreams  []string
	ResolvConf string
	Forward    dns.ForwardOptions
	Cache      dns.CacheOptions
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

	MetricsAddress, HealthAddress, ReadyAddress string
}

// Validate checks the configuration, naming the field and value at fault.
func (c *Config) Validate() error {
	if c.StateDir != "" && c.Kubeconfig != "" {
		return fmt.Errorf("state source: --state-dir %q and --kubeconfig %q both set; choose one", c.StateDir, c.Kubeconfig)
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

func parseUpstream(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.AddrPortFrom(a, 53), nil
	}
	return netip.AddrPort{}, fmt.Errorf("upstream %q: want IP:PORT or IP", s)
}

// Run runs dnsd until ctx ends: the state source, the zone index, the
// forwarder, the DNS server and the HTTP endpoints.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	src, err := newSource(cfg, log)
	if err != nil {
		return err
	}
	store := src.Store
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

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := dns.NewMetrics(reg, zone, cache, fwd)
	srv := dns.NewServer(dns.ServerOptions{Listen: cfg.Listen, Zone: zone, Forwarder: fwd, Cache: cache, Metrics: metrics,
		TCPMaxConns: cfg.TCPMaxConns, TCPIdleTimeout: cfg.TCPIdleTimeout})

	board := &status.Board{}
	board.Provide(StatusSection, func() any {
		st := dns.Report(zone, fwd, cache, metrics)
		if err := src.Stale(); err != nil {
			st.Stale = err.Error()
		}
		return st
	})
	g := app.NewGroup(ctx)
	ready := &readiness{up: make(chan struct{}), zone: zone, stale: src.Stale}
	// Listen before anything else so a port conflict fails at start.
	if err := app.Serve(g, log,
		app.Endpoint{Name: "metrics", Addr: cfg.MetricsAddress, Path: "/metrics", Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})},
		app.Endpoint{Name: "metrics", Addr: cfg.MetricsAddress, Path: status.Path, Handler: board},
		app.Endpoint{Name: "health", Addr: cfg.HealthAddress, Path: "/health", Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "OK") })},
		app.Endpoint{Name: "ready", Addr: cfg.ReadyAddress, Path: "/ready", Handler: ready},
	); err != nil {
		return err
	}

	serving := make(chan dns.Listening, 1)
	g.Go("cluster state", src.Run)
	g.Go("zone", func(ctx context.Context) error { zone.Run(ctx); return nil })
	g.Go("forwarder", func(ctx context.Context) error {
		return forwarding(ctx, cfg, fwd, applied, srv, metrics, cache, log)
	})
	g.Go("dns server", func(ctx context.Context) error { return srv.Run(ctx, serving) })
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

// readiness is /ready: OK once dnsd listens and its index holds the whole
// cluster state, and while that state is not stale.
type readiness struct {
	up    chan struct{} // closed once the DNS server listens
	zone  *dns.Zone
	stale func() error
}

func (r *readiness) err() error {
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
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !zone.Synced() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
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
	// Pods only matter to verified pod records; watching every Pod of a
	// cluster costs memory CoreDNS also saves in the other modes.
	kinds := []cluster.Kind{cluster.KindService, cluster.KindEndpointSlice, cluster.KindNamespace}
	if cfg.Zone.Pods == dns.PodsVerified {
		kinds = append(kinds, cluster.KindPod)
	}
	return app.NewSource(app.SourceOptions{Kube: kc, Kinds: kinds, Logger: log})
}
