package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/health"
)

// Backend programs ServicePorts into the kernel.
type Backend interface {
	// Sync makes the kernel hold ports. changed names the Services that
	// differ from the last successful Sync; full asks for everything to be
	// rewritten (first sync, periodic repair, after a failure).
	Sync(ports map[cluster.Key][]*ServicePort, changed map[cluster.Key]bool, full bool) (SyncResult, error)
}

// SyncResult describes what a Sync left in the kernel.
type SyncResult struct {
	// Rules counts rules by table (or map) name.
	Rules map[string]int
}

// ConntrackFilter selects UDP conntrack entries by their original
// direction's destination and their reply source. Zero fields match all.
type ConntrackFilter struct {
	OrigDst     netip.Addr
	OrigDstPort uint16
	ReplySrc    netip.Addr
}

// Conntrack deletes stale UDP conntrack entries.
type Conntrack interface {
	DeleteUDP(ConntrackFilter) error
}

// HealthComponent is the name the proxy reports its health under.
const HealthComponent = "service-proxy"

// Options configure Run.
type Options struct {
	Store         *cluster.Store
	NodeName      string
	Backend       Backend
	Conntrack     Conntrack // nil: no conntrack cleanup
	SyncPeriod    time.Duration
	MinSyncPeriod time.Duration
	Health        *health.Checker // nil: not reported
	Metrics       *Metrics        // nil: not recorded
	HealthChecks  *HealthChecks   // nil: no healthCheckNodePort servers
	Logger        *slog.Logger
}

