package agent

import (
	"github.com/prometheus/client_golang/prometheus"
)

// registerStateMetrics registers the cluster state's metrics; fileErrors
// (the state directory's unparsable files) is nil for the API source;
// stale says why the cluster state may be out of date (nil: it is current).
func registerStateMetrics(reg prometheus.Registerer, fileErrors func() int, stale func() error) {
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
}
