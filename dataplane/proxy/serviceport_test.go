package proxy

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

type tep struct {
	ip                          string
	node, zone                  string
	ready, serving, terminating bool
	hintZones, hintNodes        []string
}

func build(t *testing.T, svc *cluster.Service, node NodeInfo, eps ...tep) *ServicePort {
	t.Helper()
	es := &cluster.EndpointSlice{Namespace: "ns", Name: "s-1", ServiceName: svc.Name, AddressType: "IPv4",
		Ports: []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}}}
	for _, e := range eps {
		ce := cluster.Endpoint{Addresses: []netip.Addr{addr(e.ip)}, NodeName: e.node, Zone: e.zone,
			Ready: e.ready, Serving: e.serving, Terminating: e.terminating}
		if e.hintZones != nil || e.hintNodes != nil {
			ce.Hints = &cluster.Hints{Zones: e.hintZones, Nodes: e.hintNodes}
		}
		es.Endpoints = append(es.Endpoints, ce)
	}
	sps := BuildServicePorts(svc, []*cluster.EndpointSlice{es}, node, ipfamily.IPv4)
	if len(sps) != 1 {
		t.Fatalf("got %d service ports", len(sps))
	}
	return sps[0]
}

func service(mod func(*cluster.Service)) *cluster.Service {
	s := &cluster.Service{Namespace: "ns", Name: "s", Type: cluster.ServiceTypeClusterIP, ClusterIPs: []netip.Addr{addr("10.96.0.5")},
		Ports: []cluster.ServicePort{{Name: "http", Protocol: cluster.TCP, Port: 80, NodePort: 30080}}}
	if mod != nil {
		mod(s)
	}
	return s
}

func ips(eps []Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.Addr().String())
	}
	return out
}

func TestEndpointSelection(t *testing.T) {
	me := NodeInfo{Name: "n1", Zone: "z1"}
	ready := func(ip, node, zone string) tep {
		return tep{ip: ip, node: node, zone: zone, ready: true, serving: true}
	}
	term := func(ip, node string) tep { return tep{ip: ip, node: node, serving: true, terminating: true} }
	tests := []struct {
		name         string
		mod          func(*cluster.Service)
		eps          []tep
		cluster, loc []string
		hasEndpoints bool
	}{
		{"only ready endpoints", nil,
			[]tep{ready("10.0.0.1", "n1", "z1"), {ip: "10.0.0.2", node: "n2"}, term("10.0.0.3", "n2")},
			[]string{"10.0.0.1"}, nil, true},
		{"no ready: serving and terminating ones", nil,
			[]tep{{ip: "10.0.0.2", node: "n2"}, term("10.0.0.3", "n2"), {ip: "10.0.0.4", terminating: true}},
			[]string{"10.0.0.3"}, nil, true},
		{"nothing usable", nil, []tep{{ip: "10.0.0.2"}}, nil, nil, false},
		{"internalTrafficPolicy Local", func(s *cluster.Service) { s.InternalTrafficPolicyLocal = true },
			[]tep{ready("10.0.0.1", "n1", ""), ready("10.0.0.2", "n2", "")}, nil, []string{"10.0.0.1"}, true},
		{"internalTrafficPolicy Local, none local: has endpoints, none here", func(s *cluster.Service) { s.InternalTrafficPolicyLocal = true },
			[]tep{ready("10.0.0.2", "n2", "")}, nil, nil, true},
		{"externalTrafficPolicy Local: cluster set for pods, local set for outside", func(s *cluster.Service) {
			s.Type = cluster.ServiceTypeNodePort
			s.ExternalTrafficPolicyLocal = true
		}, []tep{ready("10.0.0.1", "n1", ""), ready("10.0.0.2", "n2", "")}, []string{"10.0.0.1", "10.0.0.2"}, []string{"10.0.0.1"}, true},
		{"externalTrafficPolicy Local: local terminating fallback", func(s *cluster.Service) {
			s.Type = cluster.ServiceTypeNodePort
			s.ExternalTrafficPolicyLocal = true
		}, []tep{term("10.0.0.1", "n1"), ready("10.0.0.2", "n2", "")}, []string{"10.0.0.2"}, []string{"10.0.0.1"}, true},
		{"PreferSameNode without hints", func(s *cluster.Service) { s.TrafficDistribution = "PreferSameNode" },
			[]tep{ready("10.0.0.1", "n1", "z1"), ready("10.0.0.2", "n2", "z1")}, []string{"10.0.0.1"}, nil, true},
		{"PreferSameNode falls back to the zone", func(s *cluster.Service) { s.TrafficDistribution = "PreferSameNode" },
			[]tep{ready("10.0.0.2", "n2", "z1"), ready("10.0.0.3", "n3", "z2")}, []string{"10.0.0.2"}, nil, true},
		{"PreferSameZone without hints", func(s *cluster.Service) { s.TrafficDistribution = "PreferSameZone" },
			[]tep{ready("10.0.0.1", "n2", "z1"), ready("10.0.0.2", "n3", "z2")}, []string{"10.0.0.1"}, nil, true},
		{"PreferSameZone with no endpoint in the zone: all", func(s *cluster.Service) { s.TrafficDistribution = "PreferSameZone" },
			[]tep{ready("10.0.0.1", "n2", "z2"), ready("10.0.0.2", "n3", "z3")}, []string{"10.0.0.1", "10.0.0.2"}, nil, true},
		{"zone hints", nil,
			[]tep{{ip: "10.0.0.1", ready: true, serving: true, hintZones: []string{"z2"}}, {ip: "10.0.0.2", ready: true, serving: true, hintZones: []string{"z1"}}},
			[]string{"10.0.0.2"}, nil, true},
		{"node hints", nil,
			[]tep{{ip: "10.0.0.1", ready: true, serving: true, hintNodes: []string{"n1"}, hintZones: []string{"z2"}}, {ip: "10.0.0.2", ready: true, serving: true, hintNodes: []string{"n2"}, hintZones: []string{"z1"}}},
			[]string{"10.0.0.1"}, nil, true},
		{"hints on only some endpoints are ignored", nil,
			[]tep{{ip: "10.0.0.1", ready: true, serving: true, hintZones: []string{"z2"}}, ready("10.0.0.2", "n2", "z1")},
			[]string{"10.0.0.1", "10.0.0.2"}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp := build(t, service(tt.mod), me, tt.eps...)
			if got := ips(sp.ClusterEndpoints); !slices.Equal(got, tt.cluster) {
				t.Errorf("cluster endpoints %v, want %v", got, tt.cluster)
			}
			if got := ips(sp.LocalEndpoints); !slices.Equal(got, tt.loc) {
				t.Errorf("local endpoints %v, want %v", got, tt.loc)
			}
			if sp.HasEndpoints != tt.hasEndpoints {
				t.Errorf("HasEndpoints %v, want %v", sp.HasEndpoints, tt.hasEndpoints)
			}
		})
	}
}

