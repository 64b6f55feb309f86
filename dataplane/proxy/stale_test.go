package proxy

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
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
	got := StaleConntrack(nil, map[cluster.Key][]*ServicePort{key: {mk(cluster.TCP, 30080, "10.244.1.2"), mk(cluster.UDP, 0, "10.244.1.2")}}, changed)
	want := []ConntrackFilter{unnated(cluster.UDP, "10.96.0.20"), unnated(cluster.UDP, "192.0.2.50"), unnated(cluster.TCP, "10.96.0.20"), unnated(cluster.TCP, "192.0.2.50")}
	if !slices.Equal(got, want) {
		t.Errorf("new Service:\n got %v\nwant %v", got, want)
	}
	// A TCP port that had no endpoints (its rules rejected) and now has.
	got = StaleConntrack(map[cluster.Key][]*ServicePort{key: {mk(cluster.TCP, 0)}}, map[cluster.Key][]*ServicePort{key: {mk(cluster.TCP, 0, "10.244.1.2")}}, changed)
	if want := want[2:]; !slices.Equal(got, want) {
		t.Errorf("0→N endpoints:\n got %v\nwant %v", got, want)
	}
	// A TCP endpoint change, a new Service without endpoints, an unchanged
	// Service: nothing (established TCP flows are left to finish).
	for name, c := range map[string][3]map[cluster.Key][]*ServicePort{
		"endpoint replaced": {{key: {mk(cluster.TCP, 0, "10.244.1.2")}}, {key: {mk(cluster.TCP, 0, "10.244.1.3")}}},
		"no endpoints":      {nil, {key: {mk(cluster.TCP, 0)}}},
	} {
		if got := StaleConntrack(c[0], c[1], changed); len(got) != 0 {
			t.Errorf("%s: %v, want nothing", name, got)
		}
	}
	if got := StaleConntrack(nil, map[cluster.Key][]*ServicePort{key: {mk(cluster.TCP, 0, "10.244.1.2")}}, nil); len(got) != 0 {
		t.Errorf("unchanged: %v", got)
	}
}
