package proxy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Service proxy's Prometheus metrics.
type Metrics struct {
	SyncDuration *prometheus.HistogramVec // label kind: full, partial
	SyncErrors   prometheus.Counter
	LastSync     prometheus.Gauge
	Rules        *prometheus.GaugeVec // label table
	Services     prometheus.Gauge
	Endpoints    prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg (if not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		SyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "podnet", Subsystem: "proxy", Name: "sync_duration_seconds",
			Help:    "Time to program Services into the kernel, by kind of sync (full, partial).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"kind"}),
		SyncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "podnet", Subsystem: "proxy", Name: "sync_errors_total",
			Help: "Syncs that failed.",
		}),
		LastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "podnet", Subsystem: "proxy", Name: "last_sync_timestamp_seconds",
			Help: "Unix time of the last successful sync.",
		}),
		Rules: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "podnet", Subsystem: "proxy", Name: "rules",
			Help: "Rules the proxy holds in the kernel, by table.",
		}, []string{"table"}),
		Services: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "podnet", Subsystem: "proxy", Name: "service_ports",
			Help: "Service ports programmed.",
		}),
		Endpoints: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "podnet", Subsystem: "proxy", Name: "endpoints",
			Help: "Endpoints of the programmed Service ports.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.SyncDuration, m.SyncErrors, m.LastSync, m.Rules, m.Services, m.Endpoints)
	}
	return m
}