func TestServicesLeftAlone(t *testing.T) {
	for name, mod := range map[string]func(*cluster.Service){
		"headless":      func(s *cluster.Service) { s.Headless, s.ClusterIPs = true, nil },
		"other proxy":   func(s *cluster.Service) { s.ProxyName = "other" },
		"external name": func(s *cluster.Service) { s.Type, s.ClusterIPs = cluster.ServiceTypeExternalName, nil },
	} {
		if sps := BuildServicePorts(service(mod), nil, NodeInfo{}, ipfamily.IPv4); sps != nil {
			t.Errorf("%s: got %d ports, want none", name, len(sps))
		}
	}
	// ClusterIP Services get no NodePort even when one is written.
	if sp := build(t, service(nil), NodeInfo{}); sp.NodePort != 0 {
		t.Errorf("ClusterIP Service has NodePort %d", sp.NodePort)
	}
}

func TestStaleUDP(t *testing.T) {
	key := cluster.Key{Namespace: "ns", Name: "dns"}
	mk := func(eps ...string) *ServicePort {
		sp := &ServicePort{Name: PortName{Service: key, Port: "dns", Protocol: cluster.UDP}, Protocol: cluster.UDP,
			ClusterIP: addr("10.96.0.10"), Port: 53}
		for _, e := range eps {
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, NewEndpoint(addr(e), 53))
		}
		return sp
	}
	changed := map[cluster.Key]bool{key: true}
	// 0 → N: flush the VIP.
	got, _ := StaleUDP(map[cluster.Key][]*ServicePort{key: {mk()}}, map[cluster.Key][]*ServicePort{key: {mk("10.244.1.2")}}, changed)
	if want := []ConntrackFilter{{Protocol: cluster.UDP, OrigDst: addr("10.96.0.10"), OrigDstPort: 53, ReplySrc: addr("10.96.0.10")}}; !slices.Equal(got, want) {
		t.Errorf("0→N: %v, want %v", got, want)
	}
	// An endpoint replaced: delete the entries of the old one only.
	got, _ = StaleUDP(map[cluster.Key][]*ServicePort{key: {mk("10.244.1.2")}}, map[cluster.Key][]*ServicePort{key: {mk("10.244.1.3")}}, changed)
	if want := []ConntrackFilter{{Protocol: cluster.UDP, OrigDst: addr("10.96.0.10"), OrigDstPort: 53, ReplySrc: addr("10.244.1.2"), ReplySrcPort: 53}}; !slices.Equal(got, want) {
		t.Errorf("replaced: %v, want %v", got, want)
	}
	// Unchanged Services are not looked at.
	if got, _ := StaleUDP(map[cluster.Key][]*ServicePort{key: {mk("10.244.1.2")}}, map[cluster.Key][]*ServicePort{key: {mk()}}, nil); len(got) != 0 {
		t.Errorf("unchanged: %v", got)
	}
}

