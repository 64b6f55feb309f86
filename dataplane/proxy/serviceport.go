// Package proxy turns the cluster's Services and EndpointSlices into the
// backend-neutral desired state of a Service proxy: one ServicePort per
// (Service, port), each with the endpoints this node must use for internal
// and for external traffic, chosen the way kube-proxy chooses them (readiness,
// serving-and-terminating fallback, traffic policies, topology).
//
// It also tracks which Services changed since the last sync (Tracker), runs
// the sync loop around a Backend (Run), and serves healthCheckNodePorts.
// Backends (proxy/iptables, proxy/ebpf) only turn ServicePorts into kernel
// state; they never look at cluster objects. Each backend is offered as a
// Mode (probe, build, cleanup); a daemon holds a table of them (Modes) and
// picks one by name, so it never imports a backend for a constant. A built
// ServicePort is never changed (see ServicePort).
package proxy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

// PortName identifies one port of one Service.
type PortName struct {
	Service  cluster.Key
	Port     string // spec.ports[].name, often ""
	Protocol cluster.Protocol
}

func (n PortName) String() string {
	return fmt.Sprintf("%s:%s/%s", n.Service, n.Port, n.Protocol)
}

// Endpoint is one backend of a ServicePort. Its address, node, zone and
// hints stay in the EndpointSlice's endpoint it points to, which the Store
// never changes; it holds what is its own for this port: 16 bytes an
// endpoint, where a copy of all of it was 72 (at 10,000 Services × 10,
// 5.6 MB of proxyd's live heap).
type Endpoint struct {
	// from is the slice endpoint this one was built from: its first
	// address is this endpoint's.
	from        *cluster.Endpoint
	Port        uint16
	Ready       bool
	Serving     bool
	Terminating bool
	// Local is true when the endpoint runs on this node.
	Local bool
}

// NewEndpoint returns an endpoint at addr and port that no EndpointSlice
// holds (a test's): no node, zone or hints, conditions to set.
func NewEndpoint(addr netip.Addr, port uint16) Endpoint {
	return Endpoint{from: &cluster.Endpoint{Addresses: []netip.Addr{addr}}, Port: port}
}

// Addr is the endpoint's address; invalid for the zero Endpoint.
func (e Endpoint) Addr() netip.Addr {
	if e.from == nil || len(e.from.Addresses) == 0 {
		return netip.Addr{}
	}
	return e.from.Addresses[0]
}

// AddrPort is the endpoint's address and port.
func (e Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Addr(), e.Port) }

// NodeName is the endpoint's nodeName, "" when unknown.
func (e Endpoint) NodeName() string {
	if e.from == nil {
		return ""
	}
	return e.from.NodeName
}

// Zone is the endpoint's zone, "" when unknown.
func (e Endpoint) Zone() string {
	if e.from == nil {
		return ""
	}
	return e.from.Zone
}

// Hints are the endpoint's topology hints, nil when it has none.
func (e Endpoint) Hints() *cluster.Hints {
	if e.from == nil {
		return nil
	}
	return e.from.Hints
}

// ServicePort is one port of one Service in one address family, resolved
// for this node: a dual-stack Service has one per family, each with the
// cluster IP, external addresses and endpoints of that family.
//
// A built ServicePort is never changed: a change to the Service or its
// endpoints builds a new one. Backends rely on this and may key what they
// derive from it by its pointer (the iptables generator memoizes its rules
// so), so neither the proxy nor a backend may write to one it was handed.
type ServicePort struct {
	Name      PortName
	ClusterIP netip.Addr // the cluster IP of the port's family
	Port      uint16
	Protocol  cluster.Protocol
	NodePort  uint16 // 0: none

	ExternalIPs              []netip.Addr
	LoadBalancerIPs          []netip.Addr
	LoadBalancerSourceRanges []netip.Prefix

	// AffinityTimeout is non-zero for sessionAffinity ClientIP.
	AffinityTimeout     time.Duration
	ExternalPolicyLocal bool
	InternalPolicyLocal bool
	HealthCheckNodePort uint16

	// Endpoints holds every endpoint of the port's family, sorted by
	// address.
	Endpoints []Endpoint
	// ClusterEndpoints are the endpoints for traffic with policy Cluster,
	// after readiness and topology; LocalEndpoints those for policy Local.
	ClusterEndpoints []Endpoint
	LocalEndpoints   []Endpoint
	// HasEndpoints is false when no usable endpoint exists anywhere: traffic
	// is then rejected rather than dropped.
	HasEndpoints bool
}

// Family is the port's address family, its cluster IP's.
func (sp *ServicePort) Family() ipfamily.Family { return ipfamily.Of(sp.ClusterIP) }

// External reports whether the port is reachable from outside the cluster
// network (NodePort, externalIPs, load-balancer IPs).
func (sp *ServicePort) External() bool {
	return sp.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerIPs) > 0
}

// InternalEndpoints are the endpoints for traffic to the cluster IP.
func (sp *ServicePort) InternalEndpoints() []Endpoint {
	if sp.InternalPolicyLocal {
		return sp.LocalEndpoints
	}
	return sp.ClusterEndpoints
}

