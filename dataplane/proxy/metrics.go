package proxy

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podnet/podnet/dataplane/cluster"
)

// Metrics are the Service proxy's Prometheus metrics. Where kube-proxy has
// a metric for the same thing, it has kube-proxy's name, type, labels and
// buckets (pkg/proxy/metrics), so dashboards and alerts written for
// kube-proxy work unchanged; podnet's extras are named podnet_proxy_*. The
// probe counters kubeproxy_proxy_healthz_total and _livez_total are
// health.Progress's.
type Metrics struct {
	SyncDuration        prometheus.Histogram // kubeproxy_sync_proxy_rules_duration_seconds
	SyncFullDuration    prometheus.Histogram
	SyncPartialDuration prometheus.Histogram
	LastSync            prometheus.Gauge // …_last_timestamp_seconds
	LastQueued          prometheus.Gauge // …_last_queued_timestamp_seconds
	NetworkProgramming  prometheus.Histogram
	EndpointsPending    prometheus.Gauge
	EndpointsTotal      prometheus.Counter
	ServicesPending     prometheus.Gauge
	ServicesTotal       prometheus.Counter
	// RestoreFailures counts failed syncs; PartialRestoreFailures those of
	// them that were partial (the retry is a full sync).
	RestoreFailures        prometheus.Counter
	PartialRestoreFailures prometheus.Counter
	Rules                  *prometheus.GaugeVec // label table
	NoLocalEndpoints       *prometheus.GaugeVec // label traffic_policy: internal, external
	Services               prometheus.Gauge     // podnet_proxy_service_ports
	Endpoints              prometheus.Gauge     // podnet_proxy_endpoints

	changes changeLog
}

// NewMetrics creates the metrics and registers them with reg (if not nil).
// It is one declaration per metric, in kube-proxy's order, with nothing
// to follow from one to the next; split, it would only be harder to check
// against kube-proxy's list.
//
//funclen:ignore
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const sub = "kubeproxy"
	syncBuckets := prometheus.ExponentialBuckets(0.001, 2, 15)
	m := &Metrics{
		SyncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: sub, Name: "sync_proxy_rules_duration_seconds",
			Help: "SyncProxyRules latency in seconds", Buckets: syncBuckets,
		}),
		SyncFullDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: sub, Name: "sync_full_proxy_rules_duration_seconds",
			Help: "SyncProxyRules latency in seconds for full resyncs", Buckets: syncBuckets,
		}),
		SyncPartialDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: sub, Name: "sync_partial_proxy_rules_duration_seconds",
			Help: "SyncProxyRules latency in seconds for partial resyncs", Buckets: syncBuckets,
		}),
		LastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: sub, Name: "sync_proxy_rules_last_timestamp_seconds",
			Help: "The last time proxy rules were successfully synced",
		}),
		LastQueued: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: sub, Name: "sync_proxy_rules_last_queued_timestamp_seconds",
			Help: "The last time a sync of proxy rules was queued",
		}),
		NetworkProgramming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: sub, Name: "network_programming_duration_seconds",
			Help:    "In Cluster Network Programming Latency in seconds",
			Buckets: networkProgrammingBuckets(),
		}),
		EndpointsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: sub, Name: "sync_proxy_rules_endpoint_changes_pending",
			Help: "Pending proxy rules Endpoint changes",
		}),
		EndpointsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: sub, Name: "sync_proxy_rules_endpoint_changes_total",
			Help: "Cumulative proxy rules Endpoint changes",
		}),
		ServicesPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: sub, Name: "sync_proxy_rules_service_changes_pending",
			Help: "Pending proxy rules Service changes",
		}),
		ServicesTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: sub, Name: "sync_proxy_rules_service_changes_total",
			Help: "Cumulative proxy rules Service changes",
		}),
		RestoreFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: sub, Name: "sync_proxy_rules_iptables_restore_failures_total",
			Help: "Cumulative proxy iptables restore failures",
		}),
		PartialRestoreFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: sub, Name: "sync_proxy_rules_iptables_partial_restore_failures_total",
			Help: "Cumulative proxy iptables partial restore failures",
		}),
		Rules: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: sub, Name: "sync_proxy_rules_iptables_total",
			Help: "Total number of iptables rules owned by kube-proxy",
		}, []string{"table"}),
		NoLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: sub, Name: "sync_proxy_rules_no_local_endpoints_total",
			Help: "Number of services with a Local traffic policy and no endpoints",
		}, []string{"traffic_policy"}),
		Services: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "podnet", Subsystem: "proxy", Name: "service_ports",
			Help: "Service ports programmed.",
		}),
		Endpoints: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "podnet", Subsystem: "proxy", Name: "endpoints",
			Help: "Endpoints of the programmed Service ports.",
		}),
	}
	m.changes.start = time.Now()
	if reg != nil {
		reg.MustRegister(m.SyncDuration, m.SyncFullDuration, m.SyncPartialDuration, m.LastSync, m.LastQueued,
			m.NetworkProgramming, m.EndpointsPending, m.EndpointsTotal, m.ServicesPending, m.ServicesTotal,
			m.RestoreFailures, m.PartialRestoreFailures, m.Rules, m.NoLocalEndpoints,
			m.Services, m.Endpoints)
	}
	return m
}

