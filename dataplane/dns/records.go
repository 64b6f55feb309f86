package dns

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/podnet/podnet/dataplane/cluster"
)

// The names and reverse records one Service owns, by kind of Service.

type namedNode struct {
	name string
	node *node
}

type svcRecords struct {
	base  *node // the Service's own name, nil when it has no records
	names []namedNode
	// entry holds its endpoint names and is the owner of its reverse
	// records.
	entry *svcEntry
}

// srvEntry is one (address, port) pair behind a name. Port -1 stands for an
// EndpointSlice without ports: it counts for SRV weights but gives no SRV.
type srvEntry struct {
	addr   netip.Addr
	port   int32
	target []byte
}

// appendHost appends the host part of an endpoint's name, its labels in
// wire format without the root: its hostname, else its address with dots or
// colons turned into dashes.
func appendHost(b []byte, hostname string, a netip.Addr) []byte {
	if hostname != "" {
		b = appendWireName(b, hostname)
		return b[:len(b)-1]
	}
	at := len(b)
	b = a.AppendTo(append(b, 0))
	sep := byte('.')
	if !a.Is4() {
		sep = ':'
	}
	for i := at + 1; i < len(b); i++ {
		if b[i] == sep {
			b[i] = '-'
		}
	}
	if b[len(b)-1] == '-' {
		b = append(b, '0')
	}
	b[at] = byte(len(b) - at - 1)
	return b
}

func protoLabel(p cluster.Protocol) string {
	if p == "" {
		p = cluster.TCP
	}
	return "_" + strings.ToLower(string(p))
}

// recScratch is reused from one Service's records to the next, so that
// building them leaves only what the index keeps.
type recScratch struct {
	hosts []byte
	eps   []epEntry
}

// serviceRecords computes every name one Service owns. It is pure: the same
// Service, slices and pod hostnames give the same records.
func serviceRecords(svc *cluster.Service, eps []*cluster.EndpointSlice, podHost func(ns, pod, svc string) string, zone []byte, ttl uint32, sc *recScratch) svcRecords {
	svcName := joinWire(wireName(svc.Name+"."+svc.Namespace+".svc"), zone)
	out := svcRecords{entry: &svcEntry{key: svc.Key(), name: string(svcName)}}
	if svc.Type == cluster.ServiceTypeExternalName {
		externalNameRecords(&out, svc)
		return out
	}
	// Endpoint names exist for every Service with endpoints, headless or not.
	out.entry.setEndpoints(svc, eps, podHost, sc)
	if svc.Headless {
		headlessRecords(&out, ttl)
	} else {
		clusterIPRecords(&out, svc, ttl)
	}
	out.entry.index(ttl)
	return out
}

// externalNameRecords is the CNAME of an ExternalName Service.
func externalNameRecords(out *svcRecords, svc *cluster.Service) {
	target := strings.TrimSuffix(svc.ExternalName, ".")
	if _, err := netip.ParseAddr(target); err == nil || target == "" {
		return // an address is not a CNAME target; the name does not exist
	}
	out.base = packNode(rrset{}, rrset{}, rrset{}, rrset{}, target+".")
	out.names = append(out.names, namedNode{out.entry.name, out.base})
}

// setEndpoints records the addresses of the Service's endpoints that DNS
// publishes: ready ones (all with publishNotReadyAddresses), of IP slices,
// in slice order.
func (e *svcEntry) setEndpoints(svc *cluster.Service, eps []*cluster.EndpointSlice, podHost func(ns, pod, svc string) string, sc *recScratch) {
	sc.hosts, sc.eps = sc.hosts[:0], sc.eps[:0]
	for _, sl := range eps {
		if sl.AddressType != "IPv4" && sl.AddressType != "IPv6" && sl.AddressType != "" {
			continue
		}
		ports := -1
		for _, ep := range sl.Endpoints {
			if !ep.Ready && !svc.PublishNotReadyAddresses {
				continue
			}
			hostname := ep.Hostname
			if hostname == "" && ep.TargetPod != "" && svc.Headless {
				hostname = podHost(svc.Namespace, ep.TargetPod, svc.Name)
			}
			for _, a := range ep.Addresses {
				if ports < 0 {
					e.ports = append(e.ports, sl.Ports)
					ports = len(e.ports) - 1
				}
				a = a.Unmap()
				sc.eps = append(sc.eps, epEntry{addr: a, host: uint32(len(sc.hosts)), ports: uint32(ports)})
				sc.hosts = appendHost(sc.hosts, hostname, a)
			}
		}
	}
	if len(sc.eps) > 0 {
		e.eps = slices.Clone(sc.eps)
		e.hosts = string(sc.hosts)
	}
}

