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
// entries towards its IPs that were never DNATed.
//
// A connection tried while a cluster IP had no rules was routed out as it
// was and left an un-NATed entry (SYN_SENT lives 120 s); a later connection
// reusing that source port matches the entry, skips the nat table and goes
// nowhere. NodePorts are left out for TCP: a node address answers a SYN
// itself (RST, a 10 s CLOSE entry), and a port-only filter would also catch
// the node's own connections to that port elsewhere.
func StaleConntrack(old, new map[cluster.Key][]*ServicePort, changed map[cluster.Key]bool) []ConntrackFilter {
	out := StaleUDP(old, new, changed)
	for key := range changed {
		for _, n := range new[key] {
			if n.Protocol != cluster.TCP || len(usedEndpoints(n)) == 0 || len(usedEndpoints(findPort(old[key], n.Name))) > 0 {
				continue
			}
			for _, f := range frontends(n, netip.AddrPort{}) {
				if f.OrigDst.IsValid() {
					out = append(out, f)
				}
			}
		}
	}
	return out
}

// StaleUDP returns the UDP conntrack entries to delete after the changed
// Services went from old to new:
//   - those a frontend DNATed to a destination (endpoint address and port,
//     the port's protocol) it no longer sends to: an endpoint left, its port
//     moved (targetPort changed, a named port resolves elsewhere), the
//     Service port changed protocol, or the frontend itself went away. A
//     client that keeps sending from one socket would otherwise stay on the
//     old destination until the entry times out, hearing nothing;
//   - for a port that had no endpoints and now has some, the entries to its
//     frontends that were never DNATed (a client that kept sending while
//     there were none, or before the rules existed, would otherwise stay
//     pinned to an entry that goes nowhere).
//
// Entries towards destinations the frontend still uses are left alone.
func StaleUDP(old, new map[cluster.Key][]*ServicePort, changed map[cluster.Key]bool) []ConntrackFilter {
	var out []ConntrackFilter
	for key := range changed {
		for _, o := range old[key] {
			if o.Protocol == cluster.UDP {
				out = append(out, goneDestinations(o, findPort(new[key], o.Name))...)
			}
		}
		for _, n := range new[key] {
			if n.Protocol != cluster.UDP || len(usedEndpoints(n)) == 0 {
				continue
			}
			if len(usedEndpoints(findPort(old[key], n.Name))) == 0 {
				out = append(out, frontends(n, netip.AddrPort{})...)
			}
		}
	}
	return out
}

// goneDestinations returns a filter for every frontend of o and
// destination it DNATed to that n (nil: the port is gone) does not.
func goneDestinations(o, n *ServicePort) []ConntrackFilter {
	now := make(map[ConntrackFilter]bool)
	if n != nil {
		for _, dst := range destinations(n) {
			for _, f := range frontends(n, dst) {
				now[f] = true
			}
		}
	}
	var out []ConntrackFilter
	for _, dst := range destinations(o) {
		for _, f := range frontends(o, dst) {
			if !now[f] {
				out = append(out, f)
			}
		}
	}
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