// networkProgrammingBuckets are kube-proxy's: 0.25 s steps to 0.5 s, then
// seconds to a minute, 5 s steps to 2 minutes, 30 s steps to 5 minutes.
func networkProgrammingBuckets() []float64 {
	b := []float64{0}
	b = append(b, prometheus.LinearBuckets(0.25, 0.25, 2)...)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}

// changeLog counts the changes the proxy has seen and not yet taken into a
// sync, and keeps the trigger times of EndpointSlice changes until the sync
// that programmed them succeeds.
type changeLog struct {
	mu       sync.Mutex
	start    time.Time // trigger times before this are not measured
	services map[cluster.Key]bool
	slices   map[cluster.Key]bool
	// triggers are pending; inFlight were taken by a sync not yet
	// known to have succeeded.
	triggers, inFlight []time.Time
}

// watch counts the Store's Service and EndpointSlice changes.
func (m *Metrics) watch(store *cluster.Store) {
	store.Subscribe(func(ev cluster.Event) {
		c := &m.changes
		c.mu.Lock()
		defer c.mu.Unlock()
		switch ev.Kind {
		case cluster.KindService:
			if c.services == nil {
				c.services = make(map[cluster.Key]bool)
			}
			c.services[ev.Key] = true
			m.ServicesTotal.Inc()
			m.ServicesPending.Set(float64(len(c.services)))
		case cluster.KindEndpointSlice:
			if c.slices == nil {
				c.slices = make(map[cluster.Key]bool)
			}
			var svc cluster.Key
			for _, o := range []cluster.Object{ev.Old, ev.New} {
				if es, ok := o.(*cluster.EndpointSlice); ok {
					svc = es.ServiceKey()
				}
			}
			c.slices[svc] = true
			m.EndpointsTotal.Inc()
			m.EndpointsPending.Set(float64(len(c.slices)))
			if es, ok := ev.New.(*cluster.EndpointSlice); ok && es.TriggerTime.After(c.start) {
				c.triggers = append(c.triggers, es.TriggerTime)
			}
		default:
			return
		}
		m.LastQueued.SetToCurrentTime()
	})
}

// taken records that a sync took every pending change.
func (m *Metrics) taken() {
	c := &m.changes
	c.mu.Lock()
	defer c.mu.Unlock()
	// Dropped, not cleared: a cleared map keeps the room of its largest
	// size, 2.7 MB at 10,000 Services for the whole life of proxyd after
	// the first sync took them all.
	c.services, c.slices = nil, nil
	c.inFlight = append(c.inFlight, c.triggers...)
	c.triggers = c.triggers[:0]
	m.ServicesPending.Set(0)
	m.EndpointsPending.Set(0)
}

// synced records a successful sync of ports that took the given time.
func (m *Metrics) synced(full bool, took time.Duration, res SyncResult, ports map[cluster.Key][]*ServicePort) {
	m.SyncDuration.Observe(took.Seconds())
	if full {
		m.SyncFullDuration.Observe(took.Seconds())
	} else {
		m.SyncPartialDuration.Observe(took.Seconds())
	}
	m.LastSync.SetToCurrentTime()
	for table, n := range res.Rules {
		m.Rules.WithLabelValues(table).Set(float64(n))
	}
	var svcs, eps, noLocalInt, noLocalExt int
	for _, sps := range ports {
		for _, sp := range sps {
			svcs++
			eps += len(sp.Endpoints)
			if sp.InternalPolicyLocal && len(sp.LocalEndpoints) == 0 {
				noLocalInt++
			}
			if sp.External() && sp.ExternalPolicyLocal && len(sp.LocalEndpoints) == 0 {
				noLocalExt++
			}
		}
	}
	m.Services.Set(float64(svcs))
	m.Endpoints.Set(float64(eps))
	m.NoLocalEndpoints.WithLabelValues("internal").Set(float64(noLocalInt))
	m.NoLocalEndpoints.WithLabelValues("external").Set(float64(noLocalExt))

	c := &m.changes
	c.mu.Lock()
	now := time.Now()
	for _, t := range c.inFlight {
		m.NetworkProgramming.Observe(now.Sub(t).Seconds())
	}
	c.inFlight = c.inFlight[:0]
	c.mu.Unlock()
}

// failed records a failed sync.
func (m *Metrics) failed(full bool) {
	m.RestoreFailures.Inc()
	if !full {
		m.PartialRestoreFailures.Inc()
	}
}

// pending returns the Services with Service and with EndpointSlice changes
// not yet taken into a sync.
func (m *Metrics) pending() (services, endpoints int) {
	c := &m.changes
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.services), len(c.slices)
}
