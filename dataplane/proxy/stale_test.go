package proxy

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

func TestStaleConntrackForNewServices(t *testing.T) {
	key := cluster.Key{Namespace: "ns", Name: "web"}
	mk := func(proto cluster.Protocol, nodePort uint16, eps ...string) *ServicePort {
		sp := &ServicePort{Name: PortName{Service: key, Port: string(proto), Protocol: proto}, Protocol: proto,
			ClusterIP: addr("10.96.0.20"), Port: 80, NodePort: nodePort, ExternalIPs: []netip.Addr{addr("192.0.2.50")}}
		for _, e := range eps {
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, NewEndpoint(addr(e), 8080))
		}
		return sp
	}
	changed := map[cluster.Key]bool{key: true}
	unnated := func(proto cluster.Protocol, ip string) ConntrackFilter {
		return ConntrackFilter{Protocol: proto, OrigDst: addr(ip), OrigDstPort: 80, ReplySrc: addr(ip)}
	}
	// A new Service with endpoints, TCP and UDP: the entries towards its
	// IPs that were never DNATed go (UDP also by NodePort, as before).
	got, _ := StaleConntrack(nil, map[cluster.Key][]*ServicePort{key: {mk(cluster.TCP, 30080, "10.244.1.2"), mk(cluster.UDP, 0, "10.244.1.2")}}, changed)
	want := []ConntrackFilter{unnated(cluster.UDP, "10.96.0.20"), unnated(cluster.UDP, "192.0.2.50"), unnated(cluster.TCP, "10.96.0.20"), unnated(cluster.TCP, "192.0.2.50")}
	if !slices.Equal(got, want) {
		t.Errorf("new Service:\n got %v\nwant %v", got, want)
	}
	// A TCP port that had no endpoints (its rules rejected) and now has.
	got, _ = StaleConntrack(map[cluster.Key][]*ServicePort{key: {mk(cluster.TCP, 0)}}, map[cluster.Key][]*ServicePort{key: {mk(cluster.TCP, 0, "10.244.1.2")}}, changed)
	if want := want[2:]; !slices.Equal(got, want) {
		t.Errorf("0→N endpoints:\n got %v\nwant %v", got, want)
	}
	// A TCP endpoint change, a new Service without endpoints, an unchanged
	// Service: nothing (established TCP flows are left to finish).
	for name, c := range map[string][3]map[cluster.Key][]*ServicePort{
		"endpoint replaced": {{key: {mk(cluster.TCP, 0, "10.244.1.2")}}, {key: {mk(cluster.TCP, 0, "10.244.1.3")}}},
		"no endpoints":      {nil, {key: {mk(cluster.TCP, 0)}}},
	} {
		if got, _ := StaleConntrack(c[0], c[1], changed); len(got) != 0 {
			t.Errorf("%s: %v, want nothing", name, got)
		}
	}
	if got, _ := StaleConntrack(nil, map[cluster.Key][]*ServicePort{key: {mk(cluster.TCP, 0, "10.244.1.2")}}, nil); len(got) != 0 {
		t.Errorf("unchanged: %v", got)
	}
}

