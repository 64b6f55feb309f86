package agent

import (
	"net/netip"
	"sync"
	"time"

	"github.com/podnet/podnet/dataplane/app"
	"github.com/podnet/podnet/dataplane/cluster/statedir"
	"github.com/podnet/podnet/dataplane/health"
	"github.com/podnet/podnet/dataplane/routing"
)

// Status sections of the node agent on the daemon's status board.
const (
	StatusNode   = "node"
	StatusHealth = "health"
)

// NodeStatus is what the node agent reports: this node's pod network and
// its routes to every other node's pods, as last reconciled.
type NodeStatus struct {
	Name        string `json:"name"`
	PodCIDR     string `json:"podCIDR,omitempty"`
	ClusterCIDR string `json:"clusterCIDR"`
	Backend     string `json:"backend"`
	// ClusterState is "synced", "stale: …" (the API server is away, the
	// last state is served) or "loading".
	ClusterState string `json:"clusterState"`
	// StateDir is the state directory's last full scan (nil for the API
	// server): "synced" means the Store held what the files said then.
	StateDir *statedir.Status `json:"stateDir,omitempty"`
	Peers    []PeerStatus     `json:"peers"`
	// Skipped names the nodes that cannot be routed to, and why.
	Skipped   []string  `json:"skipped,omitempty"`
	LastSync  time.Time `json:"lastSync"`
	LastError string    `json:"lastError,omitempty"`
}

// PeerStatus is one other node and the route to its pods.
type PeerStatus struct {
	Name    string `json:"name"`
	NodeIP  string `json:"nodeIP"`
	PodCIDR string `json:"podCIDR"`
	Backend string `json:"backend"` // host-gw or vxlan
	Route   string `json:"route"`
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

// netStatus keeps the last reconciled routing table for the status
// board, which renders its plan when asked.
type netStatus struct {
	mu       sync.Mutex
	table    *routing.Table
	lastSync time.Time
	lastErr  error
}

func (s *netStatus) record(t *routing.Table, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.table, s.lastSync, s.lastErr = t, time.Now(), err
}

// report describes the last reconciliation.
func (n *nodeNet) report(src app.Source) NodeStatus {
	s := &n.status
	s.mu.Lock()
	t, last, lastErr := s.table, s.lastSync, s.lastErr
	s.mu.Unlock()
	var plan routing.Plan
	if t != nil {
		plan = t.Plan()
	}
	ns := NodeStatus{Name: n.o.NodeName, ClusterCIDR: n.o.ClusterCIDR.String(), Backend: string(n.o.Backend),
		ClusterState: "loading", LastSync: last, Skipped: plan.Skipped}
	select {
	case <-n.store.Synced():
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
	if plan.PodCIDR.IsValid() {
		ns.PodCIDR = plan.PodCIDR.String()
	}
	if lastErr != nil {
		ns.LastError = lastErr.Error()
	}
	routes := make(map[netip.Prefix]routing.Route, len(plan.Routes))
	for _, r := range plan.Routes {
		routes[r.Dst] = r
	}
	for _, p := range plan.Peers {
		ps := PeerStatus{Name: p.Name, NodeIP: p.NodeIP.String(), PodCIDR: p.PodCIDR.String(), Backend: "host-gw"}
		if p.VXLAN {
			ps.Backend = "vxlan"
		}
		if r, ok := routes[p.PodCIDR]; ok {
			ps.Route = r.String()
		}
		ns.Peers = append(ns.Peers, ps)
	}
	return ns
}