// ExternalEndpoints are the endpoints for traffic from outside the cluster
// to NodePorts, externalIPs and load-balancer IPs.
func (sp *ServicePort) ExternalEndpoints() []Endpoint {
	if sp.ExternalPolicyLocal {
		return sp.LocalEndpoints
	}
	return sp.ClusterEndpoints
}

func (sp *ServicePort) usesClusterEndpoints() bool {
	return !sp.InternalPolicyLocal || (sp.External() && !sp.ExternalPolicyLocal)
}

func (sp *ServicePort) usesLocalEndpoints() bool {
	return sp.InternalPolicyLocal || (sp.External() && sp.ExternalPolicyLocal)
}

// NodeInfo is what endpoint selection needs to know about this node.
type NodeInfo struct {
	Name string
	Zone string
	// PodCIDRs are the node's pod networks: an endpoint address inside one
	// is on this node whatever its slice's nodeName says (the field is
	// optional, and hand-written slices omit it or get it wrong).
	PodCIDRs []netip.Prefix
}

// local reports whether an endpoint with address a and the given nodeName
// runs on this node. kube-proxy masquerades any endpoint reaching itself;
// deciding from the address as well keeps hairpin traffic working for
// slices without nodeName.
func (n NodeInfo) local(a netip.Addr, nodeName string) bool {
	if n.Name != "" && nodeName == n.Name {
		return true
	}
	for _, p := range n.PodCIDRs {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Handled reports whether this proxy implements svc in family f: not
// headless, not ExternalName, not claimed by another proxy, with a cluster
// IP of f.
func Handled(svc *cluster.Service, f ipfamily.Family) bool {
	if svc == nil || svc.Headless || svc.ProxyName != "" || svc.Type == cluster.ServiceTypeExternalName {
		return false
	}
	_, ok := clusterIP(svc, f)
	return ok
}

func clusterIP(svc *cluster.Service, f ipfamily.Family) (netip.Addr, bool) {
	for _, a := range svc.ClusterIPs {
		if f.Has(a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// BuildServicePorts resolves one Service and its EndpointSlices for node
// in family f: one ServicePort per port, for the Service's cluster IP of f.
// It returns nil for Services this proxy leaves alone in f.
func BuildServicePorts(svc *cluster.Service, eps []*cluster.EndpointSlice, node NodeInfo, f ipfamily.Family) []*ServicePort {
	if !Handled(svc, f) {
		return nil
	}
	vip, _ := clusterIP(svc, f)
	var out []*ServicePort
	for _, p := range svc.Ports {
		sp := &ServicePort{
			Name:                     PortName{Service: svc.Key(), Port: p.Name, Protocol: p.Protocol},
			ClusterIP:                vip,
			Port:                     p.Port,
			Protocol:                 p.Protocol,
			ExternalIPs:              f.Addrs(svc.ExternalIPs),
			AffinityTimeout:          svc.SessionAffinityTimeout,
			ExternalPolicyLocal:      svc.ExternalTrafficPolicyLocal,
			InternalPolicyLocal:      svc.InternalTrafficPolicyLocal,
			LoadBalancerSourceRanges: f.Prefixes(svc.LoadBalancerSourceRanges),
		}
		if svc.Type == cluster.ServiceTypeNodePort || svc.Type == cluster.ServiceTypeLoadBalancer {
			sp.NodePort = p.NodePort
		}
		if svc.Type == cluster.ServiceTypeLoadBalancer {
			sp.LoadBalancerIPs = f.Addrs(svc.LoadBalancerIPs)
		}
		if !sp.External() {
			sp.ExternalPolicyLocal = false
		}
		if sp.ExternalPolicyLocal {
			sp.HealthCheckNodePort = svc.HealthCheckNodePort
		}
		sp.Endpoints = collectEndpoints(p, eps, node, f)
		categorize(sp, svc.TrafficDistribution, node)
		out = append(out, sp)
	}
	return out
}

// collectEndpoints merges the slices' endpoints for one Service port: the
// slice port with the same name and protocol gives the target port. An
// address listed twice keeps its most usable entry. Slices labelled
// headless or for another proxy give none.
func collectEndpoints(p cluster.ServicePort, eps []*cluster.EndpointSlice, node NodeInfo, f ipfamily.Family) []Endpoint {
	byAddr := make(map[netip.AddrPort]Endpoint)
	for _, es := range eps {
		if es.NotProxied || es.AddressType != "" && es.AddressType != f.String() {
			continue
		}
		var port uint16
		for _, ep := range es.Ports {
			if ep.Name == p.Name && ep.Protocol == p.Protocol {
				port = ep.Port
				break
			}
		}
		if port == 0 {
			continue
		}
		for i := range es.Endpoints {
			e := &es.Endpoints[i]
			if len(e.Addresses) == 0 || !f.Has(e.Addresses[0]) {
				continue
			}
			n := Endpoint{
				from: e, Port: port,
				Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating,
				Local: node.local(e.Addresses[0], e.NodeName),
			}
			if old, ok := byAddr[n.AddrPort()]; ok && (old.Ready || !n.Ready && old.Serving) {
				continue
			}
			byAddr[n.AddrPort()] = n
		}
	}
	out := make([]Endpoint, 0, len(byAddr))
	for _, e := range byAddr {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Endpoint) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(a.Port, b.Port)
	})
	return out
}
