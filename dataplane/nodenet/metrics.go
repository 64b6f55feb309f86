package nodenet

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

// newMetrics registers the node network's metrics.
func newMetrics(reg prometheus.Registerer) *metrics {
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
	return m
}
