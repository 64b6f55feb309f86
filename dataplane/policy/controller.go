package policy

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/runner"
)

// Applier is what the controller programs: the nftables Table, or a fake.
type Applier interface {
	Apply(*Program) error
	Counters() (map[cluster.Key]Counts, error)
}

// ControllerOptions configure a Controller.
type ControllerOptions struct {
	NodeName string
	Store    *cluster.Store
	Table    Applier
	// MinInterval folds bursts of changes into one sync; MaxInterval
	// repairs what was changed behind podnet's back.
	MinInterval, MaxInterval time.Duration
	Clock                    runner.Clock
	Logger                   *slog.Logger
}

// Controller keeps the node's policy table in step with the Store: the
// first sync compiles the whole model; later ones hand the changes of Pods,
// Namespaces and NetworkPolicies since the last one to the Compiler, which
// updates only what they touch, and the Table writes the difference.
type Controller struct {
	o ControllerOptions
	r *runner.Runner

	pendMu  sync.Mutex
	pending []cluster.Event // changes the next sync takes in, in order

	mu       sync.Mutex
	compiler *Compiler // nil until the first sync
	model    *Model

	// resMu guards the last sync's outcome apart from mu, which a sync
	// holds while it compiles (seconds at scale): /healthz asks Err, and
	// must not wait for a compile.
	resMu    sync.Mutex
	lastErr  error
	lastSync time.Time
	syncs    uint64
}

// NewController returns a Controller subscribed to the Store; nothing is
// programmed before Run.
func NewController(o ControllerOptions) *Controller {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Controller{o: o}
	c.r = runner.New(c.sync, runner.Options{MinInterval: o.MinInterval, MaxInterval: o.MaxInterval, RetryInterval: o.MinInterval, Clock: o.Clock})
	o.Store.Subscribe(func(ev cluster.Event) {
		switch ev.Kind {
		case cluster.KindPod, cluster.KindNamespace, cluster.KindNetworkPolicy:
			c.pendMu.Lock()
			c.pending = append(c.pending, ev)
			c.pendMu.Unlock()
			c.r.Trigger()
		}
	})
	return c
}

// Run programs the table once the Store is synced (until then the table a
// previous run left keeps judging), then keeps it current until ctx ends.
// The table stays in place after: a restart opens no window.
func (c *Controller) Run(ctx context.Context) error {
	select {
	case <-c.o.Store.Synced():
	case <-ctx.Done():
		return nil
	}
	c.r.Trigger()
	c.r.Run(ctx)
	return nil
}

// sync takes in the changes since the last sync and programs the result. A
// sync that finds no change after a successful one (the periodic ones,
// every --sync-period) compiles and writes nothing: the Table writes only
// differences from what it applied, so there is nothing it could repair,
// and the program and batch it built were garbage (proxyd's RSS grew from
// 21.1 to 39.7 MiB over five of them, BENCHMARKS.md).
func (c *Controller) sync() error {
	c.mu.Lock()
	prog, changed := c.compile()
	if !changed && c.Err() != nil {
		// The last Apply failed: the Table rebuilds from nothing.
		prog, changed = c.compiler.Program(), true
	}
	c.mu.Unlock()
	var err error
	if changed {
		err = c.o.Table.Apply(prog)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resMu.Lock()
	defer c.resMu.Unlock()
	c.lastErr = err
	if err != nil {
		c.o.Logger.Error("network policy sync failed", "err", err)
		return err
	}
	c.model, c.lastSync = c.compiler.Model(), time.Now()
	c.syncs++
	return nil
}

// rebuildAfter is the most changes a sync takes in one by one; a larger
// batch (a state file or a namespace's worth of pods arriving at once) is
// compiled afresh from the Store. Each pod change walks every policy: the
// benchmark's 5,000 pods arriving after its 1,000 policies took 35 s one by
// one on a loaded machine, where the whole compile takes 0.5 s of CPU.
const rebuildAfter = 100

// compile brings the program up to date with the Store, and says whether
// anything was taken in since the last; c.mu is held (the model it changes
// is the one Status reads).
func (c *Controller) compile() (*Program, bool) {
	c.pendMu.Lock()
	events := c.pending
	c.pending = nil
	c.pendMu.Unlock()
	if c.compiler != nil && len(events) == 0 {
		return nil, false
	}
	if c.compiler == nil || len(events) > rebuildAfter {
		// Every event taken is in the Store already; one after this
		// point may be in the snapshot too, and replaying it later
		// changes nothing.
		s := c.o.Store
		c.compiler = NewCompiler(NewModel(s.Pods(), s.Namespaces(), s.NetworkPolicies()),
			func(p *cluster.Pod) bool { return p.NodeName == c.o.NodeName })
		return c.compiler.Program(), true
	}
	for _, ev := range events {
		c.compiler.Apply(ev)
	}
	return c.compiler.Program(), true
}

// LogDenied logs one denied new connection (from ListenDenied) with the
// pods at its ends and the policies that selected the pod whose direction
// denied it, as the last synced model has them.
func (c *Controller) LogDenied(d Denied) {
	c.mu.Lock()
	attrs := describeDenied(c.model, d)
	c.mu.Unlock()
	c.o.Logger.Info("network policy denied a new connection", attrs...)
}

// describeDenied is a denied connection's log attributes; an address no
// pod holds is named by itself.
func describeDenied(m *Model, d Denied) []any {
	name := func(a netip.Addr) string {
		if m != nil {
			if p := m.Pod(a); p != nil {
				return p.Key().String()
			}
		}
		return a.String()
	}
	policies := []string{}
	if m != nil {
		v := m.Evaluate(d.Flow)
		keys := v.Ingress
		if d.Direction == Egress {
			keys = v.Egress
		}
		for _, k := range keys {
			policies = append(policies, k.String())
		}
	}
	return []any{"direction", d.Direction.String(), "src", name(d.Src), "dst", name(d.Dst),
		"protocol", string(d.Protocol), "port", d.Port, "srcIP", d.Src.String(), "dstIP", d.Dst.String(), "policies", policies}
}

// Err is the last sync's failure, nil when it succeeded.
func (c *Controller) Err() error {
	c.resMu.Lock()
	defer c.resMu.Unlock()
	return c.lastErr
}

// Synced is how many syncs succeeded.
func (c *Controller) Synced() uint64 {
	c.resMu.Lock()
	defer c.resMu.Unlock()
	return c.syncs
}

var connectionsDesc = prometheus.NewDesc("podnet_network_policy_connections_total",
	"New connections (first packets) a NetworkPolicy's rules allowed, or dropped while it selected the pod, on this node.",
	[]string{"namespace", "policy", "verdict"}, nil)

// Describe and Collect make the controller a Prometheus collector of the
// table's per-policy counters, read from the kernel at each scrape.
func (c *Controller) Describe(ch chan<- *prometheus.Desc) { ch <- connectionsDesc }

func (c *Controller) Collect(ch chan<- prometheus.Metric) {
	counts, err := c.o.Table.Counters()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(connectionsDesc, err)
		return
	}
	for k, v := range counts {
		ch <- prometheus.MustNewConstMetric(connectionsDesc, prometheus.CounterValue, float64(v.Allowed), k.Namespace, k.Name, "allowed")
		ch <- prometheus.MustNewConstMetric(connectionsDesc, prometheus.CounterValue, float64(v.Dropped), k.Namespace, k.Name, "dropped")
	}
}
