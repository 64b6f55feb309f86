package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/conntrack"
	"github.com/podnet/podnet/dataplane/health"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/iptables"
)

// serviceProxyOptions is what main hands the Service proxy.
type serviceProxyOptions struct {
	Mode              string // "iptables", "ebpf" or "none"
	NodeName          string
	ClusterCIDR       netip.Prefix
	NodePortAddresses []netip.Prefix // empty: all of the node's addresses
	MasqueradeAll     bool
	SyncPeriod        time.Duration
	MinSyncPeriod     time.Duration
	Store             *cluster.Store
	Health            *health.Checker
	Metrics           prometheus.Registerer
	Logger            *slog.Logger
	// IptablesBackend is "nft" or "legacy"; empty detects the one the node
	// already uses (the one holding more rules, nft on a tie).
	IptablesBackend string
}

// runServiceProxy programs Services until ctx ends.
func runServiceProxy(ctx context.Context, o serviceProxyOptions) error {
	switch o.Mode {
	case "none":
		<-ctx.Done()
		return nil
	case "iptables", "":
	default:
		return fmt.Errorf("proxy mode %q: not available", o.Mode)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	backend := o.IptablesBackend
	switch backend {
	case "":
		backend = iptables.DetectBackend()
	case iptables.BackendNFT, iptables.BackendLegacy:
	default:
		return fmt.Errorf("iptables backend %q: want %q or %q", backend, iptables.BackendNFT, iptables.BackendLegacy)
	}
	o.Logger.Info("service proxy: iptables mode", "backend", backend)
	proxier := iptables.NewProxier(iptables.Config{
		ClusterCIDR:       o.ClusterCIDR,
		NodePortAddresses: o.NodePortAddresses,
		MasqueradeAll:     o.MasqueradeAll,
	}, iptables.ExecRunner{Backend: backend})
	return proxy.Run(ctx, proxy.Options{
		Store:         o.Store,
		NodeName:      o.NodeName,
		Backend:       proxier,
		Conntrack:     conntrackCLI{},
		SyncPeriod:    o.SyncPeriod,
		MinSyncPeriod: o.MinSyncPeriod,
		Health:        o.Health,
		Metrics:       proxy.NewMetrics(o.Metrics),
		HealthChecks:  &proxy.HealthChecks{},
		Logger:        o.Logger,
	})
}

// conntrackCLI adapts the conntrack package to the proxy's interface.
type conntrackCLI struct{}

func (conntrackCLI) DeleteUDP(f proxy.ConntrackFilter) error {
	_, err := conntrack.Delete(conntrack.Filter{Protocol: "udp", OrigDst: f.OrigDst, OrigDstPort: f.OrigDstPort, ReplySrc: f.ReplySrc})
	return err
}

// cleanupServiceProxy removes every rule and chain the Service proxy created,
// from both iptables backends.
func cleanupServiceProxy(logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var errs []error
	for _, b := range []string{iptables.BackendNFT, iptables.BackendLegacy} {
		// iptables-save without -t lists only the tables that exist, so a
		// backend the node does not use is left untouched (naming a table
		// would create it).
		out, err := exec.Command("iptables-" + b + "-save").Output()
		if err != nil || !strings.Contains(string(out), iptables.ChainPrefix) {
			continue
		}
		if err := iptables.Cleanup(iptables.ExecRunner{Backend: b}); err != nil {
			errs = append(errs, fmt.Errorf("clean up iptables-%s: %w", b, err))
			continue
		}
		logger.Info("service proxy rules removed", "backend", b)
	}
	return errors.Join(errs...)
}
