// Package nodenet converges the node's own network: the node config the
// CNI plugin reads (podCIDRs, cluster CIDRs, MTU), routes, neighbours and FDB
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
//
// Each family of the cluster CIDRs (IPv4, IPv6 or both) has its own
// routing table, reconciler and firewall (iptables, ip6tables); VXLAN runs
// over the family of the node's first InternalIP, one device for both pod
// families, whose FDB entries each family's reconciler leaves to the
// other when it wants them too.
package nodenet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
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
	NodeName string
	// ClusterCIDRs holds one cluster CIDR per family the node serves.
	ClusterCIDRs   []netip.Prefix
	Backend        routing.Backend
	VXLANVNI       int
	VXLANPort      int
	Iface          string // "" = the interface holding the node's InternalIP
	NodeConfigPath string
	Masquerade     bool
	SyncPeriod     time.Duration
	MinSyncPeriod  time.Duration
	// NoPodNetwork leaves the pod network to another (flannel while a
	// cluster migrates): no routes, VXLAN device, node config or
	// masquerade; only the sysctls and the Service proxy's hooks.
	NoPodNetwork bool
	// ServiceHooks are the Service proxy's jumps in built-in chains, which
	// the node firewall orders its own rules behind.
	ServiceHooks []hostnet.Hook
	// Firewall, when set, gives the node firewall of a family in place of
	// podnet's iptables chains (which are then removed): the Service
	// proxy mode's own (nftables).
	Firewall func(ipfamily.Family) hostnet.NodeFirewall
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
	// Routes and IPTables hold one kernel per family.
	Routes   map[ipfamily.Family]routing.Kernel
	IPTables map[ipfamily.Family]hostnet.IPTables
	Sysctl   hostnet.Sysctl
	Modprobe hostnet.Modprobe
	// Links lists the node's interfaces with their addresses (where the
	// underlay is found).
	Links func() ([]link.Interface, error)
	// Watch reports the kernel's changes to podnet's routes, neighbours,
	// FDB entries and links until ctx ends (routing.Watch).
	Watch func(ctx context.Context, onEvent func(routing.Event)) error
}

// WithReal fills k's missing parts with the real kernel: routes of each
// of families, iptables (or ip6tables) through iptables; close releases
// what it opened.
func (k Kernel) WithReal(families []ipfamily.Family, iptables ipt.Runner) (_ Kernel, close func(), err error) {
	var closers []func()
	close = func() {
		for _, c := range closers {
			c()
		}
	}
	if k.Links == nil {
		k.Links = link.Interfaces
	}
	routes, chains := maps.Clone(k.Routes), maps.Clone(k.IPTables)
	if routes == nil {
		routes = make(map[ipfamily.Family]routing.Kernel)
	}
	if chains == nil {
		chains = make(map[ipfamily.Family]hostnet.IPTables)
	}
	for _, f := range families {
		if routes[f] == nil {
			nk, err := routing.NewNetlinkKernel(netns.None(), f)
			if err != nil {
				close()
				return k, func() {}, err
			}
			closers = append(closers, nk.Close)
			routes[f] = nk
		}
		if chains[f] == nil {
			r := iptables
			r.Family = f
			c, err := r.Chains()
			if err != nil {
				close()
				return k, func() {}, fmt.Errorf("%v iptables: %w", f, err)
			}
			chains[f] = c
		}
	}
	k.Routes, k.IPTables = routes, chains
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
	var fams []*family
	for _, cidr := range c.ClusterCIDRs {
		f := ipfamily.OfPrefix(cidr)
		fm := newFamily(cidr, k.Routes[f], k.IPTables[f])
		if c.Firewall != nil {
			fm.firewall = &replacing{NodeFirewall: c.Firewall(f), old: fm.firewall, log: log}
		}
		fams = append(fams, fm)
	}
	linkFamilies(fams)
	return &Network{
		fams:   fams,
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
		hooks:     c.ServiceHooks,
		sysctl:    k.Sysctl,
		mod:       k.Modprobe,
		watch:     k.Watch,
		metrics:   newMetrics(reg),
		routed:    make(chan struct{}),
		firstDone: make(chan struct{}),
	}
}

