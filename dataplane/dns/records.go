package dns

import (
	"net/netip"
	"strings"

	"github.com/podnet/podnet/dataplane/cluster"
)

// The names and reverse records one Service owns, by kind of Service.

type namedNode struct {
	name string
	node *node
}

type ptrRecord struct {
	addr  netip.Addr
	owner ptrOwner
}

type svcRecords struct {
	base  *node // the Service's own name, nil when it has no records
	names []namedNode
	ptrs  []ptrRecord
}

// srvEntry is one (address, port) pair behind a name. Port -1 stands for an
// EndpointSlice without ports: it counts for SRV weights but gives no SRV.
type srvEntry struct {
	addr   netip.Addr
	port   int32
	target []byte
}

// endpointHostname is the label an endpoint address is known by: its
// hostname, else its address with dots or colons turned into dashes.
func endpointHostname(hostname string, a netip.Addr) string {
	if hostname != "" {
		return strings.ToLower(hostname)
	}
	s := a.String()
	if a.Is4() {
		return strings.ReplaceAll(s, ".", "-")
	}
	s = strings.ReplaceAll(s, ":", "-")
	if strings.HasSuffix(s, "-") {
		s += "0"
	}
	return s
}

func protoLabel(p cluster.Protocol) string {
	if p == "" {
		p = cluster.TCP
	}
	return "_" + strings.ToLower(string(p))
}

// serviceRecords computes every name one Service owns. It is pure: the same
// Service, slices and pod hostnames give the same records.
func serviceRecords(svc *cluster.Service, eps []*cluster.EndpointSlice, podHost func(ns, pod, svc string) string, zone []byte, ttl uint32) svcRecords {
	svcName := joinWire(wireName(svc.Name+"."+svc.Namespace+".svc"), zone)
	if svc.Type == cluster.ServiceTypeExternalName {
		return externalNameRecords(svc, svcName)
	}
	eas := readyAddrs(svc, eps, podHost, svcName)
	// Endpoint names exist for every Service with endpoints, headless or not.
	out := endpointRecords(eas, ttl)
	if svc.Headless {
		headlessRecords(&out, eas, svcName, ttl)
	} else {
		clusterIPRecords(&out, svc, svcName, ttl)
	}
	return out
}

// externalNameRecords is the CNAME of an ExternalName Service.
func externalNameRecords(svc *cluster.Service, svcName []byte) svcRecords {
	var out svcRecords
	target := strings.TrimSuffix(svc.ExternalName, ".")
	if _, err := netip.ParseAddr(target); err == nil || target == "" {
		return out // an address is not a CNAME target; the name does not exist
	}
	out.base = packNode(rrset{}, rrset{}, rrset{}, rrset{}, target+".")
	out.names = append(out.names, namedNode{string(svcName), out.base})
	return out
}

// epAddr is one ready endpoint address, with the ports of its slice.
type epAddr struct {
	addr  netip.Addr
	host  []byte // wire name <host>.<svc>.<ns>.svc.<zone>
	ports []cluster.EndpointPort
}

// entries are the address's SRV entries for the ports match accepts (all
// when nil). A slice without ports gives one entry without a port, counted
// only when every port is asked for.
func (e epAddr) entries(match func(cluster.EndpointPort) bool) []srvEntry {
	if len(e.ports) == 0 {
		if match == nil {
			return []srvEntry{{addr: e.addr, port: -1, target: e.host}}
		}
		return nil
	}
	var es []srvEntry
	for _, p := range e.ports {
		if match == nil || match(p) {
			es = append(es, srvEntry{addr: e.addr, port: int32(p.Port), target: e.host})
		}
	}
	return es
}

// readyAddrs lists the addresses of the Service's endpoints that DNS
// publishes: ready ones (all with publishNotReadyAddresses), of IP slices.
func readyAddrs(svc *cluster.Service, eps []*cluster.EndpointSlice, podHost func(ns, pod, svc string) string, svcName []byte) []epAddr {
	var eas []epAddr
	for _, sl := range eps {
		if sl.AddressType != "IPv4" && sl.AddressType != "IPv6" && sl.AddressType != "" {
			continue
		}
		for _, ep := range sl.Endpoints {
			if !ep.Ready && !svc.PublishNotReadyAddresses {
				continue
			}
			hostname := ep.Hostname
			if hostname == "" && ep.TargetPod != "" && svc.Headless {
				hostname = podHost(svc.Namespace, ep.TargetPod, svc.Name)
			}
			for _, a := range ep.Addresses {
				a = a.Unmap()
				h := endpointHostname(hostname, a)
				eas = append(eas, epAddr{addr: a, host: joinWire(wireName(h), svcName), ports: sl.Ports})
			}
		}
	}
	return eas
}

// endpointRecords are the per-endpoint names (<host>.<svc>...) and their
// reverse records.
func endpointRecords(eas []epAddr, ttl uint32) svcRecords {
	var out svcRecords
	byHost := map[string][]srvEntry{}
	var hostOrder []string
	for _, e := range eas {
		k := string(e.host)
		if _, ok := byHost[k]; !ok {
			hostOrder = append(hostOrder, k)
		}
		byHost[k] = append(byHost[k], e.entries(nil)...)
		out.ptrs = append(out.ptrs, ptrRecord{addr: e.addr, owner: ptrOwner{target: e.host}})
	}
	for _, h := range hostOrder {
		out.names = append(out.names, namedNode{h, entryNode(byHost[h], ttl)})
	}
	return out
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
func headlessRecords(out *svcRecords, eas []epAddr, svcName []byte, ttl uint32) {
	var all []srvEntry
	for _, e := range eas {
		all = append(all, e.entries(nil)...)
	}
	if len(all) == 0 {
		return
	}
	out.base = entryNode(all, ttl)
	out.names = append(out.names, namedNode{string(svcName), out.base})
	seen := map[string]bool{}
	for _, e := range eas {
		for _, p := range e.ports {
			rel := portName(p.Name, p.Protocol)
			if p.Name == "" || seen[rel] {
				continue
			}
			seen[rel] = true
			var es []srvEntry
			for _, e2 := range eas {
				es = append(es, e2.entries(func(q cluster.EndpointPort) bool { return samePort(q.Name, q.Protocol, p.Name, p.Protocol) })...)
			}
			out.names = append(out.names, namedNode{string(joinWire(wireName(rel), svcName)), shared(out.base, entryNode(es, ttl))})
		}
	}
}

// clusterIPRecords adds the names of a Service with virtual IPs (ClusterIP,
// NodePort, LoadBalancer): its own, one per named port, and the reverse
// records of its cluster IPs. A Service without ports has no name, as in
// CoreDNS.
func clusterIPRecords(out *svcRecords, svc *cluster.Service, svcName []byte, ttl uint32) {
	if len(svc.Ports) == 0 || len(svc.ClusterIPs) == 0 {
		return
	}
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
	out.names = append(out.names, namedNode{string(svcName), out.base})
	for _, p := range svc.Ports {
		if p.Name == "" {
			continue
		}
		rel := portName(p.Name, p.Protocol)
		es := entries(func(q cluster.ServicePort) bool { return samePort(q.Name, q.Protocol, p.Name, p.Protocol) })
		out.names = append(out.names, namedNode{string(joinWire(wireName(rel), svcName)), shared(out.base, entryNode(es, ttl))})
	}
	for _, ip := range svc.ClusterIPs {
		out.ptrs = append(out.ptrs, ptrRecord{addr: ip.Unmap(), owner: ptrOwner{clusterIP: true, target: svcName}})
	}
}
