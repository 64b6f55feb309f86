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
	var out svcRecords
	svcName := joinWire(wireName(svc.Name+"."+svc.Namespace+".svc"), zone)
	if svc.Type == cluster.ServiceTypeExternalName {
		target := strings.TrimSuffix(svc.ExternalName, ".")
		if _, err := netip.ParseAddr(target); err == nil || target == "" {
			return out // an address is not a CNAME target; the name does not exist
		}
		out.base = packNode(rrset{}, rrset{}, rrset{}, rrset{}, target+".")
		out.names = append(out.names, namedNode{string(svcName), out.base})
		return out
	}

	// Ready endpoint addresses, each with the ports of its slice.
	type epAddr struct {
		addr  netip.Addr
		host  []byte // wire name <host>.<svc>.<ns>.svc.<zone>
		ports []cluster.EndpointPort
	}
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
	entriesOf := func(e epAddr, match func(cluster.EndpointPort) bool) []srvEntry {
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

	// Endpoint names exist for every Service with endpoints, headless or not.
	byHost := map[string][]srvEntry{}
	var hostOrder []string
	for _, e := range eas {
		k := string(e.host)
		if _, ok := byHost[k]; !ok {
			hostOrder = append(hostOrder, k)
		}
		byHost[k] = append(byHost[k], entriesOf(e, nil)...)
		out.ptrs = append(out.ptrs, ptrRecord{addr: e.addr, owner: ptrOwner{target: e.host}})
	}
	for _, h := range hostOrder {
		out.names = append(out.names, namedNode{h, entryNode(byHost[h], ttl)})
	}

	if svc.Headless {
		var all []srvEntry
		for _, e := range eas {
			all = append(all, entriesOf(e, nil)...)
		}
		if len(all) == 0 {
			return out // no ready endpoints: NXDOMAIN, as CoreDNS
		}
		out.base = entryNode(all, ttl)
		out.names = append(out.names, namedNode{string(svcName), out.base})
		// _port._proto names, one per named port of any slice.
		seen := map[string]bool{}
		for _, e := range eas {
			for _, p := range e.ports {
				if p.Name == "" {
					continue
				}
				rel := "_" + strings.ToLower(p.Name) + "." + protoLabel(p.Protocol)
				if seen[rel] {
					continue
				}
				seen[rel] = true
				var es []srvEntry
				for _, e2 := range eas {
					es = append(es, entriesOf(e2, func(q cluster.EndpointPort) bool {
						return strings.EqualFold(q.Name, p.Name) && protoLabel(q.Protocol) == protoLabel(p.Protocol)
					})...)
				}
				out.names = append(out.names, namedNode{string(joinWire(wireName(rel), svcName)), shared(out.base, entryNode(es, ttl))})
			}
		}
		return out
	}

	// ClusterIP (also NodePort and LoadBalancer): the virtual IPs. A Service
	// without ports has no name, as in CoreDNS.
	if len(svc.Ports) == 0 || len(svc.ClusterIPs) == 0 {
		return out
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
		rel := "_" + strings.ToLower(p.Name) + "." + protoLabel(p.Protocol)
		es := entries(func(q cluster.ServicePort) bool {
			return strings.EqualFold(q.Name, p.Name) && protoLabel(q.Protocol) == protoLabel(p.Protocol)
		})
		out.names = append(out.names, namedNode{string(joinWire(wireName(rel), svcName)), shared(out.base, entryNode(es, ttl))})
	}
	for _, ip := range svc.ClusterIPs {
		out.ptrs = append(out.ptrs, ptrRecord{addr: ip.Unmap(), owner: ptrOwner{clusterIP: true, target: svcName}})
	}
	return out
}
