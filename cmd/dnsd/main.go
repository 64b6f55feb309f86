// Command dnsd is podnet's cluster DNS server: authoritative for the cluster
// zone and the reverse zones, forwarding and caching everything else.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/statedir"
	"github.com/podnet/podnet/dataplane/dns"
	"github.com/podnet/podnet/dataplane/dns/daemon"
	"github.com/podnet/podnet/dataplane/version"
)

func main() {
	os.Exit(run())
}

func run() int {
	fs := pflag.NewFlagSet("dnsd", pflag.ContinueOnError)
	showVersion := fs.Bool("version", false, "print the version and exit")
	var cfg daemon.Config
	fs.StringArrayVar(&cfg.Listen, "listen", []string{"0.0.0.0:53"}, "address to serve DNS on, UDP and TCP (repeatable)")
	fs.IntVar(&cfg.TCPMaxConns, "tcp-max-connections", dns.DefaultTCPMaxConns, "concurrent TCP connections; more are closed at once")
	fs.DurationVar(&cfg.TCPIdleTimeout, "tcp-idle-timeout", 10*time.Second, "close a TCP connection idle this long between queries")
	fs.StringVar(&cfg.Zone.Domain, "cluster-domain", "cluster.local", "the cluster's DNS domain")
	ttl := fs.Uint32("ttl", 5, "TTL of cluster records, in seconds")
	pods := fs.String("pods", "insecure", "pod records: insecure, verified or disabled")
	fs.BoolVar(&cfg.Zone.ShortNames, "short-names", true, `answer "<svc>.<ns>." and "<svc>.<ns>.svc." for Services that exist`)
	dnsSvc := fs.String("dns-service", "kube-system/kube-dns", "NAMESPACE/NAME of the Service dnsd runs behind (ns.dns.<zone> answers)")
	dnsIP := fs.String("dns-service-ip", "10.96.0.10", "the kube-dns VIP; never used as an upstream")
	fs.StringArrayVar(&cfg.Upstreams, "upstream", nil, "upstream resolver HOST:PORT (repeatable); default: the nameservers of --resolv-conf")
	fs.StringVar(&cfg.ResolvConf, "resolv-conf", "/etc/resolv.conf", "resolv.conf to take upstreams from when no --upstream is given")
	policy := fs.String("policy", "random", "upstream selection: random, round_robin or sequential")
	fs.DurationVar(&cfg.Forward.TryTimeout, "forward-timeout", 0, "timeout of one upstream try (default 2s)")
	fs.DurationVar(&cfg.Forward.Deadline, "forward-deadline", 0, "deadline of a forwarded query, all tries included (default 5s)")
	fs.IntVar(&cfg.Forward.MaxConcurrent, "max-concurrent", 1000, "forwarded queries in flight; more are REFUSED")
	fs.DurationVar(&cfg.Forward.HealthInterval, "health-check", 0, "probe interval of a failing upstream (default 500ms)")
	fs.IntVar(&cfg.Cache.Size, "cache-size", 10000, "entries in the cache of forwarded answers")
	fs.DurationVar(&cfg.Cache.MinTTL, "cache-min-ttl", 0, "lowest TTL cached (default 5s)")
	fs.DurationVar(&cfg.Cache.MaxTTL, "cache-max-ttl", 0, "highest TTL of a cached positive answer (default 1h)")
	fs.DurationVar(&cfg.Cache.MaxNegTTL, "cache-max-negative-ttl", 0, "highest TTL of a cached negative answer (default 30m)")
	fs.IntVar(&cfg.Cache.PrefetchHits, "prefetch", 2, "hits after which an entry is refreshed before it expires (0: never)")
	fs.DurationVar(&cfg.Cache.StaleFor, "serve-stale", time.Hour, "how long past expiry an answer is served when no upstream answers (0: never)")
	fs.BoolVar(&cfg.NoCache, "no-cache", false, "do not cache forwarded answers")
	fs.StringVar(&cfg.StateDir, "state-dir", "", "directory of Kubernetes objects (YAML/JSON) to serve")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server to read the cluster from (default: in-cluster config, unless --state-dir is set)")
	fs.StringVar(&cfg.MetricsAddress, "metrics-address", ":9153", "address of /metrics (empty: off)")
	fs.StringVar(&cfg.HealthAddress, "health-address", ":8080", "address of /health (empty: off)")
	fs.StringVar(&cfg.ReadyAddress, "ready-address", ":8181", "address of /ready (empty: off)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	var limits statedir.LimitFlags
	limits.Register(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == pflag.ErrHelp {
			return 0
		}
		fmt.Fprintf(os.Stderr, "dnsd: %v (see dnsd --help)\n", err)
		return 2
	}
	if *showVersion {
		fmt.Println("dnsd", version.String())
		return 0
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintln(os.Stderr, "dnsd: log-level:", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	cfg.Zone.TTL = *ttl
	var err error
	if cfg.Zone.Pods, err = dns.ParsePodMode(*pods); err != nil {
		fmt.Fprintln(os.Stderr, "dnsd:", err)
		return 2
	}
	if cfg.Forward.Policy, err = dns.ParsePolicy(*policy); err != nil {
		fmt.Fprintln(os.Stderr, "dnsd:", err)
		return 2
	}
	if cfg.Zone.DNSService, err = parseKey(*dnsSvc); err != nil {
		fmt.Fprintln(os.Stderr, "dnsd:", err)
		return 2
	}
	if *dnsIP != "" {
		if cfg.DNSServiceIP, err = netip.ParseAddr(*dnsIP); err != nil {
			fmt.Fprintf(os.Stderr, "dnsd: dns-service-ip %q: %v\n", *dnsIP, err)
			return 2
		}
	}
	if cfg.StateLimits, err = limits.Limits(); err != nil {
		fmt.Fprintln(os.Stderr, "dnsd:", err)
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "dnsd:", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("dnsd starting", "version", version.String())
	if err := daemon.Run(ctx, cfg, log); err != nil {
		log.Error("dnsd failed", "err", err)
		return 1
	}
	return 0
}

func parseKey(s string) (cluster.Key, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" {
		return cluster.Key{}, fmt.Errorf("dns-service %q: want NAMESPACE/NAME", s)
	}
	return cluster.Key{Namespace: ns, Name: name}, nil
}
