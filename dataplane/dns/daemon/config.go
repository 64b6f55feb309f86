package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/podnet/podnet/dataplane/dns"
	"github.com/podnet/podnet/dataplane/runner"
)

// readConfigFile reads and checks the config file; "" is no file, and so
// is a file that does not exist (an optional ConfigMap not created yet).
func readConfigFile(path string) (dns.Resolved, []byte, error) {
	if path == "" {
		return dns.Resolved{}, nil, nil
	}
	data, err := readIfExists(path)
	if err != nil {
		return dns.Resolved{}, nil, fmt.Errorf("config file: %w", err)
	}
	fc, err := dns.ParseFileConfig(data)
	if err != nil {
		return dns.Resolved{}, data, fmt.Errorf("config file %s: %w", path, err)
	}
	r, err := fc.Resolved()
	if err != nil {
		return dns.Resolved{}, data, fmt.Errorf("config file %s: %w", path, err)
	}
	return r, data, nil
}

// newForwarder builds the forwarder of cfg and the config file: the file's
// upstreamNameservers, else --upstream, else resolv.conf's nameservers;
// the file's stub domains and hosts; never dnsd itself as an upstream.
func newForwarder(cfg Config, file dns.Resolved, log *slog.Logger) (*dns.Forwarder, error) {
	ups := file.Upstreams
	if len(ups) == 0 {
		for _, u := range cfg.Upstreams {
			ap, _ := parseUpstream(u)
			ups = append(ups, ap)
		}
	}
	if len(ups) == 0 {
		var err error
		if ups, err = dns.ReadResolvConf(cfg.ResolvConf); err != nil {
			return nil, err
		}
	}
	fo := cfg.Forward
	fo.Upstreams, fo.Stubs, fo.Hosts = ups, file.Stubs, file.Hosts
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
	if fwd != nil {
		for _, r := range fwd.Rejected() {
			log.Error("upstream rejected", "err", r)
		}
	}
	if err != nil {
		return nil, err
	}
	log.Info("forwarding", "upstreams", fmt.Sprint(fwd.Upstreams()), "stubDomains", fmt.Sprint(fwd.StubDomains()), "hosts", len(file.Hosts))
	return fwd, nil
}

// logOptions is the query and error logging of the flags, or of the
// config file when it has a log section.
func logOptions(cfg Config, file dns.Resolved, log *slog.Logger) dns.LogOptions {
	o := cfg.Log
	if file.Log != nil {
		o = *file.Log
	}
	o.Logger = log.With("part", "query")
	return o
}

// readIfExists reads path; a missing file reads as empty.
func readIfExists(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return data, err
}

// configPoll is how often the config file is read for changes. A mounted
// ConfigMap changes by a symlink swap, which a poll sees as surely as an
// inotify watch would, without watching the right directory.
const configPoll = 2 * time.Second

// forwarding runs the forwarder in use until ctx ends and, when cfg has a
// config file, replaces it whenever the file changes: the new forwarder
// takes the queries that arrive from then on, the old one finishes those
// it has (it stops one forward deadline later), and the cache of forwarded
// answers starts afresh. A file that does not parse, or whose upstreams
// are all refused, is reported and the running configuration kept. The
// file is read every configPoll, on a runner on cfg.Clock.
func forwarding(ctx context.Context, cfg Config, fwd *dns.Forwarder, applied []byte, srv *dns.Server, m *dns.Metrics, cache *dns.Cache, log *slog.Logger) error {
	r := &reloader{ctx: ctx, cfg: cfg, applied: applied, srv: srv, m: m, cache: cache, log: log}
	r.stop = r.run(fwd)
	defer func() { r.stop() }()
	if cfg.ConfigFile == "" {
		<-ctx.Done()
		return nil
	}
	r.grace = cfg.Forward.Deadline
	if r.grace <= 0 {
		r.grace = 5 * time.Second
	}
	runner.New(func() error { r.check(); return nil }, runner.Options{MaxInterval: configPoll, Clock: cfg.Clock}).Run(ctx)
	return nil
}

// reloader is forwarding's state between two reads of the config file.
type reloader struct {
	ctx   context.Context
	cfg   Config
	srv   *dns.Server
	m     *dns.Metrics
	cache *dns.Cache
	log   *slog.Logger
	grace time.Duration
	// applied is the file's content in use, rejected the last content
	// refused (empty: unreadable), so each is reported once.
	applied, rejected []byte
	// stop ends the forwarder in use.
	stop context.CancelFunc
}

// run runs f until the reloader's context ends or the returned function
// is called.
func (r *reloader) run(f *dns.Forwarder) context.CancelFunc {
	fctx, cancel := context.WithCancel(r.ctx)
	go f.Run(fctx)
	return cancel
}

// check reads the config file and, when it changed and is good, puts its
// forwarder in place.
func (r *reloader) check() {
	cfg, log := r.cfg, r.log
	data, err := readIfExists(cfg.ConfigFile)
	if err != nil || bytes.Equal(data, r.applied) || bytes.Equal(data, r.rejected) {
		if err != nil && r.rejected == nil {
			log.Error("config file unreadable; keeping the running configuration", "err", err)
			r.rejected = []byte{}
		}
		return
	}
	file, _, err := readConfigFile(cfg.ConfigFile)
	var nf *dns.Forwarder
	if err == nil {
		nf, err = newForwarder(cfg, file, log)
	}
	if err != nil {
		log.Error("config file rejected; keeping the running configuration", "err", err)
		r.rejected = data
		return
	}
	if r.m != nil {
		r.m.Use(nf)
	}
	old := r.stop
	r.stop = r.run(nf)
	r.srv.SetForwarder(nf)
	r.srv.SetLog(logOptions(cfg, file, log))
	if r.cache != nil {
		r.cache.Flush()
	}
	time.AfterFunc(r.grace+time.Second, old)
	r.applied, r.rejected = data, nil
	log.Info("config file applied", "path", cfg.ConfigFile)
}
