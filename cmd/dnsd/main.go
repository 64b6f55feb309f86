// Command dnsd is podnet's cluster DNS server: authoritative for the cluster
// zone and the reverse zones, forwarding and caching everything else.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/app"
	"github.com/podnet/podnet/dataplane/cli"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/statedir"
	"github.com/podnet/podnet/dataplane/dns"
	"github.com/podnet/podnet/dataplane/dns/daemon"
)

func main() {
	os.Exit(command().Main(os.Args[1:], os.Stdout, os.Stderr))
}

// daemon is dnsd's command line: the DNS server with its flags, and the
// status subcommand.
func command() app.Daemon {
	var f flags
	return app.Daemon{
		Name:    "dnsd",
		Summary: "podnet's cluster DNS server: authoritative for the cluster zone and the reverse zones, forwarding and caching the rest",
		Subcommands: []cli.Subcommand{
			{Name: "status", Summary: "print the zones, upstreams and cache of the dnsd running here", Run: runStatus},
			{Name: "import-corefile", Summary: "print a CoreDNS Corefile's settings as dnsd's config file and flags", Run: runImportCorefile},
		},
		Flags: f.register,
		Setup: func(log *slog.Logger) (app.Run, error) {
			cfg, err := f.config()
			if err != nil {
				return app.Run{}, err
			}
			return app.Run{Health: cfg.HealthEndpoint(), Main: func(ctx context.Context, h *app.Health) error {
				cfg.Health = h
				return daemon.Run(ctx, cfg, log)
			}}, nil
		},
	}
}

// flags is dnsd's command line: the daemon's config, and the flags that
// need parsing before they become part of it.
type flags struct {
	cfg                         daemon.Config
	ttl                         uint32
	pods, dnsSvc, dnsIP, policy string
	logQueries                  string
	limits                      statedir.LimitFlags
}

