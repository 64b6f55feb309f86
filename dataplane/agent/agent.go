// Package agent is proxyd's node agent: it reads the cluster state, gives
// the node its pod network (the node config for the CNI plugin, routes to
// every other node's pods, sysctls, masquerading) and runs the Service
// proxy beside it, with /healthz and /metrics. The proxy's mode comes
// chosen and probed from main (proxy.Modes.Select); the agent knows no
// backend, only package proxy.
//
// The node network is reconciled, never rebuilt. A Node change updates the
// routing table by that Node and writes only the entries that differ; a
// full sync compares the whole plan with the kernel, at start, after a
// failure, on netlink events that are not the echo of podnet's own changes
// (someone removed a route) and at every periodic resync.
package agent

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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/podnet/podnet/dataplane/app"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
	"github.com/podnet/podnet/dataplane/cluster/statedir"
	"github.com/podnet/podnet/dataplane/health"
	"github.com/podnet/podnet/dataplane/hostnet"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/ipt"
	"github.com/podnet/podnet/dataplane/link"
	"github.com/podnet/podnet/dataplane/nodeconfig"
	"github.com/podnet/podnet/dataplane/nodestatus"
	"github.com/podnet/podnet/dataplane/podcidr"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/routing"
	"github.com/podnet/podnet/dataplane/runner"
	"github.com/podnet/podnet/dataplane/status"
)

// Options configure the agent. Defaults are the flags' defaults.
type Options struct {
	NodeName string
	// Kube is the API server to read the cluster from; when nil, StateDir.
	Kube     *rest.Config
	StateDir string
	// StateLimits are what StateDir's Services are checked against.
	StateLimits convert.Limits
	// AllocateNodeCIDRs claims a podCIDR for this node when its Node has
	// none (needs Kube).
	AllocateNodeCIDRs bool
	// ClaimNamespace holds the podCIDR claims' Leases; "":
	// podcidr.DefaultNamespace.
	ClaimNamespace string
	ClusterCIDR    netip.Prefix
	Backend        routing.Backend
	VXLANVNI       int
	VXLANPort      int
	Iface          string // "" = the interface holding the node's InternalIP
	NodeConfigPath string
	Masquerade     bool
	SyncPeriod     time.Duration
	MinSyncPeriod  time.Duration
	HealthzAddr    string // "" disables
	MetricsAddr    string // "" disables
	// IPTables runs the iptables commands for the node's chains; zero:
	// the backend the node uses (ipt.NodeBackend, the Service proxy's too).
	IPTables ipt.Runner
	// ServiceProxy is the Service proxy run beside the node network; nil:
	// none. Its sync periods are the agent's.
	ServiceProxy *proxy.ServiceOptions
	// Kernel replaces parts of the node's kernel (tests); nil: the real one.
	Kernel *Kernel
	Logger *slog.Logger
}

// Validate names the first option that is wrong.
func (o Options) Validate() error {
	switch {
	case o.NodeName == "":
		return errors.New("--node-name: empty")
	case o.StateDir == "" && o.Kube == nil:
		return errors.New("no cluster state source: set --state-dir or --kubeconfig")
	case o.StateDir != "" && o.Kube != nil:
		return errors.New("--state-dir and --kubeconfig: choose one cluster state source")
	case o.AllocateNodeCIDRs && o.Kube == nil:
		return errors.New("--allocate-node-cidrs: needs the API server (--kubeconfig or in-cluster)")
	case !o.ClusterCIDR.IsValid() || !o.ClusterCIDR.Addr().Is4():
		return fmt.Errorf("--cluster-cidr: %v is not an IPv4 prefix", o.ClusterCIDR)
	case o.NodeConfigPath == "":
		return errors.New("--node-config: empty")
	case o.SyncPeriod <= 0:
		return fmt.Errorf("--sync-period: %v must be positive", o.SyncPeriod)
	case o.MinSyncPeriod < 0 || o.MinSyncPeriod > o.SyncPeriod:
		return fmt.Errorf("--min-sync-period: %v must be between 0 and --sync-period", o.MinSyncPeriod)
	}
	switch o.Backend {
	case routing.BackendAuto, routing.BackendHostGW, routing.BackendVXLAN:
	default:
		return fmt.Errorf("--backend: %q is not auto, host-gw or vxlan", o.Backend)
	}
	if o.VXLANVNI < 1 || o.VXLANVNI > 1<<24-1 {
		return fmt.Errorf("--vxlan-vni: %d out of range 1-16777215", o.VXLANVNI)
	}
	if o.VXLANPort < 1 || o.VXLANPort > 65535 {
		return fmt.Errorf("--vxlan-port: %d out of range 1-65535", o.VXLANPort)
	}
	return nil
}

