// Package nodenet converges the node's own network: the node config the
// CNI plugin reads (podCIDR, cluster CIDR, MTU), routes, neighbours and FDB
// entries to every other node's pods (host-gw or VXLAN), the sysctls and
// br_netfilter, and the node firewall's masquerade and forward rules,
// ordered behind the Service proxy's hooks. proxyd's agent runs it beside
// the Service proxy.
//
// The node network is reconciled, never rebuilt. A Node change updates the
// routing table by that Node and writes only the entries that differ; a
// full sync compares the whole plan with the kernel, at start, after a
// failure, on netlink events that are not the echo of podnet's own changes
// (someone removed a route) and at every periodic resync.
package nodenet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/health"
	"github.com/podnet/podnet/dataplane/hostnet"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/ipt"
	"github.com/podnet/podnet/dataplane/link"
	"github.com/podnet/podnet/dataplane/nodeconfig"
	"github.com/podnet/podnet/dataplane/routing"
	"github.com/podnet/podnet/dataplane/runner"
)

// Config configures the node network. The agent's Options carry the same
// fields under the same names (its flags).
type Config struct {
	NodeName       string
	ClusterCIDR    netip.Prefix
	Backend        routing.Backend
	VXLANVNI       int
	VXLANPort      int
	Iface          string // "" = the interface holding the node's InternalIP
	NodeConfigPath string
	Masquerade     bool
	SyncPeriod     time.Duration
	MinSyncPeriod  time.Duration
	// ServiceHooks are the Service proxy's jumps in built-in chains, which
	// the node firewall orders its own rules behind.
	ServiceHooks []hostnet.Hook
	// Clock times the syncs (the periodic resync, the first sync's wait);
	// nil: the system's. Tests drive a runner.FakeClock.
	Clock runner.Clock
}

// Component is the node network's name in the daemon's health.
const Component = "node-network"

// Kernel is what the node network reads and changes on the node.
// WithReal fills every field left nil with the real thing; tests pass
// fakes.
type Kernel struct {
	Routes   routing.Kernel
	IPTables hostnet.IPTables
	Sysctl   hostnet.Sysctl
	Modprobe hostnet.Modprobe
	// Links lists the node's interfaces with their addresses (where the
	// underlay is found).
	Links func() ([]link.Interface, error)
	// Watch reports the kernel's changes to podnet's routes, neighbours,
	// FDB entries and links until ctx ends (routing.Watch).
	Watch func(ctx context.Context, onEvent func(routing.Event)) error
}

// WithReal fills k's nil fields with the real kernel: routes of family f,
// iptables through iptables; close releases what it opened.
func (k Kernel) WithReal(f ipfamily.Family, iptables ipt.Runner) (_ Kernel, close func(), err error) {
	var closers []func()
	close = func() {
		for _, c := range closers {
			c()
		}
	}
	if k.Links == nil {
		k.Links = link.Interfaces
	}
	if k.Routes == nil {
		nk, err := routing.NewNetlinkKernel(netns.None(), f)
		if err != nil {
			close()
			return k, func() {}, err
		}
		closers = append(closers, nk.Close)
		k.Routes = nk
	}
	if k.IPTables == nil {
		chains, err := iptables.Chains()
		if err != nil {
			close()
			return k, func() {}, fmt.Errorf("iptables: %w", err)
		}
		k.IPTables = chains
	}
	if k.Sysctl == nil {
		k.Sysctl = hostnet.ProcSysctl{}
	}
	if k.Modprobe == nil {
		k.Modprobe = hostnet.ExecModprobe
	}
	if k.Watch == nil {
		k.Watch = func(ctx context.Context, onEvent func(routing.Event)) error {
			return routing.Watch(ctx, netns.None(), routing.DefaultDevice, onEvent, nil)
		}
	}
	return k, close, nil
}

