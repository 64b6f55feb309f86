package proxy

import (
	"log/slog"
	"net/netip"
	"slices"

	"github.com/podnet/podnet/dataplane/cluster"
)

// StaleConntrack returns the conntrack entries to delete after a sync took
// the changed Services from old to new: StaleUDP's, and for each TCP port
// that now has endpoints and had none before (a new Service among them) the
// entries towards its IPs that were never DNATed. later are StaleUDP's
// later ones.
//
// A connection tried while a cluster IP had no rules was routed out as it
// was and left an un-NATed entry (SYN_SENT lives 120 s); a later connection
// reusing that source port matches the entry, skips the nat table and goes
// nowhere. NodePorts are left out for TCP: a node address answers a SYN
// itself (RST, a 10 s CLOSE entry), and a port-only filter would also catch
// the node's own connections to that port elsewhere.
func StaleConntrack(old, new map[cluster.Key][]*ServicePort, changed map[cluster.Key]bool) (now, later []ConntrackFilter) {
	now, later = StaleUDP(old, new, changed)
	for key := range changed {
		for _, n := range new[key] {
			if n.Protocol != cluster.TCP || len(usedEndpoints(n)) == 0 || len(usedEndpoints(findPort(old[key], n.Name))) > 0 {
				continue
			}
			for _, f := range frontends(n, netip.AddrPort{}) {
				if f.OrigDst.IsValid() {
					now = append(now, f)
				}
			}
		}
	}
	return now, later
}

// StaleUDP returns the UDP conntrack entries to delete after the changed
// Services went from old to new:
//   - those a frontend DNATed to a destination (endpoint address and port,
//     the port's protocol) it no longer sends to and that no longer serves:
//     an endpoint left or stopped serving, its port moved (targetPort
//     changed, a named port resolves elsewhere), the Service port changed
//     protocol, or the frontend itself went away. A client that keeps
//     sending from one socket (or a new socket that reuses a source port
//     whose entry lives on: 30 s after its last answer) would otherwise
//     stay on the old destination until the entry times out, hearing
//     nothing;
//   - for a port that had no endpoints and now has some, the entries to its
//     frontends that were never DNATed (a client that kept sending while
//     there were none, or before the rules existed, would otherwise stay
//     pinned to an entry that goes nowhere).
//
// Entries towards destinations the frontend still uses, or that still
// serve (a draining pod's, terminating and serving, or one topology leaves
// out), are left alone, as kube-proxy does: deleting an entry whose query
// is in flight loses the answer (it comes back from the endpoint's address,
// is not un-NATed, and the client's socket, connected to the Service IP,
// drops it: a UDP lookup that times out; two in the dns-lab's rolling
// update, 08:08:21). For the same reason the entries of a destination that
// the old rules still sent to and that left while terminating (ready to
// not serving within one sync) come in later: to be deleted once queries
// sent before the rules changed have had their answers.
func StaleUDP(old, new map[cluster.Key][]*ServicePort, changed map[cluster.Key]bool) (now, later []ConntrackFilter) {
	for key := range changed {
		for _, o := range old[key] {
			if o.Protocol == cluster.UDP {
				n, l := goneDestinations(o, findPort(new[key], o.Name))
				now, later = append(now, n...), append(later, l...)
			}
		}
		for _, n := range new[key] {
			if n.Protocol != cluster.UDP || len(usedEndpoints(n)) == 0 {
				continue
			}
			if len(usedEndpoints(findPort(old[key], n.Name))) == 0 {
				now = append(now, frontends(n, netip.AddrPort{})...)
			}
		}
	}
	return now, later
}

// goneDestinations returns a filter for every frontend of o and
// destination it DNATed to (or that served) that n (nil: the port is gone)
// neither DNATs to nor has serving; later those o still DNATed to that
// are terminating in n.
func goneDestinations(o, n *ServicePort) (now, later []ConntrackFilter) {
	live := make(map[ConntrackFilter]bool)
	terminating := make(map[netip.AddrPort]bool)
	if n != nil {
		for _, dst := range liveDestinations(n) {
			for _, f := range frontends(n, dst) {
				live[f] = true
			}
		}
		for _, e := range n.Endpoints {
			if e.Terminating {
				terminating[e.AddrPort()] = true
			}
		}
	}
	used := destinations(o)
	for _, dst := range liveDestinations(o) {
		for _, f := range frontends(o, dst) {
			switch {
			case live[f]:
			case terminating[dst] && slices.Contains(used, dst):
				later = append(later, f)
			default:
				now = append(now, f)
			}
		}
	}
	return now, later
}

// liveDestinations are destinations and the addresses and ports of the
// port's serving endpoints, sorted.
func liveDestinations(sp *ServicePort) []netip.AddrPort {
	out := destinations(sp)
	for _, e := range sp.Endpoints {
		if e.Serving && !slices.Contains(out, e.AddrPort()) {
			out = append(out, e.AddrPort())
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}

// destinations are the endpoints' addresses and ports the port's rules
// DNAT to, for internal or external traffic, sorted.
func destinations(sp *ServicePort) []netip.AddrPort {
	var out []netip.AddrPort
	for _, eps := range [][]Endpoint{sp.ClusterEndpoints, sp.LocalEndpoints} {
		for _, e := range eps {
			if !slices.Contains(out, e.AddrPort()) {
				out = append(out, e.AddrPort())
			}
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}

func usedEndpoints(sp *ServicePort) map[netip.Addr]bool {
	m := make(map[netip.Addr]bool)
	if sp == nil {
		return m
	}
	for _, e := range sp.ClusterEndpoints {
		m[e.Addr()] = true
	}
	for _, e := range sp.LocalEndpoints {
		m[e.Addr()] = true
	}
	return m
}

// frontends returns filters for the port's entries whose reply comes from
// dst (the destination they were DNATed to) or, with dst invalid, for
// those that were never DNATed (the reply comes from the frontend address
// itself): traffic that found no rule.
func frontends(sp *ServicePort, dst netip.AddrPort) []ConntrackFilter {
	var out []ConntrackFilter
	for _, ip := range append(append([]netip.Addr{sp.ClusterIP}, sp.ExternalIPs...), sp.LoadBalancerIPs...) {
		f := ConntrackFilter{Protocol: sp.Protocol, OrigDst: ip, OrigDstPort: sp.Port, ReplySrc: ip}
		if dst.IsValid() {
			f.ReplySrc, f.ReplySrcPort = dst.Addr(), dst.Port()
		}
		out = append(out, f)
	}
	if sp.NodePort != 0 {
		out = append(out, ConntrackFilter{Protocol: sp.Protocol, Family: sp.Family(), OrigDstPort: sp.NodePort, ReplySrc: dst.Addr(), ReplySrcPort: dst.Port()})
	}
	return out
}

func findPort(ports []*ServicePort, name PortName) *ServicePort {
	for _, sp := range ports {
		if sp.Name == name {
			return sp
		}
	}
	return nil
}

// deleteStale hands the filters to ct in one call (one walk of the table).
func deleteStale(ct Conntrack, filters []ConntrackFilter, logger *slog.Logger) {
	if ct == nil || len(filters) == 0 {
		return
	}
	if err := ct.Delete(filters); err != nil {
		logger.Warn("delete stale conntrack entries", "filters", len(filters), "first", filters[0], "err", err)
	}
}
