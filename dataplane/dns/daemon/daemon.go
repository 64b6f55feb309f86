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
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/kube"
	"github.com/podnet/podnet/dataplane/cluster/convert"
	"github.com/podnet/podnet/dataplane/cluster/statedir"
	"github.com/podnet/podnet/dataplane/dns"
)

// Config is everything dnsd is configured with (its flags).
type Config struct {
	Listen []string
	Zone   dns.ZoneOptions
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	store := cluster.NewStore()
	var runSource func(context.Context) error
	// stale reports why the cluster state may be out of date (the API
	// server is away); the state dir is never stale.
	stale := func() error { return nil }
	if cfg.StateDir != "" {
		runSource = statedir.New(statedir.Options{Dir: cfg.StateDir, Store: store, Limits: cfg.StateLimits, Logger: log.With("source", "state-dir")}).Run
	} else {
		kc, err := kube.ClientConfig(cfg.Kubeconfig)
		if err != nil {
			return err
		}
		kube.RouteKlog(log.With("source", "kubernetes"))
		// Pods only matter to verified pod records; watching every Pod of
		// a cluster costs memory CoreDNS also saves in the other modes.
		kinds := []cluster.Kind{cluster.KindService, cluster.KindEndpointSlice, cluster.KindNamespace}
		if cfg.Zone.Pods == dns.PodsVerified {
			kinds = append(kinds, cluster.KindPod)
		}
		src := kube.New(kube.Options{Config: kc, Store: store, Kinds: kinds, Logger: log.With("source", "kubernetes")})
		runSource, stale = src.Run, src.Err
	}
	zone := dns.NewZone(store, cfg.Zone)

	var ups []netip.AddrPort
	for _, u := range cfg.Upstreams {
		ap, _ := parseUpstream(u)
		ups = append(ups, ap)
	}
	if len(ups) == 0 {
		var err error
		if ups, err = dns.ReadResolvConf(cfg.ResolvConf); err != nil {
			return err
		}
	}
	fo := cfg.Forward
	fo.Upstreams = ups
	fo.Logger = log.With("part", "forward")
	for _, l := range cfg.Listen {
		if strings.HasPrefix(l, ":") { // ":53" listens on every address
			l = "0.0.0.0" + l
		}
		if ap, err := netip.ParseAddrPort(l); err == nil {
			fo.Forbidden = append(fo.Forbidden, ap)
			if ap.Addr().IsUnspecified() {
				fo.Forbidden = append(fo.Forbidden, netip.AddrPortFrom(netip.IPv6Unspecified(), ap.Port()))
			}
		}
	}
	if cfg.DNSServiceIP.IsValid() {
		fo.Forbidden = append(fo.Forbidden, netip.AddrPortFrom(cfg.DNSServiceIP, 53))
	}
	fwd, err := dns.NewForwarder(fo)
	for _, r := range rejectedOf(fwd) {
		log.Error("upstream rejected", "err", r)
	}
	if err != nil {
		return err
	}
	log.Info("forwarding", "upstreams", fmt.Sprint(fwd.Upstreams()))
	var cache *dns.Cache
	if !cfg.NoCache {
		cache = dns.NewCache(cfg.Cache)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := dns.NewMetrics(reg, zone, cache, fwd)
	srv := dns.NewServer(dns.ServerOptions{Listen: cfg.Listen, Zone: zone, Forwarder: fwd, Cache: cache, Metrics: metrics})

	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
		serving  = make(chan dns.Listening, 1)
		up       = make(chan struct{})
	)
	fail := func(err error) {
		if err != nil && ctx.Err() == nil {
			errOnce.Do(func() { firstErr = err })
			cancel()
		}
	}
	wg.Go(func() { fail(runSource(ctx)) })
	wg.Go(func() { zone.Run(ctx) })
	wg.Go(func() { fwd.Run(ctx) })
	wg.Go(func() { fail(srv.Run(ctx, serving)) })
	wg.Go(func() {
		// Loading the state leaves parse garbage behind; once the index is
		// built, give that memory back rather than carry it in RSS.
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
	})
	wg.Go(func() {
		select {
		case l := <-serving:
			log.Info("serving DNS", "udp", fmt.Sprint(l.UDP), "tcp", fmt.Sprint(l.TCP))
			close(up)
		case <-ctx.Done():
		}
	})

	ready := func() error {
		select {
		case <-up:
		default:
			return errors.New("not listening yet")
		}
		if !zone.Synced() {
			return errors.New("cluster state not synced yet")
		}
		// Still answering from the last known state, but say so.
		return stale()
	}
	httpServe := func(addr string, h http.Handler) {
		if addr == "" {
			return
		}
		hs := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
		wg.Go(func() {
			<-ctx.Done()
			hs.Close()
		})
		wg.Go(func() {
			if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				fail(fmt.Errorf("serve %s: %w", addr, err))
			}
		})
	}
	metricsMux := http.NewServeMux()
	metricsMux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	httpServe(cfg.MetricsAddress, metricsMux)
	healthMux := http.NewServeMux()
	healthMux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "OK") })
	httpServe(cfg.HealthAddress, healthMux)
	readyMux := http.NewServeMux()
	readyMux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "OK")
	})
	httpServe(cfg.ReadyAddress, readyMux)

	wg.Wait()
	return firstErr
}

func rejectedOf(f *dns.Forwarder) []error {
	if f == nil {
		return nil
	}
	return f.Rejected()
}