// family is one address family's part of the node network: its cluster
// CIDR, routing table, reconciler and firewall.
type family struct {
	f        ipfamily.Family
	cluster  netip.Prefix
	rec      *routing.Reconciler
	firewall hostnet.NodeFirewall
	// table is the routing plan in place, or being put in place (the
	// netlink watch compares the kernel's events with it); nil until the
	// first full sync. Its Config is the last full sync's (the underlay
	// found then).
	table  atomic.Pointer[routing.Table]
	status netStatus
}

func newFamily(cluster netip.Prefix, routes routing.Kernel, chains hostnet.IPTables) *family {
	return &family{
		f: ipfamily.OfPrefix(cluster), cluster: cluster,
		rec:      &routing.Reconciler{Kernel: routes, Device: routing.DefaultDevice},
		firewall: hostnet.IPTablesFirewall{IPT: chains},
	}
}

// replacing is a node firewall taking over from another: the old one's
// rules are removed once the new one holds, retried until that succeeds
// (a node without iptables has none to remove).
type replacing struct {
	hostnet.NodeFirewall
	old  hostnet.NodeFirewall
	log  *slog.Logger
	done bool
}

func (r *replacing) Ensure(rules hostnet.Rules) (bool, error) {
	changed, err := r.NodeFirewall.Ensure(rules)
	if err == nil && !r.done {
		if rerr := r.old.Remove(); rerr != nil {
			r.log.Debug("remove the iptables node firewall", "err", rerr)
		} else {
			r.done = true
		}
	}
	return changed, err
}

