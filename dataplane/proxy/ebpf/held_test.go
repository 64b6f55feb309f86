package ebpf

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy"
)

// TestHeldUDPWhileServing: the sockets and flows of a UDP endpoint that left
// the maps while it still serves (draining) stay until it stops serving;
// those of one that does not serve go at once. Without the hold, the
// dns-lab's rolling update in ebpf mode aborted 5 lookups in flight.
func TestHeldUDPWhileServing(t *testing.T) {
	draining, dead := netip.MustParseAddrPort("10.244.0.2:53"), netip.MustParseAddrPort("[fd00:10:244::3]:53")
	vip := netip.MustParseAddrPort("10.96.0.10:53")
	port := func(serving bool) map[cluster.Key][]*proxy.ServicePort {
		sp := &proxy.ServicePort{Protocol: cluster.UDP, ClusterIP: vip.Addr(), Port: vip.Port()}
		e := proxy.NewEndpoint(draining.Addr(), draining.Port())
		e.Serving, e.Terminating = serving, true
		sp.Endpoints = []proxy.Endpoint{e}
		return map[cluster.Key][]*proxy.ServicePort{{Namespace: "kube-system", Name: "kube-dns"}: {sp}}
	}
	var h heldUDP
	removed, flows, sockets := h.hold(newServingUDP(port(true)), []netip.AddrPort{draining, dead},
		[]FlowTarget{{Frontend: vip, Backend: draining}}, []FlowTarget{{Frontend: vip, Backend: draining}, {Frontend: vip, Backend: dead}})
	if !slices.Equal(removed, []netip.AddrPort{dead}) || len(flows) != 0 || !slices.Equal(sockets, []FlowTarget{{Frontend: vip, Backend: dead}}) {
		t.Fatalf("while draining serves: removed %v flows %v sockets %v, want only the dead endpoint's", removed, flows, sockets)
	}
	removed, flows, sockets = h.hold(newServingUDP(port(true)), nil, nil, nil)
	if len(removed)+len(flows)+len(sockets) != 0 {
		t.Fatalf("still serving: %v %v %v, want all held", removed, flows, sockets)
	}
	removed, flows, sockets = h.hold(newServingUDP(port(false)), nil, nil, nil)
	if !slices.Equal(removed, []netip.AddrPort{draining}) || !slices.Equal(flows, []FlowTarget{{Frontend: vip, Backend: draining}}) || !slices.Equal(sockets, []FlowTarget{{Frontend: vip, Backend: draining}}) {
		t.Fatalf("no longer serving: removed %v flows %v sockets %v, want the held ones", removed, flows, sockets)
	}
	if removed, flows, sockets = h.hold(newServingUDP(nil), nil, nil, nil); len(removed)+len(flows)+len(sockets) != 0 {
		t.Errorf("held twice: %v %v %v", removed, flows, sockets)
	}
	// A pair whose endpoint serves another Service, not this frontend's
	// (a targetPort change with the old port still another Service's).
	other := netip.MustParseAddrPort("10.96.0.20:53")
	if _, _, sockets = h.hold(newServingUDP(port(true)), nil, nil, []FlowTarget{{Frontend: other, Backend: draining}}); len(sockets) != 1 {
		t.Errorf("a pair of a frontend whose Service no longer has the endpoint: %v, want it gone at once", sockets)
	}
}
