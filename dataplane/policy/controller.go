package policy

import (
	"context"
	"log/slog"
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

// Controller keeps the node's policy table in step with the Store: any
// change of a Pod, Namespace or NetworkPolicy triggers a sync that compiles
// the whole model and lets the Table write the difference.
type Controller struct {
	o ControllerOptions
	r *runner.Runner

	mu       sync.Mutex
	model    *Model
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

func (c *Controller) sync() error {
	s := c.o.Store
	m := NewModel(s.Pods(), s.Namespaces(), s.NetworkPolicies())
	prog := m.Compile(func(p *cluster.Pod) bool { return p.NodeName == c.o.NodeName })
	err := c.o.Table.Apply(prog)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastErr = err
	if err != nil {
		c.o.Logger.Error("network policy sync failed", "err", err)
		return err
	}
	c.model, c.lastSync = m, time.Now()
	c.syncs++
	return nil
}

// Err is the last sync's failure, nil when it succeeded.
func (c *Controller) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastErr
}

// Synced is how many syncs succeeded.
func (c *Controller) Synced() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
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
