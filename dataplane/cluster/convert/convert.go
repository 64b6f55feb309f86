// Package convert reduces Kubernetes API objects to the compact cluster
// structs. Both sources (the state directory and the Kubernetes API) use it,
// so an object means the same thing whichever way it arrives. Defaults the
// API server would apply (cluster.Service type, protocol, session affinity timeout,
// namespace) are applied here too, because state-directory files are
// written by hand. It is apart from package cluster so that consumers of the
// compact structs (the DNS query path, say) do not link the API types.
package convert

import (
	"fmt"
	"net/netip"
	"strings"
	"time"
	"unique"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/podnet/podnet/dataplane/cluster"
)

func defaultNamespace(ns string) string {
	if ns == "" {
		return "default"
	}
	return intern(ns)
}

// intern returns the one shared copy of s. Namespaces, node names, zones,
// address types and port names repeat across thousands of objects, and a
// decoder allocates each occurrence anew: at 10,000 EndpointSlices of 10
// endpoints the nodeName strings alone were 100,000 allocations, 0.8 MB of
// the Store.
func intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}

func parseAddrs(field string, ss []string) ([]netip.Addr, error) {
	out, err := appendAddrs(nil, ss)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	return out, nil
}

// appendAddrs appends the addresses in ss to dst, skipping empty ones.
func appendAddrs(dst []netip.Addr, ss []string) ([]netip.Addr, error) {
	for _, s := range ss {
		if s == "" {
			continue
		}
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		dst = append(dst, a.Unmap())
	}
	return dst, nil
}

func parsePrefixes(field string, ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range ss {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func protocol(p v1.Protocol) cluster.Protocol {
	if p == "" {
		return cluster.TCP
	}
	return cluster.Protocol(p)
}

// FromV1Node reduces a v1.Node.
func FromV1Node(n *v1.Node) (*cluster.Node, error) {
	out := &cluster.Node{Name: n.Name, Zone: intern(n.Labels[cluster.LabelZone]), Leaving: n.DeletionTimestamp != nil,
		Flannel: cluster.ParseFlannel(n.Annotations)}
	for _, t := range n.Spec.Taints {
		if t.Key == cluster.TaintToBeDeleted {
			out.Leaving = true
		}
	}
	if len(n.Labels) > 0 {
		out.Labels = make(map[string]string, len(n.Labels))
		for k, v := range n.Labels {
			out.Labels[k] = v
		}
	}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	var err error
	if out.PodCIDRs, err = parsePrefixes("spec.podCIDRs", cidrs); err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	for _, a := range n.Status.Addresses {
		var dst *[]netip.Addr
		switch a.Type {
		case v1.NodeInternalIP:
			dst = &out.InternalIPs
		case v1.NodeExternalIP:
			dst = &out.ExternalIPs
		default:
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			return nil, fmt.Errorf("node %s: status.addresses %s: %w", n.Name, a.Type, err)
		}
		*dst = append(*dst, ip.Unmap())
	}
	return out, nil
}

// FromV1Service reduces a v1.Service.
func FromV1Service(s *v1.Service) (*cluster.Service, error) {
	out := &cluster.Service{
		Namespace:                defaultNamespace(s.Namespace),
		Name:                     s.Name,
		Type:                     cluster.ServiceType(s.Spec.Type),
		ExternalName:             s.Spec.ExternalName,
		HealthCheckNodePort:      uint16(s.Spec.HealthCheckNodePort),
		PublishNotReadyAddresses: s.Spec.PublishNotReadyAddresses,
		ProxyName:                s.Labels[cluster.LabelServiceProxyName],
	}
	fail := func(err error) (*cluster.Service, error) {
		return nil, fmt.Errorf("service %s: %w", out.Key(), err)
	}
	if out.Type == "" {
		out.Type = cluster.ServiceTypeClusterIP
	}
	if s.Spec.TrafficDistribution != nil {
		out.TrafficDistribution = *s.Spec.TrafficDistribution
	}
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		ips = []string{s.Spec.ClusterIP}
	}
	switch {
	case out.Type == cluster.ServiceTypeExternalName:
	case len(ips) > 0 && ips[0] == v1.ClusterIPNone:
		out.Headless = true
	default:
		var err error
		if out.ClusterIPs, err = parseAddrs("spec.clusterIPs", ips); err != nil {
			return fail(err)
		}
	}
	var err error
	if out.ExternalIPs, err = parseAddrs("spec.externalIPs", s.Spec.ExternalIPs); err != nil {
		return fail(err)
	}
	var lb []string
	for _, ing := range s.Status.LoadBalancer.Ingress {
		lb = append(lb, ing.IP)
	}
	if out.LoadBalancerIPs, err = parseAddrs("status.loadBalancer.ingress.ip", lb); err != nil {
		return fail(err)
	}
	if out.LoadBalancerSourceRanges, err = parsePrefixes("spec.loadBalancerSourceRanges", s.Spec.LoadBalancerSourceRanges); err != nil {
		return fail(err)
	}
	for _, p := range s.Spec.Ports {
		out.Ports = append(out.Ports, cluster.ServicePort{
			Name:       p.Name,
			Protocol:   protocol(p.Protocol),
			Port:       uint16(p.Port),
			NodePort:   uint16(p.NodePort),
			TargetPort: p.TargetPort.String(),
		})
	}
	if s.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		out.SessionAffinityTimeout = cluster.DefaultSessionAffinityTimeout
		if c := s.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			out.SessionAffinityTimeout = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
		}
	}
	out.ExternalTrafficPolicyLocal = s.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	out.InternalTrafficPolicyLocal = s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	return out, nil
}

