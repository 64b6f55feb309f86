// Package conntrack deletes connection-tracking entries, so that a client
// whose flow was pinned to an endpoint that went away, or to a Service IP
// before its rules existed, is sent somewhere that answers. It speaks
// netlink (NETLINK_NETFILTER) in the calling thread's network namespace:
// one dump of the table per call, however many filters.
package conntrack

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// Filter selects entries. Zero fields match anything.
type Filter struct {
	Protocol string // "udp", "tcp", "sctp"; required
	// Family is the table the filter looks in; zero: the family of
	// OrigDst, else of ReplySrc (a filter with neither must name it).
	Family      ipfamily.Family
	OrigDst     netip.Addr
	OrigDstPort uint16
	ReplySrc    netip.Addr
	// ReplySrcPort is where the entry's reply comes from: the port a
	// DNATed flow was sent to.
	ReplySrcPort uint16
}

func (f Filter) String() string {
	var b strings.Builder
	b.WriteString(f.Protocol)
	if f.OrigDst.IsValid() {
		fmt.Fprintf(&b, " orig-dst %s", f.OrigDst)
	}
	if f.OrigDstPort != 0 {
		fmt.Fprintf(&b, " orig-port-dst %d", f.OrigDstPort)
	}
	if f.ReplySrc.IsValid() {
		fmt.Fprintf(&b, " reply-src %s", f.ReplySrc)
	}
	if f.ReplySrcPort != 0 {
		fmt.Fprintf(&b, " reply-port-src %d", f.ReplySrcPort)
	}
	return b.String()
}

func protoNum(p string) (uint8, error) {
	switch strings.ToLower(p) {
	case "tcp":
		return unix.IPPROTO_TCP, nil
	case "udp":
		return unix.IPPROTO_UDP, nil
	case "sctp":
		return unix.IPPROTO_SCTP, nil
	case "":
		return 0, errors.New("conntrack filter: protocol is required")
	}
	return 0, fmt.Errorf("conntrack filter: protocol %q is not tcp, udp or sctp", p)
}

// family is the conntrack table f looks in.
func (f Filter) family() (ipfamily.Family, error) {
	for _, fam := range []ipfamily.Family{f.Family, ipfamily.Of(f.OrigDst), ipfamily.Of(f.ReplySrc)} {
		if fam != 0 {
			return fam, nil
		}
	}
	return 0, fmt.Errorf("conntrack filter %s: no address family", f)
}

// byFamily splits filters by the table they look in, IPv4 first.
func byFamily(filters []Filter) ([][]Filter, []ipfamily.Family, error) {
	var groups [][]Filter
	var fams []ipfamily.Family
	for _, fam := range ipfamily.All {
		var g []Filter
		for _, f := range filters {
			ff, err := f.family()
			if err != nil {
				return nil, nil, err
			}
			if ff == fam {
				g = append(g, f)
			}
		}
		if len(g) > 0 {
			groups, fams = append(groups, g), append(fams, fam)
		}
	}
	return groups, fams, nil
}

// matcher is the filters of one call, indexed by protocol and destination
// port, so a dump of the whole table is matched in one pass whatever the
// number of filters (the first sync after a start hands one per Service).
type matcher struct {
	byPort map[uint8]map[uint16][]Filter // port 0: any port
}

func newMatcher(filters []Filter) (*matcher, error) {
	m := &matcher{byPort: make(map[uint8]map[uint16][]Filter)}
	for _, f := range filters {
		p, err := protoNum(f.Protocol)
		if err != nil {
			return nil, err
		}
		if m.byPort[p] == nil {
			m.byPort[p] = make(map[uint16][]Filter)
		}
		m.byPort[p][f.OrigDstPort] = append(m.byPort[p][f.OrigDstPort], f)
	}
	return m, nil
}

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (m *matcher) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	ports := m.byPort[flow.Forward.Protocol]
	if ports == nil {
		return false
	}
	for _, port := range []uint16{flow.Forward.DstPort, 0} {
		for _, f := range ports[port] {
			if matchIP(f.OrigDst, flow.Forward.DstIP) && matchIP(f.ReplySrc, flow.Reverse.SrcIP) &&
				(f.ReplySrcPort == 0 || f.ReplySrcPort == flow.Reverse.SrcPort) {
				return true
			}
		}
		if flow.Forward.DstPort == 0 {
			break
		}
	}
	return false
}

func matchIP(want netip.Addr, got net.IP) bool {
	if !want.IsValid() {
		return true
	}
	a, ok := netip.AddrFromSlice(got)
	return ok && a.Unmap() == want
}

// Delete removes the entries matching any of filters and returns how many
// it removed: one dump of each family's table the filters look in.
// Finding none is not an error.
func Delete(filters ...Filter) (int, error) {
	groups, fams, err := byFamily(filters)
	if err != nil {
		return 0, err
	}
	total := 0
	for i, g := range groups {
		m, err := newMatcher(g)
		if err != nil {
			return total, err
		}
		n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.InetFamily(fams[i].AF()), m)
		total += int(n)
		if err != nil {
			return total, fmt.Errorf("delete %v conntrack entries (%d filters, first %s): %w", fams[i], len(g), g[0], err)
		}
	}
	return total, nil
}

// Count returns how many entries match f.
func Count(f Filter) (int, error) {
	fam, err := f.family()
	if err != nil {
		return 0, err
	}
	m, err := newMatcher([]Filter{f})
	if err != nil {
		return 0, err
	}
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, netlink.InetFamily(fam.AF()))
	if err != nil {
		return 0, fmt.Errorf("list conntrack entries: %w", err)
	}
	n := 0
	for _, fl := range flows {
		if m.MatchConntrackFlow(fl) {
			n++
		}
	}
	return n, nil
}