// Run syncs the Backend with the Store until ctx ends: changes arriving
// within MinSyncPeriod are batched into one sync; every SyncPeriod a full
// sync repairs whatever someone else changed; a failed sync is retried as a
// full sync after MinSyncPeriod.
func Run(ctx context.Context, o Options) error {
	if o.Store == nil || o.Backend == nil {
		return errors.New("run service proxy: Store and Backend are required")
	}
	if o.SyncPeriod <= 0 {
		o.SyncPeriod = 30 * time.Second
	}
	if o.MinSyncPeriod <= 0 {
		o.MinSyncPeriod = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	tracker := NewTracker(o.Store, o.NodeName)
	state := NewState()
	start := time.Now()
	lastOK := time.Time{}
	report := func(err error) {
		if o.Health == nil {
			return
		}
		ref := lastOK
		if ref.IsZero() {
			ref = start
		}
		if time.Since(ref) > 2*o.SyncPeriod {
			if err == nil {
				err = fmt.Errorf("no successful sync since %s", ref.Format(time.RFC3339))
			}
			o.Health.Set(HealthComponent, fmt.Errorf("no successful sync for %s: %w", time.Since(ref).Round(time.Second), err))
			return
		}
		o.Health.Set(HealthComponent, nil)
	}
	report(nil)
	healthTicker := time.NewTicker(max(o.SyncPeriod/4, time.Second))
	defer healthTicker.Stop()

	// Nothing is programmed before the source has delivered the whole
	// state; a source that never does makes the proxy unhealthy in time.
	var lastErr error
waitSynced:
	for {
		select {
		case <-o.Store.Synced():
			break waitSynced
		case <-healthTicker.C:
			report(errors.New("cluster state not synced yet"))
		case <-ctx.Done():
			return nil
		}
	}
	o.Logger.Info("service proxy starting", "node", o.NodeName, "syncPeriod", o.SyncPeriod, "minSyncPeriod", o.MinSyncPeriod)

	forceFull := true
	var lastSync time.Time
	// What the kernel held after the last successful sync, and the
	// Services changed since: a failed sync's changes still need their
	// conntrack cleanup once a later sync succeeds.
	applied := make(map[cluster.Key][]*ServicePort)
	pending := make(map[cluster.Key]bool)
	fullTimer := time.NewTimer(0)
	defer fullTimer.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()

	for {
		select {
		case <-ctx.Done():
			if o.HealthChecks != nil {
				o.HealthChecks.Close()
			}
			return nil
		case <-healthTicker.C:
			report(lastErr)
			continue
		case <-fullTimer.C:
			forceFull = true
		case <-tracker.Changed():
		case <-retry.C:
		}
		// Batch: wait out the rest of MinSyncPeriod since the last sync, so
		// changes arriving together land in one transaction.
		if wait := o.MinSyncPeriod - time.Since(lastSync); wait > 0 {
			select {
			case <-ctx.Done():
				continue
			case <-time.After(wait):
			}
		}
		dirty, all := tracker.Take()
		full := forceFull || all
		changed := state.Update(o.Store, o.NodeName, dirty, full)
		if !full && len(changed) == 0 {
			continue
		}
		for k := range changed {
			pending[k] = true
		}
		began := time.Now()
		res, err := o.Backend.Sync(state.Ports, changed, full)
		lastSync = time.Now()
		kind := "partial"
		if full {
			kind = "full"
		}
		if err != nil {
			lastErr = err
			o.Metrics.SyncErrors.Inc()
			o.Logger.Error("service proxy sync failed; retrying with a full sync", "kind", kind, "err", err)
			forceFull = true
			retry.Reset(o.MinSyncPeriod)
			report(err)
			continue
		}
		o.Metrics.SyncDuration.WithLabelValues(kind).Observe(time.Since(began).Seconds())
		o.Metrics.LastSync.SetToCurrentTime()
		for table, n := range res.Rules {
			o.Metrics.Rules.WithLabelValues(table).Set(float64(n))
		}
		svcs, eps := state.Counts()
		o.Metrics.Services.Set(float64(svcs))
		o.Metrics.Endpoints.Set(float64(eps))
		o.Logger.Debug("service proxy synced", "kind", kind, "changed", len(changed), "took", time.Since(began))
		lastOK, lastErr = time.Now(), nil
		report(nil)
		if full {
			forceFull = false
			fullTimer.Reset(o.SyncPeriod)
		}
		stale := StaleUDP(applied, state.Ports, pending)
		applied, pending = snapshot(state.Ports), make(map[cluster.Key]bool)
		if o.Conntrack != nil {
			for _, f := range stale {
				if err := o.Conntrack.DeleteUDP(f); err != nil {
					o.Logger.Warn("delete stale UDP conntrack entries", "filter", f, "err", err)
				}
			}
		}
		if o.HealthChecks != nil {
			if err := o.HealthChecks.Sync(state.Ports); err != nil {
				o.Logger.Warn("health check node ports", "err", err)
			}
		}
	}
}

func snapshot(m map[cluster.Key][]*ServicePort) map[cluster.Key][]*ServicePort {
	out := make(map[cluster.Key][]*ServicePort, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// StaleUDP returns the conntrack entries to delete after the changed
// Services went from old to new: entries whose reply comes from an endpoint
// no longer used, and, for a port that had no endpoints and now has some,
// the entries to its frontends that were never DNATed (a client that kept
// sending while there were none, or before the rules existed, would
// otherwise stay pinned to an entry that goes nowhere).
func StaleUDP(old, new map[cluster.Key][]*ServicePort, changed map[cluster.Key]bool) []ConntrackFilter {
	var out []ConntrackFilter
	for key := range changed {
		for _, o := range old[key] {
			if o.Protocol != cluster.UDP {
				continue
			}
			var n *ServicePort
			for _, c := range new[key] {
				if c.Name == o.Name {
					n = c
				}
			}
			now := usedEndpoints(n)
			for ep := range usedEndpoints(o) {
				if !now[ep] {
					out = append(out, frontends(o, ep)...)
				}
			}
		}
		for _, n := range new[key] {
			if n.Protocol != cluster.UDP || len(usedEndpoints(n)) == 0 {
				continue
			}
			var o *ServicePort
			for _, c := range old[key] {
				if c.Name == n.Name {
					o = c
				}
			}
			if len(usedEndpoints(o)) == 0 {
				out = append(out, frontends(n, netip.Addr{})...)
			}
		}
	}
	return out
}

func usedEndpoints(sp *ServicePort) map[netip.Addr]bool {
	m := make(map[netip.Addr]bool)
	if sp == nil {
		return m
	}
	for _, e := range sp.ClusterEndpoints {
		m[e.Addr] = true
	}
	for _, e := range sp.LocalEndpoints {
		m[e.Addr] = true
	}
	return m
}

// frontends returns filters for the port's entries answered by replySrc or,
// with replySrc invalid, for those that were never DNATed (the reply comes
// from the frontend address itself): traffic that found no rule.
func frontends(sp *ServicePort, replySrc netip.Addr) []ConntrackFilter {
	var out []ConntrackFilter
	for _, ip := range append(append([]netip.Addr{sp.ClusterIP}, sp.ExternalIPs...), sp.LoadBalancerIPs...) {
		src := replySrc
		if !src.IsValid() {
			src = ip
		}
		out = append(out, ConntrackFilter{OrigDst: ip, OrigDstPort: sp.Port, ReplySrc: src})
	}
	if sp.NodePort != 0 {
		out = append(out, ConntrackFilter{OrigDstPort: sp.NodePort, ReplySrc: replySrc})
	}
	return out
}
