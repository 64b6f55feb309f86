package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/health"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/runner"
	"github.com/podnet/podnet/dataplane/status"
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

// ConntrackFilter selects conntrack entries of a protocol by their original
// direction's destination and their reply source. Zero fields match all.
type ConntrackFilter struct {
	Protocol cluster.Protocol
	// Family is the conntrack table to look in: the ServicePort's.
	Family      ipfamily.Family
	OrigDst     netip.Addr
	OrigDstPort uint16
	ReplySrc    netip.Addr
	// ReplySrcPort is the port a DNATed entry's reply comes from: the
	// destination's.
	ReplySrcPort uint16
}

// Conntrack deletes stale conntrack entries: those matching any filter.
type Conntrack interface {
	Delete([]ConntrackFilter) error
}

// HealthComponent is the name the proxy reports its health under.
const HealthComponent = "service-proxy"

// Options configure Run.
type Options struct {
	Store    *cluster.Store
	NodeName string
	// Families are the address families whose ServicePorts Backend gets,
	// in this order within a Service; empty: IPv4.
	Families      []ipfamily.Family
	Backend       Backend
	Conntrack     Conntrack // nil: no conntrack cleanup
	SyncPeriod    time.Duration
	MinSyncPeriod time.Duration
	// LocalProbeInterval is how often the local endpoints of Services with
	// trafficDistribution PreferSameNode are probed, those refusing
	// treated as not ready (localprobe.go); 0: never.
	LocalProbeInterval time.Duration
	Health             *health.Checker  // nil: not reported
	Progress           *health.Progress // nil: not reported
	// Status, when set, gets the proxy's section (StatusSection), with
	// Mode as its mode.
	Status       *status.Board
	Mode         string
	Metrics      *Metrics      // nil: not recorded
	HealthChecks *HealthChecks // nil: no healthCheckNodePort servers
	Logger       *slog.Logger
	// BeforeFirstSync, when set, is called once the state is synced and
	// returns when the first sync may start (or ctx ended).
	BeforeFirstSync func(ctx context.Context)
}

// Run syncs the Backend with the Store until ctx ends: changes arriving
// within MinSyncPeriod are batched into one sync; every SyncPeriod a full
// sync repairs whatever someone else changed; a failed sync is retried as a
// full sync after MinSyncPeriod.
func Run(ctx context.Context, o Options) error {
	if o.Store == nil || o.Backend == nil {
		return errors.New("run service proxy: Store and Backend are required")
	}
	s := newSyncer(o)
	if o.Status != nil {
		s.status.mode = o.Mode
		o.Status.Provide(StatusSection, func() any { return s.status.status(s.o.Metrics) })
	}
	defer func() {
		if s.o.HealthChecks != nil {
			s.o.HealthChecks.Close()
		}
	}()
	// Nothing is programmed before the source has delivered the whole
	// state; a source that never does makes the proxy unhealthy in time
	// (s.health).
	select {
	case <-o.Store.Synced():
	case <-ctx.Done():
		return nil
	}
	if o.BeforeFirstSync != nil {
		o.BeforeFirstSync(ctx)
	}
	s.o.Logger.Info("service proxy starting", "node", o.NodeName, "syncPeriod", s.o.SyncPeriod, "minSyncPeriod", s.o.MinSyncPeriod)

	r := runner.New(s.syncOnce, runner.Options{MinInterval: s.o.MinSyncPeriod, MaxInterval: s.o.SyncPeriod, RetryInterval: s.o.MinSyncPeriod})
	s.runner = r
	s.queued()
	r.Trigger()
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	probed := make(chan struct{})
	if p := s.state.probe; p != nil {
		// A dead local endpoint refuses every query of the node's pods:
		// the sync that moves them away runs at once, even within
		// MinSyncPeriod of the last one (a down at most every probeHold
		// per endpoint).
		p.urgent = r.TriggerNow
		go func() { p.run(ctx); close(probed) }()
	} else {
		close(probed)
	}
	for {
		select {
		case <-ctx.Done():
			<-done
			<-probed
			return nil
		case <-s.tracker.Changed():
			s.changedAt.CompareAndSwap(0, s.now().UnixNano())
			s.queued()
			r.Trigger()
		}
	}
}

