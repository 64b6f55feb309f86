package agent

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	syncs        prometheus.Counter
	syncErrors   prometheus.Counter
	syncDuration prometheus.Histogram
	changes      prometheus.Counter
	peers        *prometheus.GaugeVec
}

// newMetrics registers the agent's metrics; fileErrors (the state
// directory's unparsable files) is nil for the API source; stale says why
// the cluster state may be out of date (nil: it is current).
func newMetrics(reg prometheus.Registerer, fileErrors func() int, stale func() error) *metrics {
	m := &metrics{
		syncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "podnet_node_network_syncs_total", Help: "Node network reconciliations run.",
		}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "podnet_node_network_sync_errors_total", Help: "Node network reconciliations that ended with an error.",
		}),
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "podnet_node_network_sync_duration_seconds", Help: "Duration of node network reconciliations.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "podnet_node_network_changes_total", Help: "Routes, neighbour, FDB entries and links added, changed or removed.",
		}),
		peers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "podnet_peers", Help: "Other nodes this node routes pods to, by backend.",
		}, []string{"backend"}),
	}
	reg.MustRegister(m.syncs, m.syncErrors, m.syncDuration, m.changes, m.peers)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "podnet_cluster_state_stale", Help: "1 while the API server is away and the last known cluster state is served.",
	}, func() float64 {
		if stale() != nil {
			return 1
		}
		return 0
	}))
	if fileErrors != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "podnet_state_file_errors", Help: "State directory files that currently do not parse.",
		}, func() float64 { return float64(fileErrors()) }))
	}
	return m
}
