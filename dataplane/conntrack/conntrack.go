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
)

// Filter selects entries. Zero fields match anything.
type Filter struct {
	Protocol    string // "udp", "tcp", "sctp"; required
	OrigDst     netip.Addr
	OrigDstPort uint16
	ReplySrc    netip.Addr
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
			if matchIP(f.OrigDst, flow.Forward.DstIP) && matchIP(f.ReplySrc, flow.Reverse.SrcIP) {
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

// Delete removes the IPv4 entries matching any of filters and returns how
// many it removed. Finding none is not an error.
func Delete(filters ...Filter) (int, error) {
	if len(filters) == 0 {
		return 0, nil
	}
	m, err := newMatcher(filters)
	if err != nil {
		return 0, err
	}
	n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, m)
	if err != nil {
		return int(n), fmt.Errorf("delete conntrack entries (%d filters, first %s): %w", len(filters), filters[0], err)
	}
	return int(n), nil
}

// Count returns how many IPv4 entries match f.
func Count(f Filter) (int, error) {
	m, err := newMatcher([]Filter{f})
	if err != nil {
		return 0, err
	}
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
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
