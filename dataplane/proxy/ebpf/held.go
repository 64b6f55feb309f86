package ebpf

import (
	"net/netip"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Destinations that leave while they serve: a UDP endpoint the maps no
// longer send to may still answer (a draining dnsd: terminating and
// serving). Destroying the sockets connected to it then aborts the queries
// in flight (ECONNABORTED: 5 UDP lookups of the dns-lab's rolling update
// in ebpf mode, 09:13:14, 70-150 ms after they were sent), and new sockets
// go to the other endpoints anyway. So, as the other modes keep such an
// endpoint's conntrack entries (proxy.StaleUDP), its sockets and flows are
// held until it no longer serves or has left the Service, and go then.

// heldUDP are the destinations held back, as Sync found them.
type heldUDP struct {
	removed        []netip.AddrPort
	flows, sockets []FlowTarget
}

// servingUDP is which UDP endpoints serve: any is every serving endpoint
// (for endpoints no frontend uses any more), byFrontend and byNodePort the
// serving endpoints of each frontend (a moved pair is held only while its
// endpoint serves that frontend's Service).
type servingUDP struct {
	any        map[netip.AddrPort]bool
	byFrontend map[netip.AddrPort]map[netip.AddrPort]bool
	byNodePort map[uint16]map[netip.AddrPort]bool
}

func newServingUDP(ports map[cluster.Key][]*proxy.ServicePort) servingUDP {
	s := servingUDP{any: map[netip.AddrPort]bool{}, byFrontend: map[netip.AddrPort]map[netip.AddrPort]bool{}, byNodePort: map[uint16]map[netip.AddrPort]bool{}}
	for _, sps := range ports {
		for _, sp := range sps {
			if sp.Protocol != cluster.UDP {
				continue
			}
			eps := map[netip.AddrPort]bool{}
			for _, e := range sp.Endpoints {
				if e.Serving {
					eps[e.AddrPort()] = true
					s.any[e.AddrPort()] = true
				}
			}
			for _, ip := range append(append([]netip.Addr{sp.ClusterIP}, sp.ExternalIPs...), sp.LoadBalancerIPs...) {
				s.byFrontend[netip.AddrPortFrom(ip, sp.Port)] = eps
			}
			if sp.NodePort != 0 {
				s.byNodePort[sp.NodePort] = eps
			}
		}
	}
	return s
}

// serves reports whether ft's endpoint still serves ft's frontend.
func (s servingUDP) serves(ft FlowTarget) bool {
	if eps, ok := s.byFrontend[ft.Frontend]; ok {
		return eps[ft.Backend]
	}
	if ft.Frontend.Port() == 0 {
		return s.any[ft.Backend]
	}
	return s.byNodePort[ft.Frontend.Port()][ft.Backend]
}

// hold returns what of the destinations that left (and of those held
// before) no longer serves, and keeps the rest for a later sync.
func (h *heldUDP) hold(serving servingUDP, removed []netip.AddrPort, flows, sockets []FlowTarget) (goRemoved []netip.AddrPort, goFlows, goSockets []FlowTarget) {
	var keep heldUDP
	for _, ap := range append(h.removed, removed...) {
		if serving.any[ap] {
			keep.removed = append(keep.removed, ap)
		} else {
			goRemoved = append(goRemoved, ap)
		}
	}
	split := func(fts []FlowTarget, kept *[]FlowTarget) (gone []FlowTarget) {
		for _, ft := range fts {
			if serving.serves(ft) {
				*kept = append(*kept, ft)
			} else {
				gone = append(gone, ft)
			}
		}
		return gone
	}
	goFlows = split(append(h.flows, flows...), &keep.flows)
	goSockets = split(append(h.sockets, sockets...), &keep.sockets)
	*h = keep
	return goRemoved, goFlows, goSockets
}
