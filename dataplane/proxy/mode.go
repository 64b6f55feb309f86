package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/health"
	"github.com/podnet/podnet/dataplane/hostnet"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/status"
)

// Mode is one way of programming Services into the node's kernel
// (iptables, ebpf, ...). Every mode provides the same three things, and a
// daemon picks one by name from the registered modes (Register,
// Registered), knowing none of them.
type Mode struct {
	// Name is the value of --proxy-mode.
	Name string
	// NewSettings returns the mode's own Settings, defaults set; nil: the
	// mode has none.
	NewSettings func() Settings
	// Probe reports the first thing this node lacks for the mode (a
	// command, a program type, an attach type, a helper), naming it; nil
	// when the mode can run. It changes nothing on the node. nil: the mode
	// needs nothing.
	Probe func(Config) error
	// New returns the mode's Backend. It touches nothing before the
	// Backend's first Sync. A Backend that is also an io.Closer is closed
	// when the proxy stops (what it pinned stays). A nil Backend runs no
	// Service proxy at all (mode none).
	New func(Config) (Backend, error)
	// Cleanup removes whatever the mode left on the node in any earlier
	// run; what is not there is no error. nil: the mode leaves nothing.
	Cleanup func(Config) error
	// Hooks are the mode's rules in the node's built-in netfilter chains,
	// which the node firewall keeps its own behind; none for a mode that
	// works outside netfilter.
	Hooks []Hook
	// NodeFirewall, when set, is where the node firewall of family f
	// lives in this mode (nftables: the mode's own table) instead of
	// podnet's iptables chains, which are then removed.
	NodeFirewall func(f ipfamily.Family) hostnet.NodeFirewall
	// AllFamilies: one Backend serves every family the daemon serves. New
	// is called once (Config.Families lists them, Config.Family is the
	// first) and its Backend gets the ServicePorts of all of them. ebpf
	// sets it: its maps hold both families' entries side by side (16-byte
	// addresses, IPv4 as ::ffff:a.b.c.d), so two Backends filling them
	// would each see the other's entries as stale.
	AllFamilies bool
}

// Hook is a jump the Service proxy keeps in a built-in chain: from Chain of
// Table (iptables names) to its own Target.
type Hook struct {
	Table, Chain, Target string
}

// Hooks are the hooks of every mode: a mode being switched away from keeps
// its hooks until its state is removed.
func (ms Modes) Hooks() []Hook {
	var out []Hook
	for _, m := range ms {
		out = append(out, m.Hooks...)
	}
	return out
}

// Config is what every mode is built from: the node-wide settings, and
// each mode's own Settings by name, which only that mode reads.
type Config struct {
	NodeName string
	// Family is the address family the Backend serves: New is called once
	// per family the daemon serves (see PerFamily).
	Family ipfamily.Family
	// Families are every family the daemon serves, in its order (the
	// first is the primary); Family is one of them.
	Families []ipfamily.Family
	// ClusterCIDR is the pod network of Family; ClusterCIDRs holds one
	// per family the daemon serves (the daemon's --cluster-cidr), from
	// which each family's Backend gets its ClusterCIDR.
	ClusterCIDR       netip.Prefix
	ClusterCIDRs      []netip.Prefix
	NodePortAddresses []netip.Prefix // empty: all of the node's addresses
	MasqueradeAll     bool
	// Uplinks are the interfaces traffic from outside the node arrives on
	// (where a mode attaches tc programs); empty: the interface holding
	// the node's InternalIP.
	Uplinks []string
	// Node returns this node as the cluster state holds it now (its
	// addresses); nil until the state has it. Set by RunService.
	Node func() *cluster.Node
	// Settings holds each mode's own Settings by mode name (Modes.AddFlags);
	// a mode without an entry uses its defaults.
	Settings map[string]Settings
	Logger   *slog.Logger // never nil inside a Mode's functions
}

