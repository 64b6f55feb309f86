package ebpf

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/podnet/podnet/bpf"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy"
)

func TestExpireFlows(t *testing.T) {
	fwd := NewFakeTable[bpf.NodeportCtKey, bpf.NodeportCtFwdVal](1 << 16)
	rev := NewFakeTable[bpf.NodeportCtKey, bpf.NodeportCtRevVal](1 << 16)
	aff := NewFakeTable[bpf.SockAffinityKey, bpf.SockAffinityVal](1 << 16)
	bs := NewFakeTable[uint32, backend](1 << 16)
	client, node := netip.MustParseAddr("192.168.20.5"), netip.MustParseAddr("192.168.10.12")
	old, moved := netip.MustParseAddrPort("10.244.1.5:6001"), netip.MustParseAddrPort("10.244.1.5:6002")
	other := netip.MustParseAddrPort("10.244.2.6:6001")
	// flow records a flow from client port sport to the NodePort, sent to
	// backend b (SNATed to the node, same port), as nodeport_in does.
	flow := func(proto uint8, sport uint16, b netip.AddrPort) (bpf.NodeportCtKey, bpf.NodeportCtKey) {
		fk := bpf.NodeportCtKey{Saddr: addr16(client), Daddr: addr16(node), Sport: be16(sport), Dport: be16(30090), Proto: proto}
		rk := bpf.NodeportCtKey{Saddr: addr16(b.Addr()), Daddr: addr16(node), Sport: be16(b.Port()), Dport: be16(sport), Proto: proto}
		fwd.Entries[fk] = bpf.NodeportCtFwdVal{Baddr: addr16(b.Addr()), Bport: be16(b.Port()), Naddr: addr16(node), Nport: be16(sport)}
		rev.Entries[rk] = bpf.NodeportCtRevVal{Faddr: addr16(node), Fport: be16(30090), Caddr: addr16(client), Cport: be16(sport)}
		return fk, rk
	}
	goneFwd, goneRev := flow(17, 40001, old)
	evictedFwd, evictedRev := flow(17, 40002, old)
	delete(rev.Entries, evictedRev) // the LRU evicted the reply's entry
	tcpFwd, _ := flow(6, 40003, old)
	keptFwd, _ := flow(17, 40004, other)
	newFwd, _ := flow(17, 40005, moved)

	bs.Entries[7] = backend{Addr: addr16(moved.Addr()), Port: be16(moved.Port()), Proto: 17, Svc: 1}
	keptAff := bpf.SockAffinityKey{Netns: 1, Svc: 1}
	goneAff := bpf.SockAffinityKey{Netns: 2, Svc: 1}
	aff.Entries[keptAff] = bpf.SockAffinityVal{Backend: 7}
	aff.Entries[goneAff] = bpf.SockAffinityVal{Backend: 3} // its backend was deleted

	f := Flows{Fwd: fwd, Rev: rev, Affinity: aff, Backends: bs}
	// old is gone everywhere; other only from NodePort 30091, which
	// keptFwd did not reach.
	flows, affinity, err := f.Expire([]FlowTarget{{Backend: old}, {Frontend: netip.AddrPortFrom(netip.Addr{}, 30091), Backend: other}})
	if err != nil {
		t.Fatal(err)
	}
	if flows != 2 || affinity != 1 {
		t.Errorf("expired %d flows and %d affinity entries, want 2 and 1", flows, affinity)
	}
	for _, k := range []bpf.NodeportCtKey{goneFwd, evictedFwd} {
		if _, ok := fwd.Entries[k]; ok {
			t.Errorf("UDP flow %+v to the removed %s is still there", k, old)
		}
	}
	if _, ok := rev.Entries[goneRev]; ok {
		t.Errorf("the reply entry of a flow to the removed %s is still there", old)
	}
	for name, k := range map[string]bpf.NodeportCtKey{"TCP to the same address and port": tcpFwd, "to another endpoint": keptFwd, "to the new port": newFwd} {
		if _, ok := fwd.Entries[k]; !ok {
			t.Errorf("flow %s was expired", name)
		}
	}
	if len(rev.Entries) != 3 {
		t.Errorf("%d reply entries left, want the 3 of the kept flows", len(rev.Entries))
	}
	if _, ok := aff.Entries[goneAff]; ok {
		t.Error("the affinity entry of a deleted backend is still there")
	}
	if _, ok := aff.Entries[keptAff]; !ok {
		t.Error("the affinity entry of a live backend was expired")
	}
}

