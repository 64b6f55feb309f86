package link

import (
	"net/netip"

	"github.com/vishvananda/netlink"
)

// Interface is one of the node's interfaces with its addresses, of both
// families.
type Interface struct {
	Name  string
	MTU   int
	Addrs []netip.Prefix
}

// Interfaces lists the interfaces of the calling thread's network namespace
// and their addresses; an interface whose addresses cannot be read is
// listed without them.
func Interfaces() ([]Interface, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	out := make([]Interface, 0, len(links))
	for _, l := range links {
		ifc := Interface{Name: l.Attrs().Name, MTU: l.Attrs().MTU}
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_ALL)
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok {
				continue
			}
			ones, _ := a.Mask.Size()
			ifc.Addrs = append(ifc.Addrs, netip.PrefixFrom(ip.Unmap(), ones))
		}
		out = append(out, ifc)
	}
	return out, nil
}

// Holding returns the interface of ifcs holding ip (only the one named
// iface, when set) and the prefix ip has there: the one answer to "which
// interface holds the node's address" for the node network (its underlay)
// and the Service proxy (its uplink).
func Holding(ifcs []Interface, iface string, ip netip.Addr) (Interface, netip.Prefix, bool) {
	if !ip.IsValid() {
		return Interface{}, netip.Prefix{}, false
	}
	for _, ifc := range ifcs {
		if iface != "" && ifc.Name != iface {
			continue
		}
		for _, a := range ifc.Addrs {
			if a.Addr() == ip {
				return ifc, a, true
			}
		}
	}
	return Interface{}, netip.Prefix{}, false
}
