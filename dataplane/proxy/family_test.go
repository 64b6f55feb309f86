package proxy

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

// dualStack is a LoadBalancer Service with a cluster IP, an external IP, a
// load-balancer IP and a source range of each family, and one
// EndpointSlice per family.
func dualStack() (*cluster.Service, []*cluster.EndpointSlice) {
	svc := &cluster.Service{Namespace: "ns", Name: "ds", Type: cluster.ServiceTypeLoadBalancer,
		ClusterIPs:               []netip.Addr{addr("10.96.0.5"), addr("fd00:96::5")},
		ExternalIPs:              []netip.Addr{addr("fd00:ee::1"), addr("192.0.2.1")},
		LoadBalancerIPs:          []netip.Addr{addr("192.0.2.9"), addr("2001:db8::9")},
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:1::/48")},
		Ports:                    []cluster.ServicePort{{Name: "http", Protocol: cluster.TCP, Port: 80, NodePort: 30080}}}
	ports := []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}}
	v4 := &cluster.EndpointSlice{Namespace: "ns", Name: "ds-4", ServiceName: "ds", AddressType: "IPv4", Ports: ports,
		Endpoints: []cluster.Endpoint{{Addresses: []netip.Addr{addr("10.244.1.5")}, NodeName: "n1", Ready: true, Serving: true}}}
	v6 := &cluster.EndpointSlice{Namespace: "ns", Name: "ds-6", ServiceName: "ds", AddressType: "IPv6", Ports: ports,
		Endpoints: []cluster.Endpoint{
			{Addresses: []netip.Addr{addr("fd00:244:1::5")}, NodeName: "n1", Ready: true, Serving: true},
			{Addresses: []netip.Addr{addr("fd00:244:2::7")}, NodeName: "n2", Ready: true, Serving: true},
		}}
	return svc, []*cluster.EndpointSlice{v4, v6}
}

// TestIPv6ServicePorts: a dual-stack Service gives one ServicePort per
// family, each holding only its family's addresses and endpoints; a
// single-stack Service gives none in the other family.
func TestIPv6ServicePorts(t *testing.T) {
	svc, eps := dualStack()
	node := NodeInfo{Name: "n1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:244:1::/64")}}
	six := BuildServicePorts(svc, eps, node, ipfamily.IPv6)
	if len(six) != 1 {
		t.Fatalf("IPv6 ports: %d", len(six))
	}
	sp := six[0]
	if sp.ClusterIP != addr("fd00:96::5") || sp.Family() != ipfamily.IPv6 || sp.NodePort != 30080 {
		t.Errorf("IPv6 port: cluster IP %v, family %v, NodePort %d", sp.ClusterIP, sp.Family(), sp.NodePort)
	}
	if !slices.Equal(sp.ExternalIPs, []netip.Addr{addr("fd00:ee::1")}) || !slices.Equal(sp.LoadBalancerIPs, []netip.Addr{addr("2001:db8::9")}) ||
		!slices.Equal(sp.LoadBalancerSourceRanges, []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48")}) {
		t.Errorf("IPv6 port: external %v, LB %v, ranges %v", sp.ExternalIPs, sp.LoadBalancerIPs, sp.LoadBalancerSourceRanges)
	}
	if got := ips(sp.ClusterEndpoints); !slices.Equal(got, []string{"fd00:244:1::5", "fd00:244:2::7"}) {
		t.Errorf("IPv6 endpoints %v", got)
	}
	if !sp.Endpoints[0].Local || sp.Endpoints[1].Local {
		t.Errorf("local: %v %v", sp.Endpoints[0].Local, sp.Endpoints[1].Local)
	}
	four := BuildServicePorts(svc, eps, node, ipfamily.IPv4)
	if len(four) != 1 || four[0].ClusterIP != addr("10.96.0.5") || !slices.Equal(ips(four[0].ClusterEndpoints), []string{"10.244.1.5"}) ||
		!slices.Equal(four[0].ExternalIPs, []netip.Addr{addr("192.0.2.1")}) {
		t.Errorf("IPv4 port: %+v", four)
	}
	svc.ClusterIPs = svc.ClusterIPs[:1]
	if got := BuildServicePorts(svc, eps, node, ipfamily.IPv6); got != nil || Handled(svc, ipfamily.IPv6) || !Handled(svc, ipfamily.IPv4) {
		t.Errorf("IPv4-only Service in IPv6: %v", got)
	}
}

