// Package agent is proxyd's node agent: it reads the cluster state and
// runs the node network (package nodenet: the node config for the CNI
// plugin, routes to every other node's pods, sysctls, masquerading) and
// the Service proxy beside it, with /healthz and /metrics. The proxy's
// mode comes chosen and probed from main (proxy.Modes.Select); the agent
// knows no backend, only package proxy.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/podnet/podnet/dataplane/app"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
	"github.com/podnet/podnet/dataplane/cluster/kube"
	"github.com/podnet/podnet/dataplane/cluster/statedir"
	"github.com/podnet/podnet/dataplane/health"
	"github.com/podnet/podnet/dataplane/hostnet"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/ipt"
	"github.com/podnet/podnet/dataplane/nftmsg"
	"github.com/podnet/podnet/dataplane/nodenet"
	"github.com/podnet/podnet/dataplane/nodestatus"
	"github.com/podnet/podnet/dataplane/podcidr"
	"github.com/podnet/podnet/dataplane/policy"
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
	// ClusterCIDRs holds one cluster CIDR per family the cluster's pods
	// have (--cluster-cidr v4,v6 for dual-stack); the node serves those
	// families.
	ClusterCIDRs   []netip.Prefix
	Backend        routing.Backend
	VXLANVNI       int
	VXLANPort      int
	Iface          string // "" = the interface holding the node's InternalIP
	NodeConfigPath string
	Masquerade     bool
	// NoPodNetwork leaves the pod network to another network (flannel,
	// while a cluster migrates): proxyd programs the Services only, and
	// never marks the Node's network available.
	NoPodNetwork bool
	// FlannelAnnotations writes flannel's annotations for this Node, so
	// nodes still running flannel reach its pods (needs Kube).
	FlannelAnnotations bool
	SyncPeriod         time.Duration
	MinSyncPeriod      time.Duration
	// HealthzAddr is where the daemon skeleton serves /healthz and /livez
	// (HealthEndpoint); "" disables.
	HealthzAddr string
	MetricsAddr string // "" disables
	// Health is the daemon's health (app.Daemon serves it at HealthzAddr),
	// where the node network, the cluster state and the Service proxy put
	// their checks; nil: a Health of the agent's own, served on the
	// metrics port alone.
	Health *app.Health
	// IPTables runs the iptables commands for the node's chains; zero:
	// the backend the node uses (ipt.NodeBackend, the Service proxy's too).
	IPTables ipt.Runner
	// ServiceProxy is the Service proxy run beside the node network; nil:
	// none. Its sync periods are the agent's.
	ServiceProxy *proxy.ServiceOptions
	// Kernel replaces parts of the node's kernel (tests); nil: the real one.
	Kernel *nodenet.Kernel
	// NetworkPolicy enforces NetworkPolicy for this node's pods (the
	// table inet podnet-policy); PolicyLogGroup is the nflog group its
	// denied new connections are logged to.
	NetworkPolicy  bool
	PolicyLogGroup uint16
	// Clock times the node network's syncs and how long the Service
	// proxy's first sync waits for them; nil: the system's (tests drive a
	// runner.FakeClock).
	Clock  runner.Clock
	Logger *slog.Logger
}