// TestStaleUDPDestinations: every change that moves a UDP flow's destination
// deletes exactly the entries DNATed to the destination that is gone, on
// every frontend (cluster IP, NodePort, externalIP, load-balancer IP).
func TestStaleUDPDestinations(t *testing.T) {
	key := cluster.Key{Namespace: "ns", Name: "udp"}
	vip, ext, lb := addr("10.96.0.30"), addr("192.0.2.60"), addr("198.51.100.7")
	type ep struct {
		ip   string
		port uint16
	}
	mk := func(proto cluster.Protocol, mod func(*ServicePort), eps ...ep) *ServicePort {
		sp := &ServicePort{Name: PortName{Service: key, Port: "p", Protocol: proto}, Protocol: proto,
			ClusterIP: vip, Port: 80, NodePort: 30090, ExternalIPs: []netip.Addr{ext}, LoadBalancerIPs: []netip.Addr{lb}}
		for _, e := range eps {
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, NewEndpoint(addr(e.ip), e.port))
		}
		if mod != nil {
			mod(sp)
		}
		return sp
	}
	// gone lists the filters for one destination on every frontend.
	gone := func(e ep) []ConntrackFilter {
		var out []ConntrackFilter
		for _, ip := range []netip.Addr{vip, ext, lb} {
			out = append(out, ConntrackFilter{Protocol: cluster.UDP, OrigDst: ip, OrigDstPort: 80, ReplySrc: addr(e.ip), ReplySrcPort: e.port})
		}
		return append(out, ConntrackFilter{Protocol: cluster.UDP, Family: ipfamily.IPv4, OrigDstPort: 30090, ReplySrc: addr(e.ip), ReplySrcPort: e.port})
	}
	a, b := ep{"10.244.1.2", 8080}, ep{"10.244.2.3", 8080}
	noExternal := func(sp *ServicePort) { sp.NodePort, sp.ExternalIPs, sp.LoadBalancerIPs = 0, nil, nil }
	tests := []struct {
		name     string
		old, new *ServicePort
		want     []ConntrackFilter
	}{
		{"targetPort changed", mk(cluster.UDP, nil, a, b), mk(cluster.UDP, nil, ep{a.ip, 8081}, ep{b.ip, 8081}), append(gone(a), gone(b)...)},
		{"one endpoint's port moved (a named port)", mk(cluster.UDP, nil, a, b), mk(cluster.UDP, nil, a, ep{b.ip, 9090}), gone(b)},
		{"an endpoint left", mk(cluster.UDP, nil, a, b), mk(cluster.UDP, nil, b), gone(a)},
		{"protocol changed to TCP", mk(cluster.UDP, nil, a), mk(cluster.TCP, nil, a), gone(a)},
		{"an endpoint moved from the cluster to the local list", mk(cluster.UDP, nil, a),
			mk(cluster.UDP, func(sp *ServicePort) { sp.LocalEndpoints, sp.ClusterEndpoints = sp.ClusterEndpoints, nil }, a), nil},
		{"nothing moved", mk(cluster.UDP, nil, a, b), mk(cluster.UDP, nil, b, a), nil},
		{"the external frontends went away", mk(cluster.UDP, nil, a), mk(cluster.UDP, noExternal, a), gone(a)[1:]},
		{"a TCP endpoint left (left to finish)", mk(cluster.TCP, nil, a, b), mk(cluster.TCP, nil, b), nil},
	}
	for _, tt := range tests {
		old := map[cluster.Key][]*ServicePort{key: {tt.old}}
		new := map[cluster.Key][]*ServicePort{key: {tt.new}}
		got, _ := StaleUDP(old, new, map[cluster.Key]bool{key: true})
		if tt.name == "protocol changed to TCP" {
			// The TCP port, new with endpoints, also drops entries towards
			// it that were never DNATed (StaleConntrack); not StaleUDP's.
			got = slices.DeleteFunc(got, func(f ConntrackFilter) bool { return f.Protocol != cluster.UDP })
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s:\n got %v\nwant %v", tt.name, got, tt.want)
		}
	}
}