func TestEndpointLocalityFromPodCIDR(t *testing.T) {
	me := NodeInfo{Name: "n1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}
	for _, proto := range []cluster.Protocol{cluster.TCP, cluster.UDP} {
		svc := service(func(s *cluster.Service) { s.Ports[0].Protocol = proto })
		es := &cluster.EndpointSlice{Namespace: "ns", Name: "s-1", ServiceName: "s", AddressType: "IPv4",
			Ports: []cluster.EndpointPort{{Name: "http", Protocol: proto, Port: 8080}}}
		for _, e := range []struct {
			ip, node string
		}{{"10.244.1.5", ""}, {"10.244.1.6", "n2"}, {"10.244.2.7", ""}, {"192.168.10.11", "n1"}} {
			es.Endpoints = append(es.Endpoints, cluster.Endpoint{Addresses: []netip.Addr{addr(e.ip)}, NodeName: e.node, Ready: true, Serving: true})
		}
		sps := BuildServicePorts(svc, []*cluster.EndpointSlice{es}, me, ipfamily.IPv4)
		var local []string
		for _, e := range sps[0].Endpoints {
			if e.Local {
				local = append(local, e.Addr().String())
			}
		}
		// In the podCIDR whatever nodeName says; outside it only by name
		// (a hostNetwork pod has the node's address).
		if want := []string{"10.244.1.5", "10.244.1.6", "192.168.10.11"}; !slices.Equal(local, want) {
			t.Errorf("%s: local endpoints %v, want %v", proto, local, want)
		}
	}
}

// A slice labelled service.kubernetes.io/headless or with a
// service-proxy-name gives the Service no endpoint in either family, while
// the Service's other slices still do (e2e.test's "should implement
// service.kubernetes.io/headless" labels a selectorless Service's only
// slice and expects the Service to stop answering).
func TestSlicesNotProxied(t *testing.T) {
	for _, f := range []ipfamily.Family{ipfamily.IPv4, ipfamily.IPv6} {
		kept, dropped := "10.244.1.5", "10.244.2.5"
		svc := service(nil)
		if f == ipfamily.IPv6 {
			kept, dropped = "fd00:10:244:1::5", "fd00:10:244:2::5"
			svc.ClusterIPs = []netip.Addr{addr("fd00:10:96::10")}
		}
		slice := func(name, ip string, notProxied bool) *cluster.EndpointSlice {
			return &cluster.EndpointSlice{Namespace: "ns", Name: name, ServiceName: svc.Name, AddressType: f.String(), NotProxied: notProxied,
				Ports:     []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}},
				Endpoints: []cluster.Endpoint{{Addresses: []netip.Addr{addr(ip)}, Ready: true, Serving: true}}}
		}
		sps := BuildServicePorts(svc, []*cluster.EndpointSlice{slice("a", kept, false), slice("b", dropped, true)}, NodeInfo{}, f)
		if len(sps) != 1 || len(sps[0].Endpoints) != 1 || sps[0].Endpoints[0].Addr() != addr(kept) {
			t.Fatalf("%v: service ports %+v, want one with the endpoint %s only", f, sps, kept)
		}
		sps = BuildServicePorts(svc, []*cluster.EndpointSlice{slice("b", dropped, true)}, NodeInfo{}, f)
		if len(sps) != 1 || sps[0].HasEndpoints || len(sps[0].Endpoints) != 0 {
			t.Errorf("%v: only a headless-labelled slice: %+v, want no endpoints", f, sps)
		}
	}
}