// validClusterCIDRs checks --cluster-cidr: one prefix per family.
func validClusterCIDRs(ps []netip.Prefix) error {
	switch {
	case len(ps) == 0:
		return errors.New("--cluster-cidr: empty; want one prefix per family, as 10.244.0.0/16,fd00:10:244::/56")
	case len(ps) > 2:
		return fmt.Errorf("--cluster-cidr: %v holds %d prefixes; want one per family (two at most)", ps, len(ps))
	case len(ps) == 2 && ipfamily.OfPrefix(ps[0]) == ipfamily.OfPrefix(ps[1]):
		return fmt.Errorf("--cluster-cidr: %v holds two %v prefixes; want one per family", ps, ipfamily.OfPrefix(ps[0]))
	}
	return nil
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
	case o.NodeConfigPath == "":
		return errors.New("--node-config: empty")
	case o.SyncPeriod <= 0:
		return fmt.Errorf("--sync-period: %v must be positive", o.SyncPeriod)
	case o.MinSyncPeriod < 0 || o.MinSyncPeriod > o.SyncPeriod:
		return fmt.Errorf("--min-sync-period: %v must be between 0 and --sync-period", o.MinSyncPeriod)
	}
	if err := validClusterCIDRs(o.ClusterCIDRs); err != nil {
		return err
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

// HealthEndpoint is where the daemon skeleton serves the agent's health,
// as kube-proxy's: /healthz for load balancers, /livez for the liveness
// probe.
func (o Options) HealthEndpoint() app.HealthEndpoint {
	return app.HealthEndpoint{Addr: o.HealthzAddr, Flag: "--healthz-bind-address", Paths: []string{"/healthz", "/livez"}}
}

// componentState is the cluster state's name in the daemon's health.
const componentState = "cluster-state"

// healthz puts kube-proxy's /healthz and /livez on the daemon's health
// (o.Health; a new one when nil) and returns its checker and the progress
// they answer from. /healthz follows the Service proxy only, as
// kube-proxy's does: the node network and the cluster state report
// through the checker, which /healthz names in its body without failing
// on it.
func (o *Options) healthz(reg prometheus.Registerer) (*health.Checker, *health.Progress) {
	if o.Health == nil {
		o.Health = app.NewHealth()
	}
	progress := health.NewProgress(2*o.SyncPeriod, reg)
	progress.Note(o.Health.Checker)
	o.Health.Handle("/healthz", progress.Healthz())
	o.Health.Handle("/livez", progress.Livez())
	return o.Health.Checker, progress
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
	checker, progress := o.healthz(reg)
	board := &status.Board{}
	board.Provide(StatusHealth, func() any { return healthStatus(progress, checker) })

	src, err := app.NewSource(app.SourceOptions{StateDir: o.StateDir, StateLimits: o.StateLimits, Kube: o.Kube, Kinds: o.Kinds(), Logger: log})
	if err != nil {
		return err
	}
	if src.StateDir != nil {
		statedir.RegisterMetrics(reg, src.StateDir)
	}
	registerStateMetrics(reg, src.FileErrors, src.Stale)
	checkState(checker, src)
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
	n := nodenet.New(o.nodeNetConfig(), k, src.Store, checker, reg, log)
	board.Provide(StatusNode, func() any { return nodeStatus(n, src) })

	g := app.NewGroup(ctx)
	// Listen before anything else so a port conflict fails at start.
	if err := app.Serve(g, log, endpoints(o, reg, progress, board)...); err != nil {
		return err
	}
	g.Go("cluster state", src.Run)
	g.Go("state loaded", func(ctx context.Context) error { return logLoaded(ctx, src, log) })
	if client != nil {
		goKube(g, o, client, n.Routed())
		if o.FlannelAnnotations && !o.NoPodNetwork {
			goFlannelAnnotations(g, o, client, src.Store, n.Routed())
		}
	}
	g.Go("node network", n.Run)
	if o.NetworkPolicy {
		if err := goPolicy(g, o, src.Store, checker, board, reg); err != nil {
			return err
		}
	}
	if o.ServiceProxy != nil {
		sp := *o.ServiceProxy
		sp.SyncPeriod, sp.MinSyncPeriod = o.SyncPeriod, o.MinSyncPeriod
		g.Go("service proxy", func(ctx context.Context) error {
			return proxy.RunService(ctx, sp, proxy.Env{
				Store: src.Store, Health: checker, Progress: progress, Status: board, Metrics: reg, Logger: log.With("component", "service-proxy"),
				BeforeFirstSync: func(ctx context.Context) { n.AwaitFirstSync(ctx, routesFirstLimit) },
			})
		})
	}
	return g.Wait()
}

// Kinds are what the API server source watches: with NetworkPolicy, every
// Pod (peers on other nodes match selectors too; each is reduced to its
// labels, addresses and named ports as it arrives) and the policies.
func (o Options) Kinds() []cluster.Kind {
	if !o.NetworkPolicy {
		return nil
	}
	return append(slices.Clone(kube.DefaultKinds), cluster.KindPod, cluster.KindNetworkPolicy)
}

// StatusPolicy is the network policy's section of the status board.
const StatusPolicy = "networkPolicy"

// goPolicy runs the NetworkPolicy controller over the node's own nftables
// table.
func goPolicy(g *app.Group, o Options, store *cluster.Store, checker *health.Checker, board *status.Board, reg prometheus.Registerer) error {
	// A first sync of a large cluster is one batch of megabytes.
	conn, err := nftables.New(nftmsg.Buffers())
	if err != nil {
		return fmt.Errorf("network policy: nftables: %w", err)
	}
	table := policy.NewTable(conn, policy.Options{Families: o.families(), LogGroup: o.PolicyLogGroup})
	c := policy.NewController(policy.ControllerOptions{NodeName: o.NodeName, Store: store, Table: table,
		MinInterval: o.MinSyncPeriod, MaxInterval: o.SyncPeriod, Clock: o.Clock, Logger: o.Logger.With("component", "network-policy")})
	if err := reg.Register(c); err != nil {
		return fmt.Errorf("network policy metrics: %w", err)
	}
	checker.Check("network-policy", c.Err)
	board.Provide(StatusPolicy, func() any { return c.Status() })
	g.Go("network policy", c.Run)
	g.Go("network policy log", func(ctx context.Context) error {
		// The log is for people: enforcement goes on without it.
		if err := policy.ListenDenied(ctx, o.PolicyLogGroup, c.LogDenied); err != nil {
			o.Logger.Error("network policy: the log of denied connections stopped", "err", err)
		}
		return nil
	})
	return nil
}

// nodeNetConfig is the node network's part of o.
func (o Options) nodeNetConfig() nodenet.Config {
	return nodenet.Config{
		NodeName: o.NodeName, ClusterCIDRs: o.ClusterCIDRs, Backend: o.Backend, VXLANVNI: o.VXLANVNI, VXLANPort: o.VXLANPort,
		Iface: o.Iface, NodeConfigPath: o.NodeConfigPath, Masquerade: o.Masquerade, NoPodNetwork: o.NoPodNetwork,
		SyncPeriod: o.SyncPeriod, MinSyncPeriod: o.MinSyncPeriod, ServiceHooks: serviceHooks(o.ServiceProxy), Clock: o.Clock,
		Firewall: nodeFirewall(o.ServiceProxy),
	}
}

// kernel is o.Kernel with every field left nil filled with the real
// kernel; close releases what it opened.
func (o Options) kernel() (nodenet.Kernel, func(), error) {
	var k nodenet.Kernel
	if o.Kernel != nil {
		k = *o.Kernel
	}
	return k.WithReal(o.families(), o.IPTables)
}

// families are the families of the cluster CIDRs, in their order.
func (o Options) families() []ipfamily.Family {
	out := make([]ipfamily.Family, len(o.ClusterCIDRs))
	for i, p := range o.ClusterCIDRs {
		out[i] = ipfamily.OfPrefix(p)
	}
	return out
}

// nodeFirewall is the chosen Service proxy mode's node firewall, if it
// brings one.
func nodeFirewall(sp *proxy.ServiceOptions) func(ipfamily.Family) hostnet.NodeFirewall {
	if sp == nil {
		return nil
	}
	return sp.Mode.NodeFirewall
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
				var opts []podcidr.Options
				for _, c := range o.ClusterCIDRs {
					opts = append(opts, podcidr.Options{Client: client, NodeName: o.NodeName, ClusterCIDR: c, Namespace: o.ClaimNamespace})
				}
				ps, err := podcidr.EnsureAll(ctx, opts)
				if err == nil {
					log.Info("node podCIDRs", "podCIDRs", ps)
				}
				return err
			})
		})
	}
	if o.NoPodNetwork {
		return
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

// checkState makes the cluster state's health a check, asked whenever
// health is read: not loaded until the source has delivered it all (the
// kernel keeps what an earlier run left, and /healthz says why), then
// stale while the API server is away (the last known state keeps being
// served).
func checkState(checker *health.Checker, src app.Source) {
	checker.Check(componentState, func() error {
		select {
		case <-src.Store.Synced():
			return src.Stale()
		default:
		}
		if err := src.Stale(); err != nil {
			return fmt.Errorf("cluster state not loaded yet, kernel rules left as they are: %w", err)
		}
		return errors.New("cluster state not loaded yet")
	})
}

// logLoaded logs when the cluster state is loaded.
func logLoaded(ctx context.Context, src app.Source, log *slog.Logger) error {
	select {
	case <-src.Store.Synced():
		log.Info("cluster state loaded", "nodes", len(src.Store.Nodes()), "services", len(src.Store.Services()))
	case <-ctx.Done():
	}
	return nil
}

// routesFirstLimit bounds how long the Service proxy waits for the node
// network's first sync once the cluster state is loaded.
const routesFirstLimit = 5 * time.Second

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