// None runs no Service proxy.
var None = Mode{Name: "none", New: func(Config) (Backend, error) { return nil, nil }}

// Modes is a table of proxy modes, as Registered returns it.
type Modes []Mode

// Names lists the modes' names in table order.
func (ms Modes) Names() []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name
	}
	return out
}

// Select returns the named mode after its probe passed. The error names
// the flag, the mode and what is missing.
func (ms Modes) Select(name string, cfg Config) (Mode, error) {
	cfg = cfg.withDefaults()
	for _, m := range ms {
		if m.Name != name {
			continue
		}
		if m.Probe != nil {
			if err := m.Probe(cfg); err != nil {
				return Mode{}, fmt.Errorf("--proxy-mode %s: cannot run on this node: %w", name, err)
			}
		}
		return m, nil
	}
	return Mode{}, fmt.Errorf("--proxy-mode: %q is not %s", name, strings.Join(ms.Names(), ", "))
}

// Cleanup removes the state of every mode but the one named keep (""
// cleans them all).
func (ms Modes) Cleanup(cfg Config, keep string) error {
	cfg = cfg.withDefaults()
	var errs []error
	for _, m := range ms {
		if m.Name == keep || m.Cleanup == nil {
			continue
		}
		if err := m.Cleanup(cfg); err != nil {
			errs = append(errs, fmt.Errorf("remove %s mode's state: %w", m.Name, err))
		}
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Node == nil {
		c.Node = func() *cluster.Node { return nil }
	}
	if c.Family == 0 {
		c.Family = ipfamily.OfPrefix(c.ClusterCIDR)
	}
	if c.Family == 0 {
		c.Family = ipfamily.IPv4
	}
	return c
}

// ServiceOptions choose and configure the Service proxy of a daemon.
type ServiceOptions struct {
	Mode Mode // from Modes.Select
	// Modes are all the modes the daemon offers: at start, the state of
	// every other one is removed, so switching modes on a node leaves
	// nothing of the old one behind.
	Modes  Modes
	Config Config
	// Families are the address families served, one Backend each; empty:
	// the family of Config.ClusterCIDR.
	Families      []ipfamily.Family
	Conntrack     Conntrack // nil: no conntrack cleanup
	SyncPeriod    time.Duration
	MinSyncPeriod time.Duration
	// LocalProbeInterval is how often the local endpoints of Services with
	// trafficDistribution PreferSameNode are probed (localprobe.go); 0:
	// never.
	LocalProbeInterval time.Duration
	// TakeOver, when set, removes another Service proxy's state (kube-proxy's)
	// once this one's first sync has succeeded, with the other modes',
	// so the node's Services are never without rules.
	TakeOver func() error
}

// Env is what the daemon shares with its Service proxy.
type Env struct {
	Store  *cluster.Store
	Health *health.Checker
	// Progress, when set, hears of every change waiting to be programmed
	// and of every successful sync (the daemon's /healthz).
	Progress *health.Progress
	// Status, when set, gets the proxy's section.
	Status  *status.Board
	Metrics prometheus.Registerer
	Logger  *slog.Logger
	// BeforeFirstSync is Options.BeforeFirstSync.
	BeforeFirstSync func(ctx context.Context)
}

// RunService builds the chosen mode's Backend, syncs it with the Store
// until ctx ends, and removes the other modes' state once its first sync
// succeeded.
func RunService(ctx context.Context, o ServiceOptions, env Env) error {
	cfg := o.Config
	if cfg.Logger == nil {
		cfg.Logger = env.Logger
	}
	if env.Store != nil {
		cfg.Node = func() *cluster.Node { return env.Store.Node(cfg.NodeName) }
	}
	cfg = cfg.withDefaults()
	families := o.families()
	backend, err := o.newBackend(cfg, families)
	if err != nil {
		return err
	}
	if backend == nil {
		if env.Status != nil {
			env.Status.Provide(StatusSection, func() any { return Status{Mode: o.Mode.Name} })
		}
		if err := o.Modes.Cleanup(cfg, o.Mode.Name); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	}
	if c, ok := backend.(io.Closer); ok {
		defer c.Close()
	}
	return Run(ctx, Options{
		Store:              env.Store,
		NodeName:           cfg.NodeName,
		Families:           families,
		Backend:            &cleanupOthers{Backend: backend, modes: o.Modes, cfg: cfg, keep: o.Mode.Name, takeOver: o.TakeOver},
		Conntrack:          o.Conntrack,
		SyncPeriod:         o.SyncPeriod,
		MinSyncPeriod:      o.MinSyncPeriod,
		LocalProbeInterval: o.LocalProbeInterval,
		Health:             env.Health,
		Progress:           env.Progress,
		Status:             env.Status,
		Mode:               o.Mode.Name,
		Metrics:            NewMetrics(env.Metrics),
		HealthChecks:       &HealthChecks{},
		Logger:             cfg.Logger,
		BeforeFirstSync:    env.BeforeFirstSync,
	})
}

func (o ServiceOptions) families() []ipfamily.Family {
	if len(o.Families) > 0 {
		return o.Families
	}
	if len(o.Config.ClusterCIDRs) > 0 {
		out := make([]ipfamily.Family, len(o.Config.ClusterCIDRs))
		for i, p := range o.Config.ClusterCIDRs {
			out[i] = ipfamily.OfPrefix(p)
		}
		return out
	}
	if f := ipfamily.OfPrefix(o.Config.ClusterCIDR); f != 0 {
		return []ipfamily.Family{f}
	}
	return []ipfamily.Family{ipfamily.IPv4}
}

// newBackend builds the mode's Backend for each family: the one Backend
// of a single family, else a PerFamily of them; nil for a mode that runs
// none.
func (o ServiceOptions) newBackend(cfg Config, families []ipfamily.Family) (Backend, error) {
	if o.Mode.New == nil {
		return nil, fmt.Errorf("proxy mode %q: no backend", o.Mode.Name)
	}
	cfg.Families = families
	each := families
	if o.Mode.AllFamilies {
		each = families[:1]
	}
	per := NewPerFamily(make(map[ipfamily.Family]Backend, len(families)))
	for _, f := range each {
		c := cfg
		c.Family = f
		if ps := f.Prefixes(cfg.ClusterCIDRs); len(ps) > 0 {
			c.ClusterCIDR = ps[0]
		}
		b, err := o.Mode.New(c)
		if err != nil {
			per.Close()
			return nil, fmt.Errorf("proxy mode %s (%v): %w", o.Mode.Name, f, err)
		}
		if b == nil {
			return nil, nil
		}
		per.Backends[f] = b
	}
	if len(per.Backends) == 1 {
		return per.Backends[each[0]], nil
	}
	return per, nil
}

// cleanupOthers removes the other modes' state after the first successful
// sync, retrying after later syncs until that succeeds too. Two modes can
// hold a node at once without harm (socket LB translates before a packet
// exists and the tc programs send packets past netfilter, so iptables
// mode's rules never see a translated packet; iptables mode's rules match
// nothing socket LB left untranslated): switching modes this way leaves no
// moment without Services.
type cleanupOthers struct {
	Backend
	modes    Modes
	cfg      Config
	keep     string
	takeOver func() error
	done     bool
}

func (c *cleanupOthers) Sync(ports map[cluster.Key][]*ServicePort, changed map[cluster.Key]bool, full bool) (SyncResult, error) {
	res, err := c.Backend.Sync(ports, changed, full)
	if err == nil && !c.done {
		cerr := c.modes.Cleanup(c.cfg, c.keep)
		if c.takeOver != nil {
			cerr = errors.Join(cerr, c.takeOver())
		}
		if cerr != nil {
			c.cfg.Logger.Warn("remove the other proxy modes' state; retrying after the next sync", "err", cerr)
		} else {
			c.done = true
		}
	}
	return res, err
}