// laterStale are conntrack entries to delete at a later sync.
type laterStale struct {
	at      time.Time
	filters []ConntrackFilter
}

// syncer is the state of Run between syncs.
type syncer struct {
	o       Options
	tracker *Tracker
	state   *State
	now     func() time.Time
	start   time.Time

	// Only syncOnce touches these.
	forceFull bool
	lastFull  time.Time
	// freeMemory returns the start-up garbage to the OS once, after the
	// first successful full sync (debug.FreeOSMemory).
	freeMemory func()
	// The Services changed since the last successful sync (status.programmed
	// holds what the kernel held then): a failed sync's changes still
	// need their conntrack cleanup once a later sync succeeds.
	pending map[cluster.Key]bool

	status statusLog

	// runner runs syncOnce (nil in tests that call it themselves); later
	// are conntrack deletions it waits for (deleteLater).
	runner *runner.Runner
	later  []laterStale

	// changedAt is when the oldest change not yet taken by a sync was
	// signalled (Unix ns; 0: none), for the sync's debug log: how long
	// the change waited for its sync.
	changedAt atomic.Int64

	mu      sync.Mutex // guards what health reads
	lastOK  time.Time
	lastErr error
}

// newSyncer fills in Options' defaults, subscribes to the Store and makes
// s.health the proxy's health.
func newSyncer(o Options) *syncer {
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
	if len(o.Families) == 0 {
		// proxyd serves IPv4 alone until dual-stack is wired (issue 22).
		o.Families = []ipfamily.Family{ipfamily.IPv4}
	}
	tracker := NewTracker(o.Store, o.NodeName)
	o.Metrics.watch(o.Store)
	s := &syncer{
		o:          o,
		tracker:    tracker,
		state:      NewState(o.Families...),
		now:        time.Now,
		start:      time.Now(),
		forceFull:  true,
		freeMemory: debug.FreeOSMemory,
		pending:    make(map[cluster.Key]bool),
	}
	if o.LocalProbeInterval > 0 {
		s.state.probe = newLocalProber(o.LocalProbeInterval, tracker.Mark, o.Logger)
		s.state.probes = map[cluster.Key][]netip.AddrPort{}
	}
	if o.Health != nil {
		o.Health.Check(HealthComponent, s.health)
	}
	return s
}

// syncOnce takes the changes tracked since the last sync and programs them:
// everything when a full sync is due (the first, one SyncPeriod after the
// last full one, after a failure), else only the Services that changed.
// The error makes the runner retry.
func (s *syncer) syncOnce() error {
	taken := time.Now()
	var waited time.Duration
	if at := s.changedAt.Swap(0); at != 0 {
		waited = s.now().Sub(time.Unix(0, at))
	}
	dirty, all := s.tracker.Take()
	s.o.Metrics.taken()
	full := s.forceFull || all || s.now().Sub(s.lastFull) >= s.o.SyncPeriod
	// The state is rebuilt from the store only when the tracker lost count
	// (all) or a sync failed; a periodic full sync reprograms the kernel
	// from the state as it is, without building every ServicePort again
	// (at 10,000 Services that was ~12 MB of garbage each period).
	changed := s.state.Update(s.o.Store, s.o.NodeName, dirty, all || s.forceFull)
	if targets, ok := s.state.Probes(); ok {
		s.state.probe.setTargets(targets)
	}
	if !full && len(changed) == 0 {
		s.o.Logger.Debug("service proxy synced", "kind", "none", "waited", waited)
		deleteStale(s.o.Conntrack, s.dueLater(), s.o.Logger)
		s.updated(taken) // nothing to program is programmed
		return nil
	}
	for k := range changed {
		s.pending[k] = true
	}
	kind := "partial"
	if full {
		kind = "full"
	}
	began := s.now()
	res, err := s.o.Backend.Sync(s.state.Ports, changed, full)
	if err != nil {
		s.mu.Lock()
		s.lastErr = err
		s.mu.Unlock()
		s.o.Metrics.failed(full)
		s.status.failed(err)
		s.o.Logger.Error("service proxy sync failed; retrying with a full sync", "kind", kind, "err", err)
		s.forceFull = true
		return err
	}
	took := s.now().Sub(began)
	s.o.Metrics.synced(full, took, res, s.state.Ports)
	stale, later := StaleConntrack(s.status.programmed, s.state.Ports, s.pending)
	s.deleteLater(later)
	s.status.synced(s.state.Ports, s.pending, full, took)
	s.pending = make(map[cluster.Key]bool)
	s.o.Logger.Debug("service proxy synced", "kind", kind, "changed", len(changed), "took", took, "waited", waited)
	s.mu.Lock()
	s.lastOK, s.lastErr = s.now(), nil
	s.mu.Unlock()
	// Not under s.mu: Progress.State holds Progress's lock while it asks
	// health, which takes s.mu (a /healthz during this call deadlocked
	// proxyd).
	s.updated(taken)
	if full {
		s.forceFull = false
		s.lastFull = began
	}
	s.afterSync(append(stale, s.dueLater()...))
	if full && s.freeMemory != nil {
		// Reading the whole state and the first sync leave garbage of
		// several times the live heap (decoding 20,000 objects allocates
		// ~1.2 GB at 10,000 Services) that the collector would let stay
		// resident up to twice the live heap: at 10,000 Services × 10 in
		// ebpf mode, RSS 2 s after the first sync 83 MiB (BENCHMARKS.md).
		// Later syncs allocate far less; not repeated.
		s.freeMemory()
		s.freeMemory = nil
	}
	return nil
}