// portName is the relative name _<port>._<proto> of a named port.
func portName(name string, proto cluster.Protocol) string {
	return "_" + strings.ToLower(name) + "." + protoLabel(proto)
}

// samePort reports whether two ports have the same _port._proto name.
func samePort(aName string, aProto cluster.Protocol, bName string, bProto cluster.Protocol) bool {
	return strings.EqualFold(aName, bName) && protoLabel(aProto) == protoLabel(bProto)
}

// headlessRecords adds a headless Service's own name (its endpoints'
// addresses) and one _port._proto name per named port of any slice. A
// headless Service without ready endpoints has no name (NXDOMAIN, as
// CoreDNS).
func headlessRecords(out *svcRecords, ttl uint32) {
	e := out.entry
	targets := make([][]byte, len(e.eps))
	var all []srvEntry
	for i := range e.eps {
		targets[i] = e.appendTarget(nil, i)
		all = append(all, e.entries(i, targets[i], nil)...)
	}
	if len(all) == 0 {
		return
	}
	out.base = entryNode(all, ttl)
	out.names = append(out.names, namedNode{e.name, out.base})
	seen := map[string]bool{}
	for _, ep := range e.eps {
		for _, p := range e.ports[ep.ports] {
			rel := portName(p.Name, p.Protocol)
			if p.Name == "" || seen[rel] {
				continue
			}
			seen[rel] = true
			var es []srvEntry
			for j := range e.eps {
				es = append(es, e.entries(j, targets[j], func(q cluster.EndpointPort) bool { return samePort(q.Name, q.Protocol, p.Name, p.Protocol) })...)
			}
			out.names = append(out.names, namedNode{string(joinWire(wireName(rel), []byte(e.name))), shared(out.base, entryNode(es, ttl))})
		}
	}
}

// clusterIPRecords adds the names of a Service with virtual IPs (ClusterIP,
// NodePort, LoadBalancer): its own, one per named port, and the reverse
// records of its cluster IPs. A Service without ports has no name, as in
// CoreDNS.
func clusterIPRecords(out *svcRecords, svc *cluster.Service, ttl uint32) {
	if len(svc.Ports) == 0 || len(svc.ClusterIPs) == 0 {
		return
	}
	e := out.entry
	svcName := []byte(e.name)
	entries := func(match func(cluster.ServicePort) bool) []srvEntry {
		var es []srvEntry
		for _, p := range svc.Ports {
			if match != nil && !match(p) {
				continue
			}
			for _, ip := range svc.ClusterIPs {
				es = append(es, srvEntry{addr: ip.Unmap(), port: int32(p.Port), target: svcName})
			}
		}
		return es
	}
	out.base = entryNode(entries(nil), ttl)
	out.names = append(out.names, namedNode{e.name, out.base})
	for _, p := range svc.Ports {
		if p.Name == "" {
			continue
		}
		rel := portName(p.Name, p.Protocol)
		es := entries(func(q cluster.ServicePort) bool { return samePort(q.Name, q.Protocol, p.Name, p.Protocol) })
		out.names = append(out.names, namedNode{string(joinWire(wireName(rel), svcName)), shared(out.base, entryNode(es, ttl))})
	}
	e.clusterIPs = make([]netip.Addr, 0, len(svc.ClusterIPs))
	for _, ip := range svc.ClusterIPs {
		e.clusterIPs = append(e.clusterIPs, ip.Unmap())
	}
}