// TestStaleUDPNamedPort builds the ports from a Service whose targetPort is
// a name: the EndpointSlice resolving it to another port moves the flows.
func TestStaleUDPNamedPort(t *testing.T) {
	svc := &cluster.Service{Namespace: "ns", Name: "s", Type: cluster.ServiceTypeNodePort, ClusterIPs: []netip.Addr{addr("10.96.0.5")},
		Ports: []cluster.ServicePort{{Name: "dns", Protocol: cluster.UDP, Port: 53, NodePort: 30053}}}
	slice := func(port uint16) *cluster.EndpointSlice {
		return &cluster.EndpointSlice{Namespace: "ns", Name: "s-1", ServiceName: "s", AddressType: "IPv4",
			Ports:     []cluster.EndpointPort{{Name: "dns", Protocol: cluster.UDP, Port: port}},
			Endpoints: []cluster.Endpoint{{Addresses: []netip.Addr{addr("10.244.1.5")}, Ready: true, Serving: true}}}
	}
	key := svc.Key()
	old := map[cluster.Key][]*ServicePort{key: BuildServicePorts(svc, []*cluster.EndpointSlice{slice(5353)}, NodeInfo{}, ipfamily.IPv4)}
	new := map[cluster.Key][]*ServicePort{key: BuildServicePorts(svc, []*cluster.EndpointSlice{slice(5354)}, NodeInfo{}, ipfamily.IPv4)}
	got, _ := StaleUDP(old, new, map[cluster.Key]bool{key: true})
	want := []ConntrackFilter{
		{Protocol: cluster.UDP, OrigDst: addr("10.96.0.5"), OrigDstPort: 53, ReplySrc: addr("10.244.1.5"), ReplySrcPort: 5353},
		{Protocol: cluster.UDP, Family: ipfamily.IPv4, OrigDstPort: 30053, ReplySrc: addr("10.244.1.5"), ReplySrcPort: 5353},
	}
	if !slices.Equal(got, want) {
		t.Errorf("named port moved:\n got %v\nwant %v", got, want)
	}
}

// TestStaleUDPDrainingEndpoint: the entries of an endpoint that still
// serves while it terminates (a draining dnsd, answering) stay, those of
// one that stopped serving go, and one the rules sent to until it stopped
// serving within one sync goes later (its answers in flight come back
// first). Deleting the entries of a serving endpoint lost two lookups in
// the dns-lab's rolling update (08:08:21.083 and .098, node1): the answer
// of a query in flight, no longer un-NATed, was dropped by the client's
// socket.
func TestStaleUDPDrainingEndpoint(t *testing.T) {
	key := cluster.Key{Namespace: "kube-system", Name: "kube-dns"}
	type st struct{ ready, serving, terminating bool }
	readyEP, draining, gone := st{true, true, false}, st{false, true, true}, st{false, false, true}
	notReady := st{false, false, false}
	// mk builds the port from 10.244.0.2 (in state a, when given) and
	// 10.244.1.5 (ready), categorized as a sync would.
	mk := func(a *st) map[cluster.Key][]*ServicePort {
		sp := &ServicePort{Name: PortName{Service: key, Port: "dns", Protocol: cluster.UDP}, Protocol: cluster.UDP, ClusterIP: addr("10.96.0.10"), Port: 53}
		if a != nil {
			e := NewEndpoint(addr("10.244.0.2"), 53)
			e.Ready, e.Serving, e.Terminating = a.ready, a.serving, a.terminating
			sp.Endpoints = append(sp.Endpoints, e)
		}
		b := NewEndpoint(addr("10.244.1.5"), 53)
		b.Ready, b.Serving = true, true
		sp.Endpoints = append(sp.Endpoints, b)
		categorize(sp, "", NodeInfo{Name: "node1"})
		return map[cluster.Key][]*ServicePort{key: {sp}}
	}
	toA := []ConntrackFilter{{Protocol: cluster.UDP, OrigDst: addr("10.96.0.10"), OrigDstPort: 53, ReplySrc: addr("10.244.0.2"), ReplySrcPort: 53}}
	tests := []struct {
		name       string
		old, new   *st
		now, later []ConntrackFilter
	}{
		{"ready → terminating and serving (draining): kept", &readyEP, &draining, nil, nil},
		{"serving → not serving while terminating: now", &draining, &gone, toA, nil},
		{"ready → not serving, terminating, in one sync: later", &readyEP, &gone, nil, toA},
		{"ready → not ready (not terminating): now", &readyEP, &notReady, toA, nil},
		{"ready → gone from the slice: now", &readyEP, nil, toA, nil},
		{"terminating and serving → gone: now", &draining, nil, toA, nil},
	}
	for _, tt := range tests {
		now, later := StaleUDP(mk(tt.old), mk(tt.new), map[cluster.Key]bool{key: true})
		if !slices.Equal(now, tt.now) || !slices.Equal(later, tt.later) {
			t.Errorf("%s: now %v later %v, want now %v later %v", tt.name, now, later, tt.now, tt.later)
		}
	}
}
