package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

// nodeLocalDNS is kube-dns as deploy/node-local-dns makes it: UDP and TCP
// 53, PreferSameNode, a dnsd on n1 (this node) and one on n2, in both
// families.
func nodeLocalDNS(trafficDistribution string) []cluster.Object {
	svc := &cluster.Service{Namespace: "kube-system", Name: "kube-dns", Type: cluster.ServiceTypeClusterIP,
		ClusterIPs:          []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:10:96::a")},
		TrafficDistribution: trafficDistribution,
		Ports:               []cluster.ServicePort{{Name: "dns", Protocol: cluster.UDP, Port: 53}, {Name: "dns-tcp", Protocol: cluster.TCP, Port: 53}}}
	objs := []cluster.Object{svc}
	for _, f := range []struct{ family, local, remote string }{
		{"IPv4", "10.244.0.5", "10.244.1.5"},
		{"IPv6", "fd00:10:244::5", "fd00:10:244:1::5"},
	} {
		objs = append(objs, &cluster.EndpointSlice{Namespace: "kube-system", Name: "kube-dns-" + f.family, ServiceName: "kube-dns", AddressType: f.family,
			Ports: []cluster.EndpointPort{{Name: "dns", Protocol: cluster.UDP, Port: 53}, {Name: "dns-tcp", Protocol: cluster.TCP, Port: 53}},
			Endpoints: []cluster.Endpoint{
				{Addresses: []netip.Addr{netip.MustParseAddr(f.local)}, Ready: true, Serving: true, NodeName: "n1"},
				{Addresses: []netip.Addr{netip.MustParseAddr(f.remote)}, Ready: true, Serving: true, NodeName: "n2"},
			}})
	}
	return objs
}

// clusterAddrs lists every port's cluster endpoints, "PORT/PROTO:ADDR".
func clusterAddrs(ports []*ServicePort) []string {
	var out []string
	for _, sp := range ports {
		for _, e := range sp.ClusterEndpoints {
			out = append(out, sp.Name.Port+"/"+string(sp.Name.Protocol)+":"+e.Addr().String())
		}
	}
	slices.Sort(out)
	return out
}

func TestLocalProbeFallsOverAndBack(t *testing.T) {
	st := cluster.NewStore()
	for _, o := range nodeLocalDNS("PreferSameNode") {
		st.Upsert(o)
	}
	key := cluster.Key{Namespace: "kube-system", Name: "kube-dns"}
	var marked []cluster.Key
	p := newLocalProber(100*time.Millisecond, func(keys []cluster.Key) { marked = append(marked, keys...) }, slog.New(slog.DiscardHandler))
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	urgent := 0
	p.urgent = func() { urgent++ }
	var dialErr error
	var dialed []netip.AddrPort
	p.dial = func(_ context.Context, ap netip.AddrPort) error { dialed = append(dialed, ap); return dialErr }
	state := NewState(ipfamily.IPv4, ipfamily.IPv6)
	state.probe, state.probes = p, map[cluster.Key][]netip.AddrPort{}
	sync := func() []string {
		t.Helper()
		dirty := map[cluster.Key]bool{}
		for _, k := range marked {
			dirty[k] = true
		}
		marked = nil
		state.Update(st, "n1", dirty, len(state.Ports) == 0)
		if targets, ok := state.Probes(); ok {
			p.setTargets(targets)
		}
		return clusterAddrs(state.Ports[key])
	}
	local := []string{"dns-tcp/TCP:10.244.0.5", "dns-tcp/TCP:fd00:10:244::5", "dns/UDP:10.244.0.5", "dns/UDP:fd00:10:244::5"}
	remote := []string{"dns-tcp/TCP:10.244.1.5", "dns-tcp/TCP:fd00:10:244:1::5", "dns/UDP:10.244.1.5", "dns/UDP:fd00:10:244:1::5"}
	if got := sync(); !slices.Equal(got, local) {
		t.Fatalf("before any probe: %v, want the local dnsd %v", got, local)
	}
	p.round(context.Background())
	slices.SortFunc(dialed, netip.AddrPort.Compare)
	if want := []netip.AddrPort{netip.MustParseAddrPort("10.244.0.5:53"), netip.MustParseAddrPort("[fd00:10:244::5]:53")}; !slices.Equal(dialed, want) {
		t.Errorf("probed %v, want the local endpoints at the TCP port %v", dialed, want)
	}
	if len(marked) != 0 {
		t.Errorf("connects that succeeded marked %v", marked)
	}

	dialErr = &net.OpError{Op: "dial", Err: context.DeadlineExceeded}
	p.round(context.Background())
	if got := sync(); len(marked) != 0 || !slices.Equal(got, local) {
		t.Errorf("after timeouts: marked %v, endpoints %v; want nothing changed (a timeout says nothing)", marked, got)
	}

	dialErr = &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}
	p.round(context.Background())
	if len(marked) == 0 || marked[0] != key || urgent != 1 {
		t.Fatalf("refused: marked %v, urgent syncs asked %d; want %v marked and one urgent sync", marked, urgent, key)
	}
	if got := sync(); !slices.Equal(got, remote) {
		t.Errorf("the local dnsd refused: %v, want the other node's %v", got, remote)
	}

	dialErr = nil
	p.round(context.Background())
	now = now.Add(probeHold - time.Millisecond)
	p.round(context.Background())
	if got := sync(); !slices.Equal(got, remote) {
		t.Errorf("accepting for less than %v: %v, want still the other node's %v", probeHold, got, remote)
	}
	now = now.Add(time.Millisecond)
	p.round(context.Background())
	if got := sync(); !slices.Equal(got, local) {
		t.Errorf("accepting for %v: %v, want the local dnsd again %v", probeHold, got, local)
	}
	if urgent != 1 {
		t.Errorf("%d urgent syncs asked, want 1 (the way back can wait for the minimum sync period)", urgent)
	}
}