// New wires the node network's reconciler to the kernel k; its health goes
// to checker as Component (not synced until the first sync succeeds), its
// metrics to reg. Nothing runs until Run.
func New(c Config, k Kernel, store *cluster.Store, checker *health.Checker, reg prometheus.Registerer, log *slog.Logger) *Network {
	checker.Set(Component, errors.New("node network not synced yet"))
	if c.Clock == nil {
		c.Clock = runner.SystemClock
	}
	return &Network{
		o:      c,
		clock:  c.Clock,
		log:    log.With("component", "node-network"),
		store:  store,
		health: checker,
		underlay: func(ip netip.Addr) (underlay, error) {
			links, err := k.Links()
			if err != nil {
				return underlay{}, fmt.Errorf("list links: %w", err)
			}
			return findUnderlay(links, c.Iface, ip)
		},
		rec:       &routing.Reconciler{Kernel: k.Routes, Device: routing.DefaultDevice},
		firewall:  hostnet.IPTablesFirewall{IPT: k.IPTables},
		hooks:     c.ServiceHooks,
		sysctl:    k.Sysctl,
		mod:       k.Modprobe,
		watch:     k.Watch,
		metrics:   newMetrics(reg),
		routed:    make(chan struct{}),
		firstDone: make(chan struct{}),
	}
}

// Network is the node network's reconciler (New, then Run).
type Network struct {
	o      Config
	clock  runner.Clock
	log    *slog.Logger
	store  *cluster.Store
	health *health.Checker
	// underlay finds the interface holding the node's IP.
	underlay func(netip.Addr) (underlay, error)
	rec      *routing.Reconciler
	firewall hostnet.NodeFirewall
	// hooks are the Service proxy's, which the firewall stays behind.
	hooks  []hostnet.Hook
	sysctl hostnet.Sysctl
	mod    hostnet.Modprobe
	// watch reports netlink changes; nil: none (the periodic resync only).
	watch   func(ctx context.Context, onEvent func(routing.Event)) error
	metrics *metrics

	lastSkipped []string
	lastProblem string
	// needFull asks the next sync to compare everything with the kernel:
	// netlink reported a change that was not podnet's own. A Node change
	// alone only updates the table by that Node and writes what it says
	// differs, so one Node among 5,000 costs its own few entries, not a
	// walk over every peer nor a dump of their entries.
	needFull atomic.Bool
	// table is the routing plan in place, or being put in place (the
	// netlink watch compares the kernel's events with it); nil until the
	// first full sync. Its Config is the last full sync's (the underlay
	// found then).
	table atomic.Pointer[routing.Table]
	// dirty names the Nodes changed since the sync goroutine last looked.
	dirtyMu sync.Mutex
	dirty   map[string]struct{}
	// fullSyncs counts the full syncs (tests).
	fullSyncs atomic.Int64
	// lastFull is when the last full sync started (on clock), and
	// routesTook how long its routes took (the sysctls and chains go
	// beside them).
	lastFull   time.Time
	routesTook time.Duration
	// wentFull says the current sync is a full one (syncOnce sets it).
	wentFull bool
	status   netStatus
	// routed is closed after the first sync that put every route in
	// place (Routed).
	routed     chan struct{}
	routedOnce sync.Once
	// firstDone is closed when the first sync has ended, whatever its
	// outcome (AwaitFirstSync).
	firstDone     chan struct{}
	firstDoneOnce sync.Once
}

// AwaitFirstSync returns once the node network's first sync has ended, or
// after limit, or when ctx ends. The Service proxy's first sync waits on
// it, once the cluster state is loaded: at a node's start both would
// otherwise take the two cores at once (the first Service sync of 10,000
// Services against the routes to 5,000 Nodes), and a Service is of little
// use before the routes to its endpoints' nodes are in place; Services on
// a node restarted keep their rules in the kernel meanwhile.
func (n *Network) AwaitFirstSync(ctx context.Context, limit time.Duration) {
	select {
	case <-n.firstDone:
	case <-n.clock.After(limit):
		n.log.Warn("node network's first sync still running; the Service proxy starts without waiting longer", "waited", limit)
	case <-ctx.Done():
	}
}

// Routed is closed after the first sync that put every route in place.
func (n *Network) Routed() <-chan struct{} { return n.routed }