// linkFamilies lets each family's reconciler leave the FDB entries the
// other families' tables want: they share the one VXLAN device.
func linkFamilies(fams []*family) {
	for _, fm := range fams {
		others := slices.DeleteFunc(slices.Clone(fams), func(o *family) bool { return o == fm })
		if len(others) == 0 {
			continue
		}
		fm.rec.SharedFDB = func(e routing.FDB) bool {
			for _, o := range others {
				if t := o.table.Load(); t != nil && t.HasFDB(e) {
					return true
				}
			}
			return false
		}
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
	// fams are the families served, in the order of ClusterCIDRs.
	fams []*family
	// hooks are the Service proxy's, which the firewall stays behind.
	hooks  []hostnet.Hook
	sysctl hostnet.Sysctl
	mod    hostnet.Modprobe
	// watch reports netlink changes; nil: none (the periodic resync only).
	watch   func(ctx context.Context, onEvent func(routing.Event)) error
	metrics *metrics

	lastSkipped map[ipfamily.Family][]string
	lastProblem string
	// needFull asks the next sync to compare everything with the kernel:
	// netlink reported a change that was not podnet's own. A Node change
	// alone only updates the table by that Node and writes what it says
	// differs, so one Node among 5,000 costs its own few entries, not a
	// walk over every peer nor a dump of their entries.
	needFull atomic.Bool
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
	if !n.matches(e) {
		n.needFull.Store(true)
		trigger()
	}
}

// matches reports whether every family's table takes e for the echo of
// podnet's own change: a route or neighbour is its family's alone; an FDB
// entry (shared by the families on the one device) is wanted when any
// table wants it; a link event must suit every table.
func (n *Network) matches(e routing.Event) bool {
	var tables []*routing.Table
	for _, fm := range n.fams {
		t := fm.table.Load()
		if t == nil {
			return false
		}
		tables = append(tables, t)
	}
	switch e.Kind {
	case routing.EventRoute, routing.EventNeigh:
		for i, fm := range n.fams {
			if fm.f.Has(e.Route.Dst.Addr()) || fm.f.Has(e.Neigh.IP) {
				return tables[i].Matches(e)
			}
		}
		return false
	case routing.EventFDB:
		wanted := slices.ContainsFunc(tables, func(t *routing.Table) bool { return t.HasFDB(e.FDB) })
		return wanted != e.Deleted
	}
	for _, t := range tables {
		if !t.Matches(e) {
			return false
		}
	}
	return len(tables) > 0
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
// sysctls and iptables chains, builds each family's routing table from
// every Node and compares the routes, neighbours and FDB entries with the
// kernel's; otherwise only the Nodes changed since the last sync update
// the tables, and what that changes is written (unless this node itself
// changed, which asks for a full sync).
func (n *Network) syncOnce(full bool) (int, error) {
	dirty := n.takeDirty()
	if n.o.NoPodNetwork {
		n.lastFull, n.wentFull = n.clock.Now(), true
		return 0, n.ensureHost()
	}
	if _, self := dirty[n.o.NodeName]; !full && !self && n.fams[0].table.Load() != nil {
		return n.updateRoutes(dirty)
	}
	self := n.store.Node(n.o.NodeName)
	if self == nil {
		return 0, fmt.Errorf("node %q is not in the cluster state", n.o.NodeName)
	}
	n.lastFull = n.clock.Now()
	n.wentFull = true
	cfgs, err := n.configs(self)
	if err != nil {
		return 0, err
	}
	// The sysctls and chains beside the routes: neither needs the other,
	// and the iptables commands wait for the xtables lock while the
	// Service proxy's first restore holds it.
	host := make(chan error, 1)
	go func() { host <- n.ensureHost() }()
	start := time.Now()
	nodes := n.store.Nodes()
	tables := make([]*routing.Table, len(n.fams))
	for i, cfg := range cfgs {
		tables[i] = routing.NewTable(cfg, nodes)
	}
	changes, err := n.applyRoutes(tables)
	n.routesTook = time.Since(start)
	return changes, errors.Join(<-host, err)
}

// configs are the routing configs of each family for the node self. VXLAN
// runs over the family of the node's first InternalIP (kubelet lists the
// --node-ip it was given first); host-gw for a family needs an address of
// it.
func (n *Network) configs(self *cluster.Node) ([]routing.Config, error) {
	if len(self.InternalIPs) == 0 {
		return nil, fmt.Errorf("node %q has no InternalIP", n.o.NodeName)
	}
	uip := self.InternalIPs[0]
	uu, err := n.underlay(uip)
	if err != nil {
		return nil, err
	}
	var cfgs []routing.Config
	for _, fm := range n.fams {
		cfg := routing.Config{
			NodeName: n.o.NodeName, Backend: n.o.Backend, Family: fm.f, Underlay: uip, UnderlayIface: uu.iface,
			UnderlayMTU: uu.mtu, Device: routing.DefaultDevice, VNI: n.o.VXLANVNI, Port: n.o.VXLANPort,
		}
		if ip, ok := self.InternalIP(fm.f); ok {
			u, err := n.underlay(ip)
			if err != nil {
				return nil, err
			}
			cfg.NodeIP, cfg.NodeSubnet, cfg.Iface = ip, u.subnet, u.iface
		}
		if err := cfg.Validate(); err != nil {
			return nil, fmt.Errorf("%v: %w", fm.f, err)
		}
		cfgs = append(cfgs, cfg)
	}
	return cfgs, nil
}

// families lists the families served.
func (n *Network) families() []ipfamily.Family {
	out := make([]ipfamily.Family, len(n.fams))
	for i, fm := range n.fams {
		out[i] = fm.f
	}
	return out
}

// ensureHost makes sure of the sysctls and the node firewall of each
// family (podnet's iptables chains, or the rules of the mode that brings
// its own).
func (n *Network) ensureHost() error {
	var errs []error
	if err := hostnet.EnsureSysctls(n.sysctl, n.mod, n.families()...); err != nil {
		errs = append(errs, err)
	}
	for _, fm := range n.fams {
		if changed, err := fm.firewall.Ensure(hostnet.Rules{ClusterCIDR: fm.cluster, Masquerade: n.o.Masquerade && !n.o.NoPodNetwork, ServiceHooks: n.hooks}); err != nil {
			errs = append(errs, fmt.Errorf("%v node firewall: %w", fm.f, err))
		} else if changed {
			n.log.Info("node firewall written", "family", fm.f)
		}
	}
	return errors.Join(errs...)
}

// applyRoutes puts each family's table in place, compared with the
// kernel, and writes the node config: every family's podCIDR, and the
// smallest of their pod MTUs (one underlay, one device: they agree).
func (n *Network) applyRoutes(tables []*routing.Table) (int, error) {
	var errs []error
	var pods []netip.Prefix
	changed, mtu := 0, 0
	// Every table in place before the first change, so that the netlink
	// watch recognises the changes' echoes as podnet's own and neither
	// family's reconciler removes an FDB entry only the other wants.
	for i, fm := range n.fams {
		fm.table.Store(tables[i])
	}
	for i, fm := range n.fams {
		t := tables[i]
		plan := t.Plan()
		n.logSkipped(fm.f, plan.Skipped)
		changes, err := fm.rec.Apply(plan)
		changed += len(changes)
		errs = append(errs, n.recordRoutes(fm, t, changes, err))
		if !plan.PodCIDR.IsValid() {
			errs = append(errs, fmt.Errorf("node %q has no %v podCIDR in spec.podCIDRs yet (pods cannot start until it has one)", n.o.NodeName, fm.f))
		}
		pods = append(pods, plan.PodCIDR)
		if m := t.Config().PodMTU(); mtu == 0 || m < mtu {
			mtu = m
		}
	}
	if err := errors.Join(errs...); err != nil {
		return changed, err
	}
	return changed, n.writeNodeConfig(nodeconfig.New(pods, n.o.ClusterCIDRs, mtu))
}

// updateRoutes updates each family's table by the Nodes in dirty and
// writes what that changes, one family after the other (so an FDB entry
// one family drops is removed only once no other table wants it). The
// node config depends on this node alone, which is not among them.
func (n *Network) updateRoutes(dirty map[string]struct{}) (int, error) {
	nodes := make(map[string]*cluster.Node, len(dirty))
	for name := range dirty {
		nodes[name] = n.store.Node(name) // nil: deleted
	}
	changed := 0
	var errs []error
	for _, fm := range n.fams {
		t := fm.table.Load()
		changes, err := fm.rec.Patch(t.Update(nodes))
		n.logSkipped(fm.f, t.Skipped())
		changed += len(changes)
		errs = append(errs, n.recordRoutes(fm, t, changes, err))
	}
	return changed, errors.Join(errs...)
}

// logSkipped says which Nodes cannot be routed to by family f, when that
// changed.
func (n *Network) logSkipped(f ipfamily.Family, skipped []string) {
	if n.lastSkipped == nil {
		n.lastSkipped = make(map[ipfamily.Family][]string)
	}
	if slices.Equal(skipped, n.lastSkipped[f]) {
		return
	}
	n.lastSkipped[f] = skipped
	for _, sk := range skipped {
		n.log.Warn("peer not routed", "family", f, "reason", sk)
	}
}

// recordRoutes logs a reconciliation's changes and records its outcome
// in status and metrics.
func (n *Network) recordRoutes(fm *family, t *routing.Table, changes []string, err error) error {
	fm.status.record(t, err)
	logChanges(n.log, changes)
	n.metrics.changes.Add(float64(len(changes)))
	if fm == n.fams[0] {
		// The peers of the first family: a peer is one node whichever
		// families reach it.
		vx, gw := t.Peers()
		n.metrics.peers.WithLabelValues("vxlan").Set(float64(vx))
		n.metrics.peers.WithLabelValues("host-gw").Set(float64(gw))
	}
	if err != nil {
		return fmt.Errorf("%v routes: %w", fm.f, err)
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
	n.log.Info("node config written", "path", n.o.NodeConfigPath, "podCIDRs", c.Pods(), "clusterCIDRs", c.Clusters(), "mtu", c.MTU)
	return nil
}

// Cleanup removes what the node network created: podnet's iptables chains
// (from both iptables backends), the VXLAN device and podnet's routes. The
// node config stays, so pods that still run keep a consistent view.
func Cleanup(logger *slog.Logger) error {
	var errs []error
	for _, b := range ipt.Backends {
		for _, f := range ipfamily.All {
			r := ipt.Runner{Backend: b, Family: f}
			if !r.Contains(hostnet.ChainPrefix) {
				continue
			}
			if chains, err := r.Chains(); err != nil {
				errs = append(errs, err)
			} else if err := hostnet.RemoveChains(chains); err != nil {
				errs = append(errs, fmt.Errorf("%v iptables-%s: %w", f, b, err))
			}
		}
	}
	for _, f := range ipfamily.All {
		k, err := routing.NewNetlinkKernel(netns.None(), f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rec := &routing.Reconciler{Kernel: k, Device: routing.DefaultDevice}
		// An empty plan without a device: the reconciler removes
		// everything of the family tagged as podnet's.
		changes, err := rec.Apply(routing.Plan{})
		k.Close()
		for _, c := range changes {
			logger.Info("cleanup", "change", c)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