// register registers every flag into fs, with its default.
func (f *flags) register(fs *pflag.FlagSet) {
	cfg := &f.cfg
	fs.StringArrayVar(&cfg.Listen, "listen", []string{":53"}, "address to serve DNS on, UDP and TCP (repeatable); the default, :53, is every address of both families (IPv4 alone where the kernel has no IPv6)")
	fs.IntVar(&cfg.TCPMaxConns, "tcp-max-connections", dns.DefaultTCPMaxConns, "concurrent TCP connections; more are closed at once")
	fs.DurationVar(&cfg.TCPIdleTimeout, "tcp-idle-timeout", 10*time.Second, "close a TCP connection idle this long between queries")
	fs.DurationVar(&cfg.Drain.Quiet, "drain-quiet", 2*time.Second, "on SIGTERM, answer until no query has come for this long (0: stop at once)")
	fs.DurationVar(&cfg.Drain.Max, "drain-max", 20*time.Second, "on SIGTERM, stop after this long even if queries still come (keep it below the pod's grace period, less --forward-deadline)")
	fs.StringVar(&f.logQueries, "log-queries", "", "log queries whose answer is of these classes: success, denial, error, all (comma-separated; default none), as CoreDNS's log plugin")
	fs.BoolVar(&cfg.Log.Errors, "log-errors", false, "log why queries failed (the upstreams' errors), as CoreDNS's errors plugin")
	fs.Float64Var(&cfg.Log.Rate, "log-rate", dns.DefaultLogRate, "most query and error lines logged per second, each; the rest are counted on the next line")
	fs.StringVar(&cfg.Zone.Domain, "cluster-domain", "cluster.local", "the cluster's DNS domain")
	fs.Uint32Var(&f.ttl, "ttl", 5, "TTL of cluster records, in seconds")
	fs.StringVar(&f.pods, "pods", "insecure", "pod records: insecure, verified or disabled")
	fs.BoolVar(&cfg.Zone.ShortNames, "short-names", true, `answer "<svc>.<ns>." and "<svc>.<ns>.svc." for Services that exist`)
	fs.StringVar(&f.dnsSvc, "dns-service", "kube-system/kube-dns", "NAMESPACE/NAME of the Service dnsd runs behind (ns.dns.<zone> answers)")
	fs.StringVar(&f.dnsIP, "dns-service-ip", "10.96.0.10", "the kube-dns VIP; never used as an upstream")
	fs.StringArrayVar(&cfg.Upstreams, "upstream", nil, "upstream resolver HOST:PORT (repeatable); default: the nameservers of --resolv-conf")
	fs.StringVar(&cfg.ConfigFile, "config", "", "config file (upstreamNameservers, stubDomains, hosts; YAML or JSON, as in the kube-dns ConfigMap), reloaded when it changes")
	fs.StringVar(&cfg.ResolvConf, "resolv-conf", "/etc/resolv.conf", "resolv.conf to take upstreams from when no --upstream is given")
	fs.BoolVar(&cfg.Autopath, "autopath", false, "resolve pods' search paths on the server, as CoreDNS's autopath @kubernetes: a name under the querying pod's <ns>.svc.<zone> that does not exist is looked up along the rest of its search path (the cluster's, then --resolv-conf's search line) and answered with a CNAME; watches Pods")
	fs.StringVar(&f.policy, "policy", "random", "upstream selection: random, round_robin or sequential")
	fs.DurationVar(&cfg.Forward.TryTimeout, "forward-timeout", 0, "timeout of one upstream try (default 2s)")
	fs.DurationVar(&cfg.Forward.Deadline, "forward-deadline", 0, "deadline of a forwarded query, all tries included (default 5s)")
	fs.IntVar(&cfg.Forward.MaxConcurrent, "max-concurrent", 1000, "forwarded queries in flight; more are REFUSED")
	fs.DurationVar(&cfg.Forward.HealthInterval, "health-check", 0, "probe interval of a failing upstream (default 500ms)")
	fs.IntVar(&cfg.Cache.Size, "cache-size", 10000, "entries in the cache of forwarded answers")
	fs.DurationVar(&cfg.Cache.MinTTL, "cache-min-ttl", 0, "lowest TTL cached (default 5s)")
	fs.DurationVar(&cfg.Cache.MaxTTL, "cache-max-ttl", 0, "highest TTL of a cached positive answer (default 30s, as kubeadm's Corefile: cache 30)")
	fs.DurationVar(&cfg.Cache.MaxNegTTL, "cache-max-negative-ttl", 0, "highest TTL of a cached negative answer (default 30s)")
	fs.IntVar(&cfg.Cache.PrefetchHits, "prefetch", 2, "hits after which an entry is refreshed before it expires (0: never)")
	fs.DurationVar(&cfg.Cache.StaleFor, "serve-stale", 0, "how long past expiry an answer is served when no upstream answers (0: never, as CoreDNS without serve_stale)")
	fs.BoolVar(&cfg.NoCache, "no-cache", false, "do not cache forwarded answers")
	fs.StringVar(&cfg.StateDir, "state-dir", "", "directory of Kubernetes objects (YAML/JSON) to serve")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server to read the cluster from (default: in-cluster config, unless --state-dir is set)")
	fs.StringVar(&cfg.MetricsAddress, "metrics-address", ":9153", "address of /metrics (empty: off)")
	fs.StringVar(&cfg.HealthAddress, "health-address", ":8080", "address of /health (empty: off)")
	fs.StringVar(&cfg.ReadyAddress, "ready-address", ":8181", "address of /ready (empty: off)")
	f.limits.Register(fs)
}

// config parses the flags that need it into the daemon's config and
// validates it.
func (f *flags) config() (daemon.Config, error) {
	cfg := f.cfg
	cfg.Zone.TTL = f.ttl
	var err error
	if cfg.Log.Queries, err = dns.ParseLogClasses(f.logQueries); err != nil {
		return cfg, err
	}
	if cfg.Log.Rate < 0 {
		return cfg, fmt.Errorf("log-rate %v: want 0 or more", cfg.Log.Rate)
	}
	if cfg.Zone.Pods, err = dns.ParsePodMode(f.pods); err != nil {
		return cfg, err
	}
	if cfg.Forward.Policy, err = dns.ParsePolicy(f.policy); err != nil {
		return cfg, err
	}
	if cfg.Zone.DNSService, err = parseKey(f.dnsSvc); err != nil {
		return cfg, err
	}
	if f.dnsIP != "" {
		if cfg.DNSServiceIP, err = netip.ParseAddr(f.dnsIP); err != nil {
			return cfg, fmt.Errorf("dns-service-ip %q: %w", f.dnsIP, err)
		}
	}
	if cfg.StateLimits, err = f.limits.Limits(); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

func parseKey(s string) (cluster.Key, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" {
		return cluster.Key{}, fmt.Errorf("dns-service %q: want NAMESPACE/NAME", s)
	}
	return cluster.Key{Namespace: ns, Name: name}, nil
}
