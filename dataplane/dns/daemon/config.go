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
// are all refused, is reported and the running configuration kept.
func forwarding(ctx context.Context, cfg Config, fwd *dns.Forwarder, applied []byte, srv *dns.Server, m *dns.Metrics, cache *dns.Cache, log *slog.Logger) error {
	run := func(f *dns.Forwarder) context.CancelFunc {
		fctx, cancel := context.WithCancel(ctx)
		go f.Run(fctx)
		return cancel
	}
	stop := run(fwd)
	defer func() { stop() }()
	if cfg.ConfigFile == "" {
		<-ctx.Done()
		return nil
	}
	grace := cfg.Forward.Deadline
	if grace <= 0 {
		grace = 5 * time.Second
	}
	var rejected []byte
	t := time.NewTicker(configPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		data, err := readIfExists(cfg.ConfigFile)
		if err != nil || bytes.Equal(data, applied) || bytes.Equal(data, rejected) {
			if err != nil && rejected == nil {
				log.Error("config file unreadable; keeping the running configuration", "err", err)
				rejected = []byte{}
			}
			continue
		}
		file, _, err := readConfigFile(cfg.ConfigFile)
		var nf *dns.Forwarder
		if err == nil {
			nf, err = newForwarder(cfg, file, log)
		}
		if err != nil {
			log.Error("config file rejected; keeping the running configuration", "err", err)
			rejected = data
			continue
		}
		if m != nil {
			m.Use(nf)
		}
		old := stop
		stop = run(nf)
		srv.SetForwarder(nf)
		srv.SetLog(logOptions(cfg, file, log))
		if cache != nil {
			cache.Flush()
		}
		time.AfterFunc(grace+time.Second, old)
		applied, rejected = data, nil
		log.Info("config file applied", "path", cfg.ConfigFile)
	}
}