// Run reconciles the node network until ctx ends, once the cluster state
// is loaded.
func (n *Network) Run(ctx context.Context) error {
	select {
	case <-n.store.Synced():
	case <-ctx.Done():
		return nil
	}
	// Bursts (a state file with many Nodes, our own netlink echoes)
	// coalesce into one sync per MinSyncPeriod; a failed sync waits for
	// the next change or the periodic resync.
	r := runner.New(func() error { n.sync(); return nil }, runner.Options{MinInterval: n.o.MinSyncPeriod, MaxInterval: n.o.SyncPeriod, Clock: n.clock})
	n.followNodes(r.Trigger)
	n.needFull.Store(true)
	if n.watch != nil {
		go func() {
			err := n.watch(ctx, func(e routing.Event) { n.kernelChanged(e, r.Trigger) })
			if err != nil && ctx.Err() == nil {
				n.log.Warn("netlink watch failed; relying on the periodic resync", "err", err)
			}
		}()
	}
	r.Trigger()
	r.Run(ctx)
	return nil
}

// followNodes notes every Node change for the next sync, and calls trigger.
func (n *Network) followNodes(trigger func()) {
	n.store.Subscribe(func(ev cluster.Event) {
		if ev.Kind == cluster.KindNode {
			n.markDirty(ev.Key.Name)
			trigger()
		}
	})
}

// kernelChanged asks for a full sync (and calls trigger) unless e is the
// echo of a change of podnet's own: only changes made by someone else, or
// events lost, need the kernel compared with the plan.
func (n *Network) kernelChanged(e routing.Event, trigger func()) {
	if t := n.table.Load(); t == nil || !t.Matches(e) {
		n.needFull.Store(true)
		trigger()
	}
}

func (n *Network) markDirty(name string) {
	n.dirtyMu.Lock()
	defer n.dirtyMu.Unlock()
	if n.dirty == nil {
		n.dirty = make(map[string]struct{})
	}
	n.dirty[name] = struct{}{}
}

// takeDirty returns the Nodes changed since the last call, and forgets them.
func (n *Network) takeDirty() map[string]struct{} {
	n.dirtyMu.Lock()
	defer n.dirtyMu.Unlock()
	d := n.dirty
	n.dirty = nil
	return d
}

// sync does one reconciliation and records its outcome in health and
// metrics. It is full when netlink reported a change, after a failed sync
// and at least every SyncPeriod; otherwise (Nodes changed) it updates the
// routes from the last plan.
func (n *Network) sync() {
	defer n.firstDoneOnce.Do(func() {
		if n.firstDone != nil {
			close(n.firstDone)
		}
	})
	start := time.Now()
	full := n.needFull.Swap(false) || n.lastProblem != "" || n.clock.Now().Sub(n.lastFull) >= n.o.SyncPeriod
	n.wentFull = false
	changes, err := n.syncOnce(full)
	took := time.Since(start)
	n.metrics.syncs.Inc()
	n.metrics.syncDuration.Observe(took.Seconds())
	full = n.wentFull
	if full {
		n.fullSyncs.Add(1)
	}
	if changes > 0 && full {
		n.log.Info("node network synced", "changes", changes, "took", took, "full", full, "routes", n.routesTook)
	} else if changes > 0 {
		n.log.Info("node network synced", "changes", changes, "took", took, "full", full)
	}
	if err != nil {
		n.metrics.syncErrors.Inc()
		if err.Error() != n.lastProblem {
			n.log.Warn("node network not ready", "err", err)
		}
		n.lastProblem = err.Error()
		n.health.Set(Component, err)
		return
	}
	if n.lastProblem != "" {
		n.log.Info("node network ready")
	}
	n.lastProblem = ""
	n.health.Set(Component, nil)
	if n.routed != nil {
		n.routedOnce.Do(func() { close(n.routed) })
	}
}

// underlay is the interface that carries the node's InternalIP.
type underlay struct {
	iface  string
	subnet netip.Prefix
	mtu    int
}

