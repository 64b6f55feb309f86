package proxy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
)

// StatusSection is the proxy's section of the daemon's status board.
const StatusSection = "serviceProxy"

// Status is what the Service proxy reports of itself: what the last
// successful sync programmed, and how syncing goes.
type Status struct {
	Mode string `json:"mode"`
	// LastSync is when the last successful sync ended (zero: none yet).
	LastSync         time.Time `json:"lastSync"`
	LastSyncDuration string    `json:"lastSyncDuration,omitempty"`
	LastSyncFull     bool      `json:"lastSyncFull"`
	// LastError is the error of the last sync, if it failed.
	LastError string `json:"lastError,omitempty"`
	// Changes seen and not yet taken into a sync, by Service.
	PendingServiceChanges  int             `json:"pendingServiceChanges"`
	PendingEndpointChanges int             `json:"pendingEndpointChanges"`
	Services               []ServiceStatus `json:"services"`
}

// ServiceStatus is one programmed Service.
type ServiceStatus struct {
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	Ports     []PortStatus `json:"ports"`
}

// PortStatus is one programmed Service port: the addresses it is reached
// at and the endpoints traffic goes to.
type PortStatus struct {
	Name     string `json:"name,omitempty"`
	Protocol string `json:"protocol"`
	// Frontends are "IP:port" (cluster IP, external IPs, load balancer
	// IPs) and ":nodePort" for the NodePort on the node's addresses.
	Frontends []string `json:"frontends"`
	// Endpoints lists every endpoint the rules send traffic to: for
	// policy Cluster traffic, for policy Local traffic, or both.
	Endpoints           []EndpointStatus `json:"endpoints"`
	ExternalPolicyLocal bool             `json:"externalPolicyLocal,omitempty"`
	InternalPolicyLocal bool             `json:"internalPolicyLocal,omitempty"`
	// NoEndpoints: traffic is rejected, no usable endpoint exists.
	NoEndpoints bool `json:"noEndpoints,omitempty"`
}

// EndpointStatus is one endpoint in use.
type EndpointStatus struct {
	Address string `json:"address"` // IP:port
	// Cluster and Local say which traffic uses it.
	Cluster     bool   `json:"cluster"`
	Local       bool   `json:"local"`
	Node        string `json:"node,omitempty"`
	Ready       bool   `json:"ready"`
	Terminating bool   `json:"terminating,omitempty"`
}

// statusLog keeps what Status reports, written by the syncer after each
// sync, read by the status board from any goroutine.
type statusLog struct {
	mu   sync.Mutex
	mode string
	// programmed is what the kernel held after the last successful sync,
	// brought up to date one changed Service at a time: a copy of all of
	// it after every sync was 1 MB live and 1.3 MB of garbage a sync at
	// 10,000 Services. Only the syncer writes it (under mu), so the syncer
	// may read it without mu.
	programmed map[cluster.Key][]*ServicePort
	lastSync   time.Time
	took       time.Duration
	full       bool
	lastErr    error
}

// synced records a successful sync that made the kernel hold ports, in
// which the Services in changed are all that differ from the last one.
func (l *statusLog) synced(ports map[cluster.Key][]*ServicePort, changed map[cluster.Key]bool, full bool, took time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.programmed == nil {
		l.programmed = make(map[cluster.Key][]*ServicePort, len(ports))
	}
	for k := range changed {
		if sps, ok := ports[k]; ok {
			l.programmed[k] = sps
		} else {
			delete(l.programmed, k)
		}
	}
	l.lastSync, l.took, l.full, l.lastErr = time.Now(), took, full, nil
}

func (l *statusLog) failed(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastErr = err
}

// status builds the report; m gives the pending changes.
func (l *statusLog) status(m *Metrics) Status {
	l.mu.Lock()
	st := Status{Mode: l.mode, LastSync: l.lastSync, LastSyncFull: l.full}
	if !l.lastSync.IsZero() {
		st.LastSyncDuration = l.took.String()
	}
	if l.lastErr != nil {
		st.LastError = l.lastErr.Error()
	}
	st.Services = ServiceStatuses(l.programmed)
	l.mu.Unlock()
	st.PendingServiceChanges, st.PendingEndpointChanges = m.pending()
	return st
}

// ServiceStatuses describes ports, sorted by Service and port name.
func ServiceStatuses(ports map[cluster.Key][]*ServicePort) []ServiceStatus {
	out := make([]ServiceStatus, 0, len(ports))
	for key, sps := range ports {
		ss := ServiceStatus{Namespace: key.Namespace, Name: key.Name}
		for _, sp := range sps {
			ss.Ports = append(ss.Ports, portStatus(sp))
		}
		slices.SortFunc(ss.Ports, func(a, b PortStatus) int {
			return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Protocol, b.Protocol))
		})
		out = append(out, ss)
	}
	slices.SortFunc(out, func(a, b ServiceStatus) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

func portStatus(sp *ServicePort) PortStatus {
	ps := PortStatus{
		Name: sp.Name.Port, Protocol: string(sp.Protocol),
		ExternalPolicyLocal: sp.ExternalPolicyLocal && sp.External(), InternalPolicyLocal: sp.InternalPolicyLocal,
		NoEndpoints: !sp.HasEndpoints,
	}
	for _, ip := range append(append([]netip.Addr{sp.ClusterIP}, sp.ExternalIPs...), sp.LoadBalancerIPs...) {
		if ip.IsValid() {
			ps.Frontends = append(ps.Frontends, fmt.Sprintf("%s:%d", ip, sp.Port))
		}
	}
	if sp.NodePort != 0 {
		ps.Frontends = append(ps.Frontends, fmt.Sprintf(":%d", sp.NodePort))
	}
	byAddr := map[string]*EndpointStatus{}
	add := func(e Endpoint, cluster bool) {
		a := e.AddrPort().String()
		es := byAddr[a]
		if es == nil {
			es = &EndpointStatus{Address: a, Node: e.NodeName(), Ready: e.Ready, Terminating: e.Terminating}
			byAddr[a] = es
		}
		if cluster {
			es.Cluster = true
		} else {
			es.Local = true
		}
	}
	if sp.usesClusterEndpoints() {
		for _, e := range sp.ClusterEndpoints {
			add(e, true)
		}
	}
	if sp.usesLocalEndpoints() {
		for _, e := range sp.LocalEndpoints {
			add(e, false)
		}
	}
	for _, es := range byAddr {
		ps.Endpoints = append(ps.Endpoints, *es)
	}
	slices.SortFunc(ps.Endpoints, func(a, b EndpointStatus) int { return cmp.Compare(a.Address, b.Address) })
	return ps
}