// TestStateBuildsEveryFamily: a State serving both families holds a
// dual-stack Service's ports of both, IPv4 first.
func TestStateBuildsEveryFamily(t *testing.T) {
	svc, eps := dualStack()
	st := cluster.NewStore()
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, []cluster.Object{svc, eps[0], eps[1]})
	state := NewState(ipfamily.IPv4, ipfamily.IPv6)
	state.Update(st, "n1", nil, true)
	got := state.Ports[svc.Key()]
	if len(got) != 2 || got[0].Family() != ipfamily.IPv4 || got[1].Family() != ipfamily.IPv6 {
		t.Fatalf("ports %v", got)
	}
}

type recordingBackend struct {
	got     map[cluster.Key][]*ServicePort
	changed map[cluster.Key]bool
	full    bool
	err     error
}

func (r *recordingBackend) Sync(ports map[cluster.Key][]*ServicePort, changed map[cluster.Key]bool, full bool) (SyncResult, error) {
	r.got, r.changed, r.full = ports, changed, full
	return SyncResult{Rules: map[string]int{"nat": len(ports)}}, r.err
}

// TestPerFamilyHandsEachBackendItsFamily: each family's Backend gets the
// ports of its family only, the same full flag; rule counts add up; a
// failing family is named and does not keep the other from syncing.
func TestPerFamilyHandsEachBackendItsFamily(t *testing.T) {
	svc, eps := dualStack()
	node := NodeInfo{Name: "n1"}
	v4only := &cluster.Service{Namespace: "ns", Name: "v4", ClusterIPs: []netip.Addr{addr("10.96.0.6")},
		Ports: []cluster.ServicePort{{Name: "p", Protocol: cluster.UDP, Port: 53}}}
	ports := map[cluster.Key][]*ServicePort{
		svc.Key():    append(BuildServicePorts(svc, eps, node, ipfamily.IPv4), BuildServicePorts(svc, eps, node, ipfamily.IPv6)...),
		v4only.Key(): BuildServicePorts(v4only, nil, node, ipfamily.IPv4),
	}
	b4, b6 := &recordingBackend{}, &recordingBackend{err: errors.New("ip6tables-restore: boom")}
	res, err := NewPerFamily(map[ipfamily.Family]Backend{ipfamily.IPv4: b4, ipfamily.IPv6: b6}).Sync(ports, nil, true)
	if err == nil || !strings.Contains(err.Error(), "IPv6: ip6tables-restore: boom") {
		t.Errorf("err = %v", err)
	}
	if len(b4.got) != 2 || len(b6.got) != 1 || !b4.full || !b6.full {
		t.Fatalf("IPv4 got %d Services, IPv6 %d", len(b4.got), len(b6.got))
	}
	for _, sps := range b4.got {
		for _, sp := range sps {
			if sp.Family() != ipfamily.IPv4 {
				t.Errorf("IPv4 backend got %v", sp.ClusterIP)
			}
		}
	}
	if sps := b6.got[svc.Key()]; len(sps) != 1 || sps[0].ClusterIP != addr("fd00:96::5") {
		t.Errorf("IPv6 backend got %v", sps)
	}
	if !slices.Equal(b4.got[v4only.Key()], ports[v4only.Key()]) {
		t.Error("a single-family Service's ports are not handed on as they are")
	}
	if res.Rules["nat"] != 3 {
		t.Errorf("rules = %v, want the sum 3", res.Rules)
	}
}

// TestAllFamiliesModeGetsOneBackend: a mode with AllFamilies is built once
// for a dual-stack daemon, told both families, and its Backend is not
// wrapped in PerFamily (it gets every family's ports); a mode without it
// gets one Backend per family.
func TestAllFamiliesModeGetsOneBackend(t *testing.T) {
	both := []ipfamily.Family{ipfamily.IPv4, ipfamily.IPv6}
	for _, all := range []bool{true, false} {
		var calls []Config
		o := ServiceOptions{Mode: Mode{Name: "m", AllFamilies: all, New: func(c Config) (Backend, error) {
			calls = append(calls, c)
			return &recordingBackend{}, nil
		}}}
		b, err := o.newBackend(Config{}, both)
		if err != nil {
			t.Fatal(err)
		}
		_, per := b.(*PerFamily)
		switch {
		case all && (len(calls) != 1 || per || calls[0].Family != ipfamily.IPv4 || !slices.Equal(calls[0].Families, both)):
			t.Errorf("AllFamilies: %d New calls %+v, PerFamily %v; want one, Family IPv4, Families both, no PerFamily", len(calls), calls, per)
		case !all && (len(calls) != 2 || !per || calls[1].Family != ipfamily.IPv6):
			t.Errorf("per family: %d New calls, PerFamily %v; want two and a PerFamily", len(calls), per)
		}
	}
}

