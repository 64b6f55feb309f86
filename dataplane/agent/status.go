package agent

import (
	"time"

	"github.com/podnet/podnet/dataplane/app"
	"github.com/podnet/podnet/dataplane/cluster/statedir"
	"github.com/podnet/podnet/dataplane/health"
	"github.com/podnet/podnet/dataplane/nodenet"
)

// Status sections of the node agent on the daemon's status board.
const (
	StatusNode   = "node"
	StatusHealth = "health"
)

// NodeStatus is what the node agent reports: the node network's status
// and the cluster state it was computed from.
type NodeStatus struct {
	nodenet.Status
	// ClusterState is "synced", "stale: …" (the API server is away, the
	// last state is served) or "loading".
	ClusterState string `json:"clusterState"`
	// StateDir is the state directory's last full scan (nil for the API
	// server): "synced" means the Store held what the files said then.
	StateDir *statedir.Status `json:"stateDir,omitempty"`
}

// HealthStatus is the daemon's health: the verdict of /healthz and the
// state of each part.
type HealthStatus struct {
	Healthy bool `json:"healthy"`
	// Pending is how long the oldest change not yet programmed has waited.
	Pending     string            `json:"pending,omitempty"`
	LastUpdated time.Time         `json:"lastUpdated"`
	Components  map[string]string `json:"components"`
}

func healthStatus(p *health.Progress, c *health.Checker) HealthStatus {
	s := p.State()
	hs := HealthStatus{Healthy: s.Healthy, LastUpdated: s.LastUpdated, Components: map[string]string{}}
	if s.Pending > 0 {
		hs.Pending = s.Pending.Round(time.Millisecond).String()
	}
	for name, err := range c.States() {
		hs.Components[name] = "ok"
		if err != nil {
			hs.Components[name] = err.Error()
		}
	}
	return hs
}

// nodeStatus describes the node network's last reconciliation and the
// cluster state.
func nodeStatus(n *nodenet.Network, src app.Source) NodeStatus {
	ns := NodeStatus{Status: n.Report(), ClusterState: "loading"}
	select {
	case <-src.Store.Synced():
		ns.ClusterState = "synced"
		if err := src.Stale(); err != nil {
			ns.ClusterState = "stale: " + err.Error()
		}
	default:
	}
	if src.StateDir != nil {
		st := src.StateDir.Status()
		ns.StateDir = &st
		ns.ClusterState = st.ClusterState(ns.ClusterState)
	}
	return ns
}