// findUnderlay finds the interface holding ip (only iface, if set), its
// subnet and MTU.
func findUnderlay(links []link.Interface, iface string, ip netip.Addr) (underlay, error) {
	if l, a, ok := link.Holding(links, iface, ip); ok {
		return underlay{iface: l.Name, subnet: a.Masked(), mtu: l.MTU}, nil
	}
	if iface != "" {
		return underlay{}, fmt.Errorf("--iface %s does not hold the node's InternalIP %s", iface, ip)
	}
	return underlay{}, fmt.Errorf("no interface holds the node's InternalIP %s (set --iface)", ip)
}

// syncOnce reconciles the node network once and returns how many kernel
// objects it changed. A full sync finds the underlay, makes sure of the
// sysctls and iptables chains, builds the routing table from every Node
// and compares the routes, neighbours and FDB entries with the kernel's;
// otherwise only the Nodes changed since the last sync update the table,
// and what that changes is written (unless this node itself changed,
// which asks for a full sync).
func (n *Network) syncOnce(full bool) (int, error) {
	dirty := n.takeDirty()
	t := n.table.Load()
	if _, self := dirty[n.o.NodeName]; !full && !self && t != nil {
		return n.updateRoutes(t, dirty)
	}
	self := n.store.Node(n.o.NodeName)
	if self == nil {
		return 0, fmt.Errorf("node %q is not in the cluster state", n.o.NodeName)
	}
	fam := ipfamily.OfPrefix(n.o.ClusterCIDR)
	ip, ok := self.InternalIP(fam)
	if !ok {
		return 0, fmt.Errorf("node %q has no %v InternalIP", n.o.NodeName, fam)
	}
	n.lastFull = n.clock.Now()
	n.wentFull = true
	u, err := n.underlay(ip)
	if err != nil {
		return 0, err
	}
	cfg := routing.Config{
		NodeName: n.o.NodeName, Backend: n.o.Backend, Family: fam, NodeIP: ip, NodeSubnet: u.subnet,
		Iface: u.iface, UnderlayMTU: u.mtu, Device: routing.DefaultDevice, VNI: n.o.VXLANVNI, Port: n.o.VXLANPort,
	}
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	// The sysctls and chains beside the routes: neither needs the other,
	// and the iptables commands wait for the xtables lock while the
	// Service proxy's first restore holds it.
	host := make(chan error, 1)
	go func() { host <- n.ensureHost() }()
	start := time.Now()
	changes, err := n.applyRoutes(routing.NewTable(cfg, n.store.Nodes()))
	n.routesTook = time.Since(start)
	return changes, errors.Join(<-host, err)
}

// ensureHost makes sure of the sysctls and podnet's iptables chains.
func (n *Network) ensureHost() error {
	var errs []error
	if err := hostnet.EnsureSysctls(n.sysctl, n.mod); err != nil {
		errs = append(errs, err)
	}
	if changed, err := n.firewall.Ensure(hostnet.Rules{ClusterCIDR: n.o.ClusterCIDR, Masquerade: n.o.Masquerade, ServiceHooks: n.hooks}); err != nil {
		errs = append(errs, fmt.Errorf("iptables: %w", err))
	} else if changed {
		n.log.Info("iptables chains written", "chains", []string{hostnet.ChainPostrouting, hostnet.ChainForward})
	}
	return errors.Join(errs...)
}

// applyRoutes puts table's plan in place, compared with the kernel, and
// writes the node config.
func (n *Network) applyRoutes(t *routing.Table) (int, error) {
	plan := t.Plan()
	n.logSkipped(plan.Skipped)
	// In place before the first change, so that the netlink watch
	// recognises the changes' echoes as podnet's own.
	n.table.Store(t)
	changes, err := n.rec.Apply(plan)
	errs := []error{n.recordRoutes(t, changes, err)}
	cfg := t.Config()
	if !plan.PodCIDR.IsValid() {
		errs = append(errs, fmt.Errorf("node %q has no spec.podCIDR yet (pods cannot start until it has one)", n.o.NodeName))
	} else if err := n.writeNodeConfig(nodeconfig.Config{PodCIDR: plan.PodCIDR, ClusterCIDR: n.o.ClusterCIDR, MTU: cfg.PodMTU()}); err != nil {
		errs = append(errs, err)
	}
	return len(changes), errors.Join(errs...)
}