// staleGrace is how long the UDP conntrack entries of a destination that
// left while terminating are kept (StaleUDP's later ones): the answers to
// queries sent to it before the rules changed come back through them.
const staleGrace = time.Second

// deleteLater schedules the deletion of filters' entries staleGrace from
// now.
func (s *syncer) deleteLater(filters []ConntrackFilter) {
	if len(filters) == 0 {
		return
	}
	s.later = append(s.later, laterStale{at: s.now().Add(staleGrace), filters: filters})
	if s.runner != nil {
		s.runner.TriggerAfter(staleGrace)
	}
}

// dueLater takes the scheduled deletions that are due.
func (s *syncer) dueLater() []ConntrackFilter {
	var due []ConntrackFilter
	now := s.now()
	kept := s.later[:0]
	for _, l := range s.later {
		if now.Before(l.at) {
			kept = append(kept, l)
			continue
		}
		due = append(due, l.filters...)
	}
	s.later = kept
	return due
}

// afterSync does what follows a successful sync: stale conntrack entries
// go, and the healthCheckNodePort servers follow the ports.
func (s *syncer) afterSync(stale []ConntrackFilter) {
	deleteStale(s.o.Conntrack, stale, s.o.Logger)
	if s.o.HealthChecks != nil {
		if err := s.o.HealthChecks.Sync(s.state.Ports); err != nil {
			s.o.Logger.Warn("health check node ports", "err", err)
		}
	}
}

// updated tells Progress that every change up to taken is programmed.
func (s *syncer) updated(taken time.Time) {
	if s.o.Progress != nil {
		s.o.Progress.Updated(taken)
	}
}

// queued tells Progress that a sync is waiting.
func (s *syncer) queued() {
	if s.o.Progress != nil {
		s.o.Progress.Queued()
	}
}

// health is the proxy's health, asked whenever it is read: bad once no
// sync has succeeded for two SyncPeriods (since the start, before the
// first), naming the last failure or that the cluster state never came.
func (s *syncer) health() error {
	s.mu.Lock()
	ref, err := s.lastOK, s.lastErr
	s.mu.Unlock()
	if ref.IsZero() {
		ref = s.start
	}
	since := s.now().Sub(ref)
	if since <= 2*s.o.SyncPeriod {
		return nil
	}
	if err == nil {
		select {
		case <-s.o.Store.Synced():
			err = fmt.Errorf("no successful sync since %s", ref.Format(time.RFC3339))
		default:
			err = errors.New("cluster state not synced yet")
		}
	}
	return fmt.Errorf("no successful sync for %s: %w", since.Round(time.Second), err)
}