// Health component names.
const (
	componentState   = "cluster-state"
	componentNetwork = "node-network"
)

// Kernel is what the agent reads and changes on the node. Run uses the
// real thing for every field left nil; tests pass fakes.
type Kernel struct {
	Routes   routing.Kernel
	IPTables hostnet.IPTables
	Sysctl   hostnet.Sysctl
	Modprobe hostnet.Modprobe
	// Links lists the node's interfaces with their addresses (where the
	// underlay is found).
	Links func() ([]Link, error)
	// Watch reports the kernel's changes to podnet's routes, neighbours,
	// FDB entries and links until ctx ends (routing.Watch).
	Watch func(ctx context.Context, onEvent func(routing.Event)) error
}

// Link is one of the node's interfaces.
type Link = link.Interface

// kernel fills k's nil fields with the real kernel; close releases what
// it opened.
func (o Options) kernel() (k Kernel, close func(), err error) {
	if o.Kernel != nil {
		k = *o.Kernel
	}
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
		nk, err := routing.NewNetlinkKernel(netns.None(), ipfamily.OfPrefix(o.ClusterCIDR))
		if err != nil {
			close()
			return k, func() {}, err
		}
		closers = append(closers, nk.Close)
		k.Routes = nk
	}
	if k.IPTables == nil {
		chains, err := o.IPTables.Chains()
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

// Run runs the agent until ctx ends.
func Run(ctx context.Context, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	log := o.Logger
	if o.IPTables.Backend == "" && (o.Kernel == nil || o.Kernel.IPTables == nil) {
		o.IPTables.Backend = ipt.NodeBackend()
	}
	reg := app.NewRegistry()
	checker := health.NewChecker()
	// /healthz follows the Service proxy only, as kube-proxy's does: the
	// node network and the cluster state report through checker, which
	// /healthz names in its body without failing on it.
	progress := health.NewProgress(2*o.SyncPeriod, reg)
	progress.Note(checker)
	board := &status.Board{}
	board.Provide(StatusHealth, func() any { return healthStatus(progress, checker) })
	checker.Set(componentState, errors.New("cluster state not loaded yet"))
	checker.Set(componentNetwork, errors.New("node network not synced yet"))

	src, err := app.NewSource(app.SourceOptions{StateDir: o.StateDir, StateLimits: o.StateLimits, Kube: o.Kube, Logger: log})
	if err != nil {
		return err
	}
	if src.StateDir != nil {
		statedir.RegisterMetrics(reg, src.StateDir)
	}
	followNodeLeaving(src.Store, o.NodeName, progress)
	var client kubernetes.Interface
	if o.Kube != nil {
		if client, err = kubernetes.NewForConfig(o.Kube); err != nil {
			return fmt.Errorf("kubernetes client: %w", err)
		}
	}
	k, closeKernel, err := o.kernel()
	if err != nil {
		return err
	}
	defer closeKernel()
	n := newNodeNet(o, k, src, checker, reg)
	if client != nil {
		n.routed = make(chan struct{})
	}
	board.Provide(StatusNode, func() any { return n.report(src) })

	g := app.NewGroup(ctx)
	// Listen before anything else so a port conflict fails at start.
	if err := app.Serve(g, log, endpoints(o, reg, progress, board)...); err != nil {
		return err
	}
	g.Go("cluster state", src.Run)
	g.Go("state sync", func(ctx context.Context) error {
		return watchState(ctx, src, checker, log)
	})
	if client != nil {
		goKube(g, o, client, n.routed)
	}
	g.Go("node network", n.run)
	if o.ServiceProxy != nil {
		sp := *o.ServiceProxy
		sp.SyncPeriod, sp.MinSyncPeriod = o.SyncPeriod, o.MinSyncPeriod
		g.Go("service proxy", func(ctx context.Context) error {
			return proxy.RunService(ctx, sp, proxy.Env{
				Store: src.Store, Health: checker, Progress: progress, Status: board, Metrics: reg, Logger: log.With("component", "service-proxy"),
				BeforeFirstSync: func(ctx context.Context) { n.awaitFirstSync(ctx, routesFirstLimit) },
			})
		})
	}
	return g.Wait()
}

// newNodeNet wires the node network's reconciler to the kernel k.
func newNodeNet(o Options, k Kernel, src app.Source, checker *health.Checker, reg prometheus.Registerer) *nodeNet {
	return &nodeNet{
		o:      o,
		log:    o.Logger.With("component", "node-network"),
		store:  src.Store,
		health: checker,
		underlay: func(ip netip.Addr) (underlay, error) {
			links, err := k.Links()
			if err != nil {
				return underlay{}, fmt.Errorf("list links: %w", err)
			}
			return findUnderlay(links, o.Iface, ip)
		},
		rec:       &routing.Reconciler{Kernel: k.Routes, Device: routing.DefaultDevice},
		firewall:  hostnet.IPTablesFirewall{IPT: k.IPTables},
		hooks:     serviceHooks(o.ServiceProxy),
		sysctl:    k.Sysctl,
		mod:       k.Modprobe,
		watch:     k.Watch,
		metrics:   newMetrics(reg, src.FileErrors, src.Stale),
		firstDone: make(chan struct{}),
	}
}

// serviceHooks are the hooks of every mode the daemon offers (sp.Modes):
// the chosen one's, and those a mode switched away from keeps until its
// state is removed.
func serviceHooks(sp *proxy.ServiceOptions) []hostnet.Hook {
	if sp == nil {
		return nil
	}
	var out []hostnet.Hook
	for _, h := range sp.Modes.Hooks() {
		out = append(out, hostnet.Hook(h))
	}
	return out
}

// goKube runs what the agent does through the API server: claiming the
// node's podCIDR (with --allocate-node-cidrs) and, once every route is in
// place (routed closes), marking the node's network available.
func goKube(g *app.Group, o Options, client kubernetes.Interface, routed <-chan struct{}) {
	log := o.Logger
	if o.AllocateNodeCIDRs {
		g.Go("podCIDR allocation", func(ctx context.Context) error {
			return retry(ctx, log, "claim a podCIDR", func() error {
				p, err := podcidr.Ensure(ctx, podcidr.Options{Client: client, NodeName: o.NodeName, ClusterCIDR: o.ClusterCIDR, Namespace: o.ClaimNamespace})
				if err == nil {
					log.Info("node podCIDR", "podCIDR", p)
				}
				return err
			})
		})
	}
	g.Go("node status", func(ctx context.Context) error {
		select {
		case <-routed:
		case <-ctx.Done():
			return nil
		}
		return retry(ctx, log, "set NetworkUnavailable=False", func() error {
			return nodestatus.SetNetworkAvailable(ctx, client, o.NodeName)
		})
	})
}

// watchState reports the cluster state's health: not loaded until the
// source has delivered it all, then stale while the API server is away
// (the last known state keeps being served).
func watchState(ctx context.Context, src app.Source, checker *health.Checker, log *slog.Logger) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	// Until the state is loaded nothing is programmed (the kernel keeps
	// what an earlier run left); /healthz says why.
wait:
	for {
		select {
		case <-src.Store.Synced():
			checker.Set(componentState, nil)
			log.Info("cluster state loaded", "nodes", len(src.Store.Nodes()), "services", len(src.Store.Services()))
			break wait
		case <-tick.C:
			if err := src.Stale(); err != nil {
				checker.Set(componentState, fmt.Errorf("cluster state not loaded yet, kernel rules left as they are: %w", err))
			}
		case <-ctx.Done():
			return nil
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			checker.Set(componentState, src.Stale())
		}
	}
}