// updateRoutes updates the table by the Nodes in dirty and writes what
// that changes. The node config depends on this node alone, which is not
// among them.
func (n *Network) updateRoutes(t *routing.Table, dirty map[string]struct{}) (int, error) {
	nodes := make(map[string]*cluster.Node, len(dirty))
	for name := range dirty {
		nodes[name] = n.store.Node(name) // nil: deleted
	}
	changes, err := n.rec.Patch(t.Update(nodes))
	n.logSkipped(t.Skipped())
	return len(changes), n.recordRoutes(t, changes, err)
}

// logSkipped says which Nodes cannot be routed to, when that changed.
func (n *Network) logSkipped(skipped []string) {
	if slices.Equal(skipped, n.lastSkipped) {
		return
	}
	n.lastSkipped = skipped
	for _, sk := range skipped {
		n.log.Warn("peer not routed", "reason", sk)
	}
}

// recordRoutes logs a reconciliation's changes and records its outcome
// in status and metrics.
func (n *Network) recordRoutes(t *routing.Table, changes []string, err error) error {
	n.status.record(t, err)
	logChanges(n.log, changes)
	n.metrics.changes.Add(float64(len(changes)))
	vx, gw := t.Peers()
	n.metrics.peers.WithLabelValues("vxlan").Set(float64(vx))
	n.metrics.peers.WithLabelValues("host-gw").Set(float64(gw))
	if err != nil {
		return fmt.Errorf("routes: %w", err)
	}
	return nil
}

// maxChangesLogged bounds the lines one sync logs: the first sync of a
// node in a cluster of 5,000 makes 15,000 changes, and a line each cost
// more than the changes themselves.
const maxChangesLogged = 20

// logChanges logs each change, up to maxChangesLogged, then how many more.
func logChanges(log *slog.Logger, changes []string) {
	for i, c := range changes {
		if i == maxChangesLogged {
			log.Info("node network changed", "more", len(changes)-i)
			return
		}
		log.Info("node network changed", "change", c)
	}
}

func (n *Network) writeNodeConfig(c nodeconfig.Config) error {
	if have, err := nodeconfig.Read(n.o.NodeConfigPath); err == nil && reflect.DeepEqual(have, c) {
		return nil
	} else if err != nil && !errors.Is(err, nodeconfig.ErrNotFound) {
		n.log.Warn("rewriting unreadable node config", "path", n.o.NodeConfigPath, "err", err)
	}
	if err := nodeconfig.Write(n.o.NodeConfigPath, c); err != nil {
		return err
	}
	n.log.Info("node config written", "path", n.o.NodeConfigPath, "podCIDR", c.PodCIDR, "clusterCIDR", c.ClusterCIDR, "mtu", c.MTU)
	return nil
}

// Cleanup removes what the node network created: podnet's iptables chains
// (from both iptables backends), the VXLAN device and podnet's routes. The
// node config stays, so pods that still run keep a consistent view.
func Cleanup(logger *slog.Logger) error {
	var errs []error
	for _, b := range ipt.Backends {
		r := ipt.Runner{Backend: b}
		if !r.Contains(hostnet.ChainPrefix) {
			continue
		}
		if chains, err := r.Chains(); err != nil {
			errs = append(errs, err)
		} else if err := hostnet.RemoveChains(chains); err != nil {
			errs = append(errs, fmt.Errorf("iptables-%s: %w", b, err))
		}
	}
	// proxyd routes IPv4 only until dual-stack is wired (issue 22).
	k, err := routing.NewNetlinkKernel(netns.None(), ipfamily.IPv4)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer k.Close()
	rec := &routing.Reconciler{Kernel: k, Device: routing.DefaultDevice}
	// An empty plan without a device: the reconciler removes everything
	// tagged as podnet's.
	changes, err := rec.Apply(routing.Plan{})
	for _, c := range changes {
		logger.Info("cleanup", "change", c)
	}
	if err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
