// Package cluster is podnet's view of the Kubernetes cluster: compact structs
// holding only what the dataplane uses (netip types, no whole API objects), a
// Store that keeps the current set and tells subscribers what changed. Two
// sources fill it: the state directory (cluster/statedir) and the Kubernetes
// API through client-go reflectors (cluster/kube); cluster/convert turns API
// objects into these structs for both.
//
// Sources write into a Store; consumers (proxyd, dnsd) read from it and never
// know which source is behind it.
package cluster

import (
	"net/netip"
	"time"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// Kind names a type of object held by the Store.
type Kind int

const (
	KindNode Kind = iota
	KindService
	KindEndpointSlice
	KindNamespace
	KindPod
	KindNetworkPolicy
	numKinds
)

func (k Kind) String() string {
	switch k {
	case KindNode:
		return "Node"
	case KindService:
		return "Service"
	case KindEndpointSlice:
		return "EndpointSlice"
	case KindNamespace:
		return "Namespace"
	case KindPod:
		return "Pod"
	case KindNetworkPolicy:
		return "NetworkPolicy"
	}
	return "Unknown"
}

// Key identifies an object of a kind. Namespace is empty for cluster-scoped
// objects (Nodes, Namespaces).
type Key struct {
	Namespace string
	Name      string
}

func (k Key) String() string {
	if k.Namespace == "" {
		return k.Name
	}
	return k.Namespace + "/" + k.Name
}

// Object is one of *Node, *Service, *EndpointSlice, *Namespace, *Pod. Objects
// handed out by the Store are shared and must not be modified.
type Object interface {
	Kind() Kind
	Key() Key
}

// Protocol is a Service or endpoint port protocol.
type Protocol string

const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// Node is the part of a v1.Node the dataplane needs.
type Node struct {
	Name        string
	PodCIDRs    []netip.Prefix // spec.podCIDRs (or spec.podCIDR)
	InternalIPs []netip.Addr   // status.addresses of type InternalIP
	ExternalIPs []netip.Addr   // status.addresses of type ExternalIP
	Zone        string         // label topology.kubernetes.io/zone
	Labels      map[string]string
	// Leaving is true while the node is being deleted (deletionTimestamp
	// set) or drained by the cluster autoscaler (taint
	// ToBeDeletedByClusterAutoscaler): load balancers should stop sending
	// it traffic, as kube-proxy's /healthz tells them.
	Leaving bool
	// Flannel is what the Node's flannel annotations say (its VTEP MAC,
	// backend, public IP), nil without them: a node still on flannel while
	// the cluster migrates, or a podnet node speaking flannel's language.
	Flannel *Flannel
}

func (n *Node) Kind() Kind { return KindNode }
func (n *Node) Key() Key   { return Key{Name: n.Name} }

// PodCIDR returns the node's first pod CIDR of family f, if it has one.
func (n *Node) PodCIDR(f ipfamily.Family) (netip.Prefix, bool) {
	for _, p := range n.PodCIDRs {
		if f.HasPrefix(p) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// InternalIP returns the node's first InternalIP of family f, if it has one.
func (n *Node) InternalIP(f ipfamily.Family) (netip.Addr, bool) {
	for _, a := range n.InternalIPs {
		if f.Has(a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// ServiceType is spec.type of a Service.
type ServiceType string

const (
	ServiceTypeClusterIP    ServiceType = "ClusterIP"
	ServiceTypeNodePort     ServiceType = "NodePort"
	ServiceTypeLoadBalancer ServiceType = "LoadBalancer"
	ServiceTypeExternalName ServiceType = "ExternalName"
)

// ServicePort is one entry of spec.ports.
type ServicePort struct {
	Name       string
	Protocol   Protocol
	Port       uint16
	NodePort   uint16 // 0 when none
	TargetPort string // number or named port, as written; informational
}

// Service is the part of a v1.Service the dataplane needs.
type Service struct {
	Namespace string
	Name      string
	Type      ServiceType
	// ClusterIPs holds spec.clusterIPs; empty for headless and ExternalName.
	ClusterIPs []netip.Addr
	// Headless is spec.clusterIP "None".
	Headless     bool
	ExternalName string
	ExternalIPs  []netip.Addr
	// LoadBalancerIPs are status.loadBalancer.ingress[].ip.
	LoadBalancerIPs          []netip.Addr
	LoadBalancerSourceRanges []netip.Prefix
	Ports                    []ServicePort
	// SessionAffinityTimeout is non-zero when sessionAffinity is ClientIP.
	SessionAffinityTimeout     time.Duration
	ExternalTrafficPolicyLocal bool
	InternalTrafficPolicyLocal bool
	HealthCheckNodePort        uint16
	// TrafficDistribution is spec.trafficDistribution ("", "PreferClose",
	// "PreferSameZone", "PreferSameNode").
	TrafficDistribution      string
	PublishNotReadyAddresses bool
	// ProxyName is the label service.kubernetes.io/service-proxy-name; a
	// Service that has it belongs to another proxy.
	ProxyName string
}

func (s *Service) Kind() Kind { return KindService }
func (s *Service) Key() Key   { return Key{Namespace: s.Namespace, Name: s.Name} }

// EndpointPort is one entry of an EndpointSlice's ports.
type EndpointPort struct {
	Name     string
	Protocol Protocol
	Port     uint16
}

// Endpoint is one entry of an EndpointSlice's endpoints. Nil conditions are
// already resolved the way the API documents them (ready: nil means true;
// serving: nil means ready; terminating: nil means false).
type Endpoint struct {
	Addresses   []netip.Addr
	Ready       bool
	Serving     bool
	Terminating bool
	Hostname    string
	NodeName    string
	Zone        string
	// Hints is nil when the endpoint has none, as most do: held by
	// pointer, the two slices cost 8 bytes instead of 48 an endpoint.
	Hints *Hints
	// TargetPod is targetRef.name when targetRef.kind is Pod.
	TargetPod string
}

// Hints are an endpoint's topology hints (hints.forZones and forNodes).
type Hints struct {
	Zones []string
	Nodes []string
}

// ForZones is the zones hinted, nil for a nil Hints.
func (h *Hints) ForZones() []string {
	if h == nil {
		return nil
	}
	return h.Zones
}

// ForNodes is the nodes hinted, nil for a nil Hints.
func (h *Hints) ForNodes() []string {
	if h == nil {
		return nil
	}
	return h.Nodes
}

// EndpointSlice is the part of a discovery.k8s.io/v1 EndpointSlice the
// dataplane needs.
type EndpointSlice struct {
	Namespace string
	Name      string
	// ServiceName is the label kubernetes.io/service-name.
	ServiceName string
	// AddressType is IPv4, IPv6 or FQDN.
	AddressType string
	Ports       []EndpointPort
	Endpoints   []Endpoint
	// TriggerTime is the annotation
	// endpoints.kubernetes.io/last-change-trigger-time: when the change
	// this version of the slice reflects was made (a Pod or Service
	// update). Zero when absent. The proxy and DNS measure their
	// programming latency from it, as kube-proxy and CoreDNS do.
	TriggerTime time.Time
	// NotProxied: the slice carries the label service.kubernetes.io/headless
	// or service.kubernetes.io/service-proxy-name (any value). Service
	// proxies leave such a slice's endpoints out, as kube-proxy's watch
	// does; DNS still serves them (the endpoint slice controller labels
	// every headless Service's slices so).
	NotProxied bool
}

func (e *EndpointSlice) Kind() Kind { return KindEndpointSlice }
func (e *EndpointSlice) Key() Key   { return Key{Namespace: e.Namespace, Name: e.Name} }

// ServiceKey is the key of the Service this slice belongs to.
func (e *EndpointSlice) ServiceKey() Key { return Key{Namespace: e.Namespace, Name: e.ServiceName} }

// Namespace is a v1.Namespace: its existence (DNS) and its labels
// (NetworkPolicy namespaceSelectors).
type Namespace struct {
	Name   string
	Labels map[string]string
}

func (n *Namespace) Kind() Kind { return KindNamespace }
func (n *Namespace) Key() Key   { return Key{Name: n.Name} }

// Pod is the part of a v1.Pod DNS needs for verified pod records and
// NetworkPolicy needs for selectors and named ports.
type Pod struct {
	Namespace string
	Name      string
	IPs       []netip.Addr
	Hostname  string
	Subdomain string
	NodeName  string
	Labels    map[string]string
	// HostNetwork pods share their node's addresses; NetworkPolicy does
	// not apply to them.
	HostNetwork bool
	// Ports are the containers' named ports (spec.containers[].ports with
	// a name), which NetworkPolicy ports may name.
	Ports []NamedPort
}

// NamedPort is a container port with a name.
type NamedPort struct {
	Name     string
	Protocol Protocol
	Port     uint16
}

func (p *Pod) Kind() Kind { return KindPod }
func (p *Pod) Key() Key   { return Key{Namespace: p.Namespace, Name: p.Name} }