type nodeNet struct {
	o      Options
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
	// lastFull is when the last full sync started, and routesTook how
	// long its routes took (the sysctls and chains go beside them).
	lastFull   time.Time
	routesTook time.Duration
	// syncStart is when the current sync started (lastFull when it is
	// a full one).
	syncStart time.Time
	status    netStatus
	// routed, when set, is closed after the first sync that put every
	// route in place.
	routed     chan struct{}
	routedOnce sync.Once
	// firstDone is closed when the first sync has ended, whatever its
	// outcome (awaitFirstSync).
	firstDone     chan struct{}
	firstDoneOnce sync.Once
}

// routesFirstLimit bounds how long the Service proxy waits for the node
// network's first sync once the cluster state is loaded.
const routesFirstLimit = 5 * time.Second

// awaitFirstSync returns once the node network's first sync has ended, or
// after limit, or when ctx ends. The Service proxy's first sync waits on
// it, once the cluster state is loaded: at a node's start both would
// otherwise take the two cores at once (the first Service sync of 10,000
// Services against the routes to 5,000 Nodes), and a Service is of little
// use before the routes to its endpoints' nodes are in place; Services on
// a node restarted keep their rules in the kernel meanwhile.
func (n *nodeNet) awaitFirstSync(ctx context.Context, limit time.Duration) {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-n.firstDone:
	case <-t.C:
		n.log.Warn("node network's first sync still running; the Service proxy starts without waiting longer", "waited", limit)
	case <-ctx.Done():
	}
}