// TestPerFamilyHandsOnlyTheFamilysChanges: after an endpoint of one
// family changes, only that family's Backend is told the Service changed,
// and the other still holds the very ServicePort it was handed (State
// keeps a port built again unchanged); a change to the Service itself
// reaches both; after a family's Backend fails, it is handed changed as
// it is. Before, both Backends got every changed Service, and the IPv6
// one rewrote a dual-stack Service's IPv6 port whenever its IPv4
// endpoints changed (nftables mode: one endpoint change 3.4× the
// single-stack time, BENCHMARKS.md).
func TestPerFamilyHandsOnlyTheFamilysChanges(t *testing.T) {
	svc, eps := dualStack()
	st := cluster.NewStore()
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, []cluster.Object{svc, eps[0], eps[1]})
	state := NewState(ipfamily.IPv4, ipfamily.IPv6)
	state.Update(st, "n1", nil, true)
	b4, b6 := &recordingBackend{}, &recordingBackend{}
	pf := NewPerFamily(map[ipfamily.Family]Backend{ipfamily.IPv4: b4, ipfamily.IPv6: b6})
	if _, err := pf.Sync(state.Ports, nil, true); err != nil {
		t.Fatal(err)
	}
	key := svc.Key()
	sync := func(what string, dirty ...cluster.Object) {
		t.Helper()
		for _, o := range dirty {
			st.Upsert(o)
		}
		changed := state.Update(st, "n1", map[cluster.Key]bool{key: true}, false)
		if !changed[key] {
			t.Fatalf("%s: State reports no change", what)
		}
		if _, err := pf.Sync(state.Ports, changed, false); err != nil && b6.err == nil {
			t.Fatal(err)
		}
		for f, b := range map[ipfamily.Family]*recordingBackend{ipfamily.IPv4: b4, ipfamily.IPv6: b6} {
			if want := portsOf(state.Ports, f); !maps.EqualFunc(b.got, want, slices.Equal) {
				t.Errorf("%s: %v Backend got %v, want %v", what, f, b.got, want)
			}
		}
	}
	for _, f := range ipfamily.All {
		mine, other := b4, b6
		if f == ipfamily.IPv6 {
			mine, other = b6, b4
		}
		before := other.got[key][0]
		i := map[ipfamily.Family]int{ipfamily.IPv4: 0, ipfamily.IPv6: 1}[f]
		es := *eps[i]
		es.Endpoints = []cluster.Endpoint{es.Endpoints[0]}
		es.Endpoints[0].Ready = false
		eps[i] = &es
		sync(f.String()+" endpoint not ready", &es)
		if !mine.changed[key] || other.changed[key] {
			t.Errorf("%v endpoint change: %v told %v, the other %v", f, f, mine.changed, other.changed)
		}
		if other.got[key][0] != before {
			t.Errorf("%v endpoint change: the other family's port was built anew", f)
		}
	}
	s2 := *svc
	s2.SessionAffinityTimeout = 3 * time.Hour
	sync("Service change", &s2)
	if !b4.changed[key] || !b6.changed[key] {
		t.Errorf("Service change: IPv4 told %v, IPv6 %v; want both", b4.changed, b6.changed)
	}
	b6.err = errors.New("boom")
	s2.SessionAffinityTimeout = 2 * time.Hour
	sync("Service change, IPv6 fails", &s2)
	b6.err = nil
	es := *eps[0]
	es.Endpoints = nil
	sync("IPv4 endpoints gone", &es)
	if !b4.changed[key] || !b6.changed[key] {
		t.Errorf("after an IPv6 failure: IPv4 told %v, IPv6 %v; want both (no last to compare with)", b4.changed, b6.changed)
	}
}
