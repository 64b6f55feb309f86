package proxy

import (
	"log/slog"
	"net/netip"

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
			for _, f := range frontends(n, netip.Addr{}) {
				if f.OrigDst.IsValid() {
					out = append(out, f)
				}
			}
		}
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