// TestSyncerMovedUDP: a sync that takes a UDP backend away from a
// Service's frontends reports each (frontend, backend) pair, the tc
// programs' and socket LB's apart, even when another Service still uses
// the endpoint (so it is not removed); a full sync carrying the change (the
// periodic one, due when it came) as a partial one does: the lab's 2 s
// full syncs took it about every other run, and the socket stayed.
func TestSyncerMovedUDP(t *testing.T) {
	for _, full := range []bool{false, true} {
		t.Run(map[bool]string{false: "partial", true: "full"}[full], func(t *testing.T) { testSyncerMovedUDP(t, full) })
	}
}

func testSyncerMovedUDP(t *testing.T, full bool) {
	maps, _, _ := NewFakeMaps()
	sy := NewSyncer(maps, func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("192.168.10.11")}, nil })
	a := ep("10.244.2.3", 6001, false)
	np := func(e proxy.Endpoint) *proxy.ServicePort {
		sp := clusterIPPort("np", "10.96.25.11", 80, cluster.UDP, e)
		sp.NodePort, sp.ExternalIPs = 30725, []netip.Addr{netip.MustParseAddr("192.0.2.60")}
		return sp
	}
	ports := map[cluster.Key][]*proxy.ServicePort{
		key("np"):    {np(a)},
		key("other"): {clusterIPPort("other", "10.96.25.10", 80, cluster.UDP, a)},
	}
	if _, err := sy.Sync(ports, nil, true); err != nil {
		t.Fatal(err)
	}
	if f, s := sy.TakeMovedUDP(); len(f)+len(s) != 0 {
		t.Errorf("first sync moved %v %v, want nothing", f, s)
	}
	ports[key("np")] = []*proxy.ServicePort{np(ep("10.244.2.3", 6002, false))}
	if _, err := sy.Sync(ports, map[cluster.Key]bool{key("np"): true}, full); err != nil {
		t.Fatal(err)
	}
	if removed := sy.TakeRemovedUDP(); len(removed) != 0 {
		t.Errorf("removed %v; want none, the other Service still uses %s", removed, a.AddrPort())
	}
	flows, sockets := sy.TakeMovedUDP()
	byFrontend := func(x, y FlowTarget) int { return x.Frontend.Compare(y.Frontend) }
	slices.SortFunc(flows, byFrontend)
	slices.SortFunc(sockets, byFrontend)
	nodePort := FlowTarget{Frontend: netip.AddrPortFrom(netip.Addr{}, 30725), Backend: a.AddrPort()}
	externalIP := FlowTarget{Frontend: netip.MustParseAddrPort("192.0.2.60:80"), Backend: a.AddrPort()}
	clusterIP := FlowTarget{Frontend: netip.MustParseAddrPort("10.96.25.11:80"), Backend: a.AddrPort()}
	if want := []FlowTarget{nodePort, externalIP}; !slices.Equal(flows, want) {
		t.Errorf("moved flows %v, want %v", flows, want)
	}
	// Socket LB serves the cluster IP too; the other Service's frontend,
	// still sending to the endpoint, is not among them.
	if want := []FlowTarget{nodePort, clusterIP, externalIP}; !slices.Equal(sockets, want) {
		t.Errorf("moved socket pairs %v, want %v", sockets, want)
	}
	if f, s := sy.TakeMovedUDP(); len(f)+len(s) != 0 {
		t.Errorf("moved again %v %v, want nothing", f, s)
	}
	// A periodic full sync with nothing changed moves nothing.
	if _, err := sy.Sync(ports, nil, true); err != nil {
		t.Fatal(err)
	}
	if f, s := sy.TakeMovedUDP(); len(f)+len(s) != 0 {
		t.Errorf("an unchanged full sync moved %v %v, want nothing", f, s)
	}
	// The Service deleted in a full sync: its pairs move too (the other
	// Service keeps the endpoint).
	delete(ports, key("np"))
	if _, err := sy.Sync(ports, map[cluster.Key]bool{key("np"): true}, full); err != nil {
		t.Fatal(err)
	}
	_, sockets = sy.TakeMovedUDP()
	moved6002 := FlowTarget{Frontend: clusterIP.Frontend, Backend: netip.MustParseAddrPort("10.244.2.3:6002")}
	if removed := sy.TakeRemovedUDP(); len(removed) != 1 || removed[0] != moved6002.Backend {
		t.Errorf("Service deleted: removed %v, want [%v]", removed, moved6002.Backend)
	}
	if len(sockets) != 0 {
		t.Errorf("Service deleted: moved socket pairs %v, want none (its endpoint is removed whole)", sockets)
	}
}