func TestLocalProbeForgetsWhatTheSliceTakesAway(t *testing.T) {
	st := cluster.NewStore()
	objs := nodeLocalDNS("PreferSameNode")
	for _, o := range objs {
		st.Upsert(o)
	}
	p := newLocalProber(time.Second, func([]cluster.Key) {}, slog.New(slog.DiscardHandler))
	p.dial = func(context.Context, netip.AddrPort) error { return syscall.ECONNREFUSED }
	state := NewState(ipfamily.IPv4)
	state.probe, state.probes = p, map[cluster.Key][]netip.AddrPort{}
	state.Update(st, "n1", nil, true)
	targets, _ := state.Probes()
	p.setTargets(targets)
	p.round(context.Background())
	local := netip.MustParseAddrPort("10.244.0.5:53")
	if !p.Refused(local) {
		t.Fatal("a refused endpoint is not down")
	}
	// The kubelet marks it not ready: no longer probed, nothing kept.
	es := *objs[1].(*cluster.EndpointSlice)
	es.Endpoints = slices.Clone(es.Endpoints)
	es.Endpoints[0].Ready = false
	st.Upsert(&es)
	state.Update(st, "n1", map[cluster.Key]bool{{Namespace: "kube-system", Name: "kube-dns"}: true}, false)
	targets, ok := state.Probes()
	if !ok || len(targets) != 0 {
		t.Fatalf("targets after the endpoint turned not ready: %v (changed %v), want none", targets, ok)
	}
	p.setTargets(targets)
	if p.Refused(local) {
		t.Error("an endpoint no longer probed is still down: when it is ready again it would not be used")
	}
}

func TestLocalProbeOnlyPreferSameNode(t *testing.T) {
	for _, td := range []string{"", "PreferSameZone"} {
		st := cluster.NewStore()
		for _, o := range nodeLocalDNS(td) {
			st.Upsert(o)
		}
		p := newLocalProber(time.Second, func([]cluster.Key) {}, slog.New(slog.DiscardHandler))
		state := NewState(ipfamily.IPv4, ipfamily.IPv6)
		state.probe, state.probes = p, map[cluster.Key][]netip.AddrPort{}
		state.Update(st, "n1", nil, true)
		if targets, _ := state.Probes(); len(targets) != 0 {
			t.Errorf("trafficDistribution %q: probes %v, want none", td, targets)
		}
	}
}

// TestDialCloseRefused checks that the real probe tells a closed port by
// the error the prober looks for, in both families.
func TestDialCloseRefused(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Logf("%s: %v (no such family here)", addr, err)
			continue
		}
		ap := netip.MustParseAddrPort(l.Addr().String())
		if err := dialClose(context.Background(), ap); err != nil {
			t.Errorf("%v listening: %v", ap, err)
		}
		l.Close()
		if err := dialClose(context.Background(), ap); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%v closed: %v, want ECONNREFUSED", ap, err)
		}
	}
}