// retry calls f until it succeeds or ctx ends, backing off from 1 s to 30 s.
func retry(ctx context.Context, log *slog.Logger, what string, f func() error) error {
	wait := time.Second
	for {
		err := f()
		if err == nil || ctx.Err() != nil {
			return nil
		}
		log.Warn("retrying", "what", what, "in", wait, "err", err)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil
		}
		wait = min(2*wait, 30*time.Second)
	}
}

func (n *nodeNet) run(ctx context.Context) error {
	select {
	case <-n.store.Synced():
	case <-ctx.Done():
		return nil
	}
	// Bursts (a state file with many Nodes, our own netlink echoes)
	// coalesce into one sync per MinSyncPeriod; a failed sync waits for
	// the next change or the periodic resync.
	r := runner.New(func() error { n.sync(); return nil }, runner.Options{MinInterval: n.o.MinSyncPeriod, MaxInterval: n.o.SyncPeriod})
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
func (n *nodeNet) followNodes(trigger func()) {
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
func (n *nodeNet) kernelChanged(e routing.Event, trigger func()) {
	if t := n.table.Load(); t == nil || !t.Matches(e) {
		n.needFull.Store(true)
		trigger()
	}
}

func (n *nodeNet) markDirty(name string) {
	n.dirtyMu.Lock()
	defer n.dirtyMu.Unlock()
	if n.dirty == nil {
		n.dirty = make(map[string]struct{})
	}
	n.dirty[name] = struct{}{}
}

// takeDirty returns the Nodes changed since the last call, and forgets them.
func (n *nodeNet) takeDirty() map[string]struct{} {
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
func (n *nodeNet) sync() {
	defer n.firstDoneOnce.Do(func() {
		if n.firstDone != nil {
			close(n.firstDone)
		}
	})
	start := time.Now()
	full := n.needFull.Swap(false) || n.lastProblem != "" || start.Sub(n.lastFull) >= n.o.SyncPeriod
	n.syncStart = start
	changes, err := n.syncOnce(full)
	took := time.Since(start)
	n.metrics.syncs.Inc()
	n.metrics.syncDuration.Observe(took.Seconds())
	full = n.lastFull.Equal(n.syncStart)
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
		n.health.Set(componentNetwork, err)
		return
	}
	if n.lastProblem != "" {
		n.log.Info("node network ready")
	}
	n.lastProblem = ""
	n.health.Set(componentNetwork, nil)
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
func findUnderlay(links []Link, iface string, ip netip.Addr) (underlay, error) {
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
func (n *nodeNet) syncOnce(full bool) (int, error) {
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
	n.lastFull = time.Now()
	n.syncStart = n.lastFull
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
func (n *nodeNet) ensureHost() error {
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
func (n *nodeNet) applyRoutes(t *routing.Table) (int, error) {
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
func (n *nodeNet) updateRoutes(t *routing.Table, dirty map[string]struct{}) (int, error) {
	nodes := make(map[string]*cluster.Node, len(dirty))
	for name := range dirty {
		nodes[name] = n.store.Node(name) // nil: deleted
	}
	changes, err := n.rec.Patch(t.Update(nodes))
	n.logSkipped(t.Skipped())
	return len(changes), n.recordRoutes(t, changes, err)
}

// logSkipped says which Nodes cannot be routed to, when that changed.
func (n *nodeNet) logSkipped(skipped []string) {
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
func (n *nodeNet) recordRoutes(t *routing.Table, changes []string, err error) error {
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

func (n *nodeNet) writeNodeConfig(c nodeconfig.Config) error {
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

// Cleanup removes what the node agent created: podnet's iptables chains
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
