package conntrack

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/roottest"
)

func flow(proto uint8, dst string, dport uint16, replySrc string) *netlink.ConntrackFlow {
	f := &netlink.ConntrackFlow{}
	f.Forward = netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP("10.244.1.9"), DstIP: net.ParseIP(dst), SrcPort: 40000, DstPort: dport}
	f.Reverse = netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP(replySrc), DstIP: net.ParseIP("10.244.1.9"), SrcPort: dport, DstPort: 40000}
	return f
}

// dnat makes f's reply come from port.
func dnat(f *netlink.ConntrackFlow, port uint16) *netlink.ConntrackFlow {
	f.Reverse.SrcPort = port
	return f
}

func TestMatcher(t *testing.T) {
	vip := netip.MustParseAddr("10.96.0.10")
	m, err := newMatcher([]Filter{
		{Protocol: "UDP", OrigDst: vip, OrigDstPort: 53, ReplySrc: vip}, // never DNATed
		{Protocol: "tcp", OrigDstPort: 30080},                           // a NodePort
		// Entries DNATed to a target port that is gone.
		{Protocol: "udp", OrigDst: netip.MustParseAddr("10.96.0.20"), OrigDstPort: 80, ReplySrc: netip.MustParseAddr("10.244.2.3"), ReplySrcPort: 8080},
		{Protocol: "udp", OrigDst: netip.MustParseAddr("fd00:96::20"), OrigDstPort: 80, ReplySrc: netip.MustParseAddr("fd00:244:2::3"), ReplySrcPort: 8080},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		f    *netlink.ConntrackFlow
		want bool
	}{
		{"UDP to the VIP, un-NATed", flow(unix.IPPROTO_UDP, "10.96.0.10", 53, "10.96.0.10"), true},
		{"UDP to the VIP, DNATed", flow(unix.IPPROTO_UDP, "10.96.0.10", 53, "10.244.2.3"), false},
		{"TCP to the VIP (other protocol)", flow(unix.IPPROTO_TCP, "10.96.0.10", 53, "10.96.0.10"), false},
		{"UDP to another port", flow(unix.IPPROTO_UDP, "10.96.0.10", 54, "10.96.0.10"), false},
		{"TCP to the NodePort on any address", flow(unix.IPPROTO_TCP, "192.168.10.11", 30080, "10.244.2.3"), true},
		{"UDP to the NodePort's number", flow(unix.IPPROTO_UDP, "192.168.10.11", 30080, "10.244.2.3"), false},
		{"UDP DNATed to the old target port", dnat(flow(unix.IPPROTO_UDP, "10.96.0.20", 80, "10.244.2.3"), 8080), true},
		{"UDP DNATed to the new target port", dnat(flow(unix.IPPROTO_UDP, "10.96.0.20", 80, "10.244.2.3"), 8081), false},
		{"UDP DNATed to the old target port, another endpoint", dnat(flow(unix.IPPROTO_UDP, "10.96.0.20", 80, "10.244.2.4"), 8080), false},
		{"IPv6 UDP DNATed to the old target port", dnat(flow(unix.IPPROTO_UDP, "fd00:96::20", 80, "fd00:244:2::3"), 8080), true},
	} {
		if got := m.MatchConntrackFlow(tt.f); got != tt.want {
			t.Errorf("%s: match %v, want %v", tt.name, got, tt.want)
		}
	}
	for _, bad := range []Filter{{}, {Protocol: "icmp"}} {
		if _, err := newMatcher([]Filter{bad}); err == nil {
			t.Errorf("filter %+v accepted", bad)
		}
	}
	if n, err := Delete(); n != 0 || err != nil {
		t.Errorf("Delete of no filters: %d, %v", n, err)
	}
}

// TestDeleteInNamespace creates UDP and TCP entries in a fresh namespace and
// deletes them selectively through netlink.
func TestDeleteInNamespace(t *testing.T) {
	roottest.Require(t)
	_, netns := roottest.NetNS(t, "podnet-ct")
	lo := netip.MustParseAddr("127.0.0.1")
	err := netns.Do(func(ns.NetNS) error {
		for _, c := range [][]string{{"ip", "link", "set", "lo", "up"}, {"iptables", "-A", "OUTPUT", "-m", "conntrack", "--ctstate", "NEW", "-j", "ACCEPT"}} {
			if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
				return fmt.Errorf("%v: %v: %s", c, err, out)
			}
		}
		for _, port := range []int{5301, 5302} {
			conn, err := net.Dial("udp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				return err
			}
			conn.Write([]byte("x"))
			conn.Close()
		}
		l, err := net.Listen("tcp", "127.0.0.1:5303")
		if err != nil {
			return err
		}
		defer l.Close()
		c, err := net.Dial("tcp", "127.0.0.1:5303")
		if err != nil {
			return err
		}
		defer c.Close()
		all := Filter{Protocol: "udp", OrigDst: lo}
		if n, err := Count(all); err != nil || n != 2 {
			return fmt.Errorf("UDP entries before delete: %d, %v; want 2", n, err)
		}
		if n, err := Count(Filter{Protocol: "tcp", Family: ipfamily.IPv4, OrigDstPort: 5303}); err != nil || n != 1 {
			return fmt.Errorf("TCP entries before delete: %d, %v; want 1", n, err)
		}
		n, err := Delete(Filter{Protocol: "udp", OrigDst: lo, OrigDstPort: 5301, ReplySrc: lo}, Filter{Protocol: "tcp", OrigDst: lo, OrigDstPort: 5303})
		if err != nil || n != 2 {
			return fmt.Errorf("deleted %d, %v; want 2", n, err)
		}
		if n, err := Count(all); err != nil || n != 1 {
			return fmt.Errorf("UDP entries after delete: %d, %v; want 1", n, err)
		}
		if n, err := Count(Filter{Protocol: "tcp", Family: ipfamily.IPv4, OrigDstPort: 5303}); err != nil || n != 0 {
			return fmt.Errorf("TCP entries after delete: %d, %v; want 0", n, err)
		}
		if n, err := Delete(Filter{Protocol: "udp", Family: ipfamily.IPv4, OrigDstPort: 5999}); err != nil || n != 0 {
			return fmt.Errorf("deleting nothing: %d, %v", n, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestFiltersSplitByFamily: each filter looks in its family's table (named,
// or the family of its addresses); one with neither is refused, named.
func TestFiltersSplitByFamily(t *testing.T) {
	v4 := Filter{Protocol: "udp", OrigDst: netip.MustParseAddr("10.96.0.10")}
	v6 := Filter{Protocol: "udp", ReplySrc: netip.MustParseAddr("fd00::5")}
	v6port := Filter{Protocol: "tcp", Family: ipfamily.IPv6, OrigDstPort: 30080}
	groups, fams, err := byFamily([]Filter{v6, v4, v6port})
	if err != nil {
		t.Fatal(err)
	}
	if len(fams) != 2 || fams[0] != ipfamily.IPv4 || fams[1] != ipfamily.IPv6 ||
		len(groups[0]) != 1 || groups[0][0] != v4 || len(groups[1]) != 2 || groups[1][1] != v6port {
		t.Errorf("byFamily = %v %v", fams, groups)
	}
	if _, err := Delete(Filter{Protocol: "tcp", OrigDstPort: 80}); err == nil || !strings.Contains(err.Error(), "tcp orig-port-dst 80: no address family") {
		t.Errorf("Delete of a filter without family: %v", err)
	}
}

// TestDeleteByReplyPortInNamespace DNATs UDP on loopback to another port, in
// both families, and deletes exactly the entries whose reply comes from the
// port that is gone.
func TestDeleteByReplyPortInNamespace(t *testing.T) {
	roottest.Require(t)
	_, netns := roottest.NetNS(t, "podnet-ctport")
	err := netns.Do(func(ns.NetNS) error {
		setup := [][]string{{"ip", "link", "set", "lo", "up"}}
		for _, c := range []struct{ tool, lo string }{{"iptables", "127.0.0.1"}, {"ip6tables", "::1"}} {
			// Port 5401 is DNATed to 5402 (the old target), 5411 to 5412.
			for _, p := range [][2]string{{"5401", "5402"}, {"5411", "5412"}} {
				to := net.JoinHostPort(c.lo, p[1]) // [::1]:5402 for IPv6
				setup = append(setup, []string{c.tool, "-t", "nat", "-A", "OUTPUT", "-p", "udp", "-d", c.lo, "--dport", p[0], "-j", "DNAT", "--to-destination", to})
			}
		}
		for _, c := range setup {
			if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
				return fmt.Errorf("%v: %v: %s", c, err, out)
			}
		}
		for _, lo := range []string{"127.0.0.1", "::1"} {
			for _, port := range []string{"5401", "5411"} {
				conn, err := net.Dial("udp", net.JoinHostPort(lo, port))
				if err != nil {
					return err
				}
				conn.Write([]byte("x"))
				conn.Close()
			}
		}
		// count counts f's entries in both families' tables.
		count := func(f Filter) int {
			total := 0
			for _, fam := range ipfamily.All {
				f.Family = fam
				n, err := Count(f)
				if err != nil {
					t.Errorf("count %s: %v", f, err)
				}
				total += n
			}
			return total
		}
		if n := count(Filter{Protocol: "udp", ReplySrcPort: 5402}); n != 2 {
			return fmt.Errorf("entries DNATed to port 5402 before delete: %d, want 2 (one a family)", n)
		}
		// The old target port of each family, one filter a family.
		var filters []Filter
		for _, lo := range []string{"127.0.0.1", "::1"} {
			a := netip.MustParseAddr(lo)
			filters = append(filters, Filter{Protocol: "udp", OrigDst: a, OrigDstPort: 5401, ReplySrc: a, ReplySrcPort: 5402})
		}
		if n, err := Delete(filters...); err != nil || n != 2 {
			return fmt.Errorf("deleted %d, %v; want 2", n, err)
		}
		if n := count(Filter{Protocol: "udp", ReplySrcPort: 5402}); n != 0 {
			return fmt.Errorf("entries DNATed to port 5402 after delete: %d, want 0", n)
		}
		if n := count(Filter{Protocol: "udp", ReplySrcPort: 5412}); n != 2 {
			return fmt.Errorf("entries DNATed to port 5412 after delete: %d, want 2 (untouched)", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
