package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/health"
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
}

// runServiceProxy programs Services until ctx ends.
func runServiceProxy(ctx context.Context, o serviceProxyOptions) error {
	if o.Mode == "none" {
		<-ctx.Done()
		return nil
	}
	return fmt.Errorf("proxy mode %q: not available yet", o.Mode)
}

// cleanupServiceProxy removes every rule and chain the Service proxy created.
func cleanupServiceProxy(logger *slog.Logger) error {
	return nil
}
