package nodenet

import (
	"net/netip"
	"sync"
	"time"

	"github.com/podnet/podnet/dataplane/routing"
)

// Status is what the node network reports: this node's pod network and
// its routes to every other node's pods, as last reconciled.
type Status struct {
	Name        string       `json:"name"`
	PodCIDR     string       `json:"podCIDR,omitempty"`
	ClusterCIDR string       `json:"clusterCIDR"`
	Backend     string       `json:"backend"`
	Peers       []PeerStatus `json:"peers"`
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

// Report describes the last reconciliation.
func (n *Network) Report() Status {
	s := &n.status
	s.mu.Lock()
	t, last, lastErr := s.table, s.lastSync, s.lastErr
	s.mu.Unlock()
	var plan routing.Plan
	if t != nil {
		plan = t.Plan()
	}
	ns := Status{Name: n.o.NodeName, ClusterCIDR: n.o.ClusterCIDR.String(), Backend: string(n.o.Backend),
		LastSync: last, Skipped: plan.Skipped}
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