// FromV1EndpointSlice reduces a discovery.k8s.io/v1 cluster.EndpointSlice. Nil
// conditions are resolved as the API documents: ready nil is true, serving
// nil follows ready, terminating nil is false.
func FromV1EndpointSlice(e *discoveryv1.EndpointSlice) (*cluster.EndpointSlice, error) {
	out := &cluster.EndpointSlice{
		Namespace:   defaultNamespace(e.Namespace),
		Name:        e.Name,
		ServiceName: e.Labels[cluster.LabelServiceName],
		AddressType: intern(string(e.AddressType)),
	}
	_, headless := e.Labels[cluster.LabelHeadless]
	_, otherProxy := e.Labels[cluster.LabelServiceProxyName]
	out.NotProxied = headless || otherProxy
	if v, ok := e.Annotations[cluster.AnnotationTriggerTime]; ok {
		// A malformed time only costs the latency measurement.
		out.TriggerTime, _ = time.Parse(time.RFC3339Nano, v)
	}
	// Sized up front: append's doubling left 10 endpoints in room for 16,
	// a third of the Store's memory at 10,000 slices of 10.
	out.Ports = make([]cluster.EndpointPort, 0, len(e.Ports))
	out.Endpoints = make([]cluster.Endpoint, 0, len(e.Endpoints))
	for _, p := range e.Ports {
		out.Ports = append(out.Ports, fromV1EndpointPort(p))
	}
	// The endpoints' addresses share one array: one allocation a slice,
	// not one an endpoint.
	var addrs []netip.Addr
	if e.AddressType != discoveryv1.AddressTypeFQDN {
		n := 0
		for _, ep := range e.Endpoints {
			n += len(ep.Addresses)
		}
		addrs = make([]netip.Addr, 0, n)
	}
	for i, ep := range e.Endpoints {
		c := cluster.Endpoint{Ready: true, Hostname: deref(ep.Hostname), NodeName: intern(deref(ep.NodeName)), Zone: intern(deref(ep.Zone))}
		if e.AddressType != discoveryv1.AddressTypeFQDN {
			start := len(addrs)
			var err error
			if addrs, err = appendAddrs(addrs, ep.Addresses); err != nil {
				return nil, fmt.Errorf("endpointslice %s: endpoints[%d].addresses: %w", out.Key(), i, err)
			}
			if len(addrs) > start {
				c.Addresses = addrs[start:len(addrs):len(addrs)]
			}
		}
		endpointDetails(&c, ep)
		out.Endpoints = append(out.Endpoints, c)
	}
	return out, nil
}

func fromV1EndpointPort(p discoveryv1.EndpointPort) cluster.EndpointPort {
	var ep cluster.EndpointPort
	if p.Name != nil {
		ep.Name = intern(*p.Name)
	}
	ep.Protocol = cluster.TCP
	if p.Protocol != nil {
		ep.Protocol = protocol(*p.Protocol)
	}
	if p.Port != nil {
		ep.Port = uint16(*p.Port)
	}
	return ep
}

// endpointDetails sets c's conditions, hints and target pod from ep.
func endpointDetails(c *cluster.Endpoint, ep discoveryv1.Endpoint) {
	if ep.Conditions.Ready != nil {
		c.Ready = *ep.Conditions.Ready
	}
	c.Serving = c.Ready
	if ep.Conditions.Serving != nil {
		c.Serving = *ep.Conditions.Serving
	}
	if ep.Conditions.Terminating != nil {
		c.Terminating = *ep.Conditions.Terminating
	}
	if ep.Hints != nil && (len(ep.Hints.ForZones) > 0 || len(ep.Hints.ForNodes) > 0) {
		c.Hints = &cluster.Hints{}
		for _, z := range ep.Hints.ForZones {
			c.Hints.Zones = append(c.Hints.Zones, intern(z.Name))
		}
		for _, n := range ep.Hints.ForNodes {
			c.Hints.Nodes = append(c.Hints.Nodes, intern(n.Name))
		}
	}
	if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
		c.TargetPod = ep.TargetRef.Name
	}
}

// FromV1Namespace reduces a v1.Namespace.
func FromV1Namespace(n *v1.Namespace) (*cluster.Namespace, error) {
	return &cluster.Namespace{Name: n.Name, Labels: n.Labels}, nil
}

// FromV1Pod reduces a v1.Pod.
func FromV1Pod(p *v1.Pod) (*cluster.Pod, error) {
	out := &cluster.Pod{
		Namespace: defaultNamespace(p.Namespace),
		Name:      p.Name,
		Hostname:  p.Spec.Hostname,
		Subdomain: p.Spec.Subdomain,
		NodeName:  intern(p.Spec.NodeName),
		Labels:    p.Labels,

		HostNetwork: p.Spec.HostNetwork,
		Ports:       namedPorts(p.Spec.Containers),
	}
	var ips []string
	for _, ip := range p.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	if len(ips) == 0 && p.Status.PodIP != "" {
		ips = []string{p.Status.PodIP}
	}
	var err error
	if out.IPs, err = parseAddrs("status.podIPs", ips); err != nil {
		return nil, fmt.Errorf("pod %s: %w", out.Key(), err)
	}
	return out, nil
}

// namedPorts are the containers' ports that NetworkPolicy can name.
func namedPorts(cs []v1.Container) []cluster.NamedPort {
	var out []cluster.NamedPort
	for _, c := range cs {
		for _, p := range c.Ports {
			if p.Name == "" || p.ContainerPort < 1 || p.ContainerPort > 65535 {
				continue
			}
			out = append(out, cluster.NamedPort{Name: p.Name, Protocol: protocol(p.Protocol), Port: uint16(p.ContainerPort)})
		}
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
