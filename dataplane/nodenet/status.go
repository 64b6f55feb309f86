package nodenet

import (
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/podnet/podnet/dataplane/routing"
)

// Status is what the node network reports: this node's pod network and
// its routes to every other node's pods, as last reconciled.
type Status struct {
	Name        string `json:"name"`
	PodCIDR     string `json:"podCIDR,omitempty"`
	ClusterCIDR string `json:"clusterCIDR"`
	// PodCIDRs and ClusterCIDRs hold every family's, in the order of
	// --cluster-cidr; Peers and Skipped list every family's.
	PodCIDRs     []string     `json:"podCIDRs,omitempty"`
	ClusterCIDRs []string     `json:"clusterCIDRs,omitempty"`
	Backend      string       `json:"backend"`
	Peers        []PeerStatus `json:"peers"`
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

// Report describes the last reconciliation: every family's podCIDR and
// peers, the first family's in PodCIDR and ClusterCIDR.
func (n *Network) Report() Status {
	ns := Status{Name: n.o.NodeName, Backend: string(n.o.Backend)}
	var errs []string
	for _, fm := range n.fams {
		s := &fm.status
		s.mu.Lock()
		t, last, lastErr := s.table, s.lastSync, s.lastErr
		s.mu.Unlock()
		ns.ClusterCIDRs = append(ns.ClusterCIDRs, fm.cluster.String())
		if last.After(ns.LastSync) {
			ns.LastSync = last
		}
		if lastErr != nil {
			errs = append(errs, lastErr.Error())
		}
		if t != nil {
			reportPlan(&ns, t.Plan())
		}
	}
	if len(ns.ClusterCIDRs) > 0 {
		ns.ClusterCIDR = ns.ClusterCIDRs[0]
	}
	if len(ns.PodCIDRs) > 0 {
		ns.PodCIDR = ns.PodCIDRs[0]
	}
	ns.LastError = strings.Join(errs, "; ")
	return ns
}

// reportPlan adds one family's plan to ns.
func reportPlan(ns *Status, plan routing.Plan) {
	ns.Skipped = append(ns.Skipped, plan.Skipped...)
	if plan.PodCIDR.IsValid() {
		ns.PodCIDRs = append(ns.PodCIDRs, plan.PodCIDR.String())
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
}
