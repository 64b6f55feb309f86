package statedir

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ClusterState is what a daemon's "cluster state" says over a state
// directory, given what it says otherwise ("synced", "loading", …):
// "synced" only while the last full scan found every file read whole and
// the Store holding what they say.
func (st Status) ClusterState(state string) string {
	switch {
	case state != "synced":
		return state
	case st.LastFullScan.IsZero():
		return "loading"
	case !st.InStep:
		return "out of step with the state directory at its last full scan (a file not read whole)"
	}
	return state
}

// Describe says when the last full scan was and what it found, for the
// daemons' status commands; now is the time to count "ago" from.
func (st Status) Describe(now time.Time) string {
	if st.LastFullScan.IsZero() {
		return "no full scan yet"
	}
	return fmt.Sprintf("%s, last full scan %s (%s ago): %d files, %d read; %d repairs since start",
		st.Dir, st.LastFullScan.Format(time.RFC3339), now.Sub(st.LastFullScan).Round(time.Second), st.Files, st.Read, st.Repairs)
}

// RegisterMetrics registers the Source's safety-net figures with reg:
// podnet_statedir_repairs_total (each a change the watcher-driven path
// missed), the last full scan's time and the files it found.
func RegisterMetrics(reg prometheus.Registerer, s *Source) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "podnet_statedir_repairs_total",
			Help: "Differences a full scan of the state directory found that no file event had brought (each a miss of the watcher-driven path), applied.",
		}, func() float64 { return float64(s.Status().Repairs) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "podnet_statedir_last_full_scan_timestamp_seconds",
			Help: "When the last full scan of the state directory ended (Unix time; 0: none yet).",
		}, func() float64 {
			if t := s.Status().LastFullScan; !t.IsZero() {
				return float64(t.UnixNano()) / 1e9
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "podnet_statedir_files",
			Help: "State files the last full scan of the state directory found.",
		}, func() float64 { return float64(s.Status().Files) }),
	)
}
