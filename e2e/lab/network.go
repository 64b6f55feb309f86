package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// nsHandle is a netlink socket inside one namespace: links and addresses are
// configured from here without ever switching this process's namespace.
type nsHandle struct {
	name string
	ns   netns.NsHandle
	nl   *netlink.Handle
}

func openNS(name string) (*nsHandle, error) {
	h, err := netns.GetFromPath(netnsPath(name))
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", name, err)
	}
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("netlink in netns %s: %w", name, err)
	}
	return &nsHandle{name: name, ns: h, nl: nl}, nil
}

func (h *nsHandle) close() {
	h.nl.Close()
	h.ns.Close()
}

// buildNetwork creates the namespaces and wires them up.
func (l *Lab) buildNetwork(ctx context.Context) error {
	names := []string{l.Underlay, l.Router, l.Outside}
	for _, n := range l.Nodes {
		names = append(names, n.NS)
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, name := range names {
		g.Go(func() error { return createNetns(gctx, name) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	hs := map[string]*nsHandle{}
	defer func() {
		for _, h := range hs {
			h.close()
		}
	}()
	for _, name := range names {
		h, err := openNS(name)
		if err != nil {
			return err
		}
		hs[name] = h
		if err := h.up("lo"); err != nil {
			return err
		}
	}
	if err := l.buildRouter(hs[l.Underlay], hs[l.Router], hs[l.Outside]); err != nil {
		return err
	}
	for _, n := range l.Nodes {
		if err := l.plugNode(hs[l.Underlay], hs[n.NS], n); err != nil {
			return err
		}
	}
	return nil
}

// buildRouter makes the underlay's segment bridges, the router with a leg
// (the segment's gateway) on each, and the outside behind the router.
func (l *Lab) buildRouter(under, router, outside *nsHandle) error {
	for i, s := range l.Segments {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: s.Bridge, MTU: UnderlayMTU}}
		if err := under.nl.LinkAdd(br); err != nil {
			return fmt.Errorf("add bridge %s in %s: %w", s.Bridge, under.name, err)
		}
		if err := under.up(s.Bridge); err != nil {
			return err
		}
		leg := fmt.Sprintf("eth%d", i)
		if err := l.plug(under, fmt.Sprintf("rt%d", i), s.Bridge, router, leg); err != nil {
			return err
		}
		if err := router.addrUp(leg, netip.PrefixFrom(s.Gateway, s.Subnet.Bits())); err != nil {
			return err
		}
		if l.Has(ipfamily.IPv6) {
			sub6 := ula6(s.Subnet)
			if err := router.addrUp(leg, netip.PrefixFrom(hostIn(sub6, 1), 64)); err != nil {
				return err
			}
		}
	}
	if err := router.veth("out0", outside, "eth0"); err != nil {
		return err
	}
	if err := router.addrUp("out0", netip.PrefixFrom(outsideGW, OutsideNet.Bits())); err != nil {
		return err
	}
	if err := outside.addrUp("eth0", netip.PrefixFrom(outsideIP, OutsideNet.Bits())); err != nil {
		return err
	}
	if err := outside.defaultRoute(outsideGW); err != nil {
		return err
	}
	if l.Has(ipfamily.IPv6) {
		if err := l.routeOutside6(router, outside); err != nil {
			return err
		}
	}
	return sysctlIn(l.Router, "net/ipv4/ip_forward", "1")
}

// routeOutside6 gives the router and the outside their IPv6 link and
// turns on the router's IPv6 forwarding.
func (l *Lab) routeOutside6(router, outside *nsHandle) error {
	if err := router.addrUp("out0", netip.PrefixFrom(outsideGW6, OutsideNet6.Bits())); err != nil {
		return err
	}
	if err := outside.addrUp("eth0", netip.PrefixFrom(outsideIP6, OutsideNet6.Bits())); err != nil {
		return err
	}
	if err := outside.defaultRoute(outsideGW6); err != nil {
		return err
	}
	return sysctlIn(l.Router, "net/ipv6/conf/all/forwarding", "1")
}

// plugNode puts node n on its segment's bridge, with its address and its
// default route through the segment's gateway.
func (l *Lab) plugNode(under, node *nsHandle, n *Node) error {
	seg := l.segmentFor(n.Subnet)
	if err := l.plug(under, n.Name, seg.Bridge, node, n.Iface); err != nil {
		return err
	}
	if err := node.addrUp(n.Iface, netip.PrefixFrom(n.IP, n.Subnet.Bits())); err != nil {
		return err
	}
	if n.IP6.IsValid() {
		if err := node.addrUp(n.Iface, netip.PrefixFrom(n.IP6, n.Subnet6.Bits())); err != nil {
			return err
		}
		if err := node.defaultRoute(n.Gateway6); err != nil {
			return err
		}
	}
	return node.defaultRoute(n.Gateway)
}

// plug connects namespace peer to bridge in the underlay with a veth pair:
// underName on the bridge, peerName in peer.
func (l *Lab) plug(under *nsHandle, underName, bridge string, peer *nsHandle, peerName string) error {
	if err := under.veth(underName, peer, peerName); err != nil {
		return err
	}
	link, err := under.nl.LinkByName(underName)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", underName, under.name, err)
	}
	br, err := under.nl.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", bridge, under.name, err)
	}
	if err := under.nl.LinkSetMaster(link, br); err != nil {
		return fmt.Errorf("attach %s to %s in %s: %w", underName, bridge, under.name, err)
	}
	return under.up(underName)
}

// veth creates a veth pair: name here, peerName in peer.
func (h *nsHandle) veth(name string, peer *nsHandle, peerName string) error {
	v := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name, MTU: UnderlayMTU},
		PeerName:      peerName,
		PeerNamespace: netlink.NsFd(int(peer.ns)),
	}
	if err := h.nl.LinkAdd(v); err != nil {
		return fmt.Errorf("add veth %s (%s) / %s (%s): %w", name, h.name, peerName, peer.name, err)
	}
	return nil
}

func (h *nsHandle) up(name string) error {
	link, err := h.nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", name, h.name, err)
	}
	return h.setUp(link)
}

// setUp brings a lab link up with IPv6 duplicate address detection off:
// the lab stands in for a network that has been up for a while, where
// every link-local address finished DAD long ago. (podnet's own devices
// are not the lab's: they get no such help here.)
func (h *nsHandle) setUp(link netlink.Link) error {
	name := link.Attrs().Name
	if name != "lo" {
		if err := sysctlIn(h.name, "net/ipv6/conf/"+name+"/accept_dad", "0"); err != nil {
			return err
		}
	}
	if err := h.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up in %s: %w", name, h.name, err)
	}
	return nil
}

func (h *nsHandle) addrUp(name string, addr netip.Prefix) error {
	link, err := h.nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", name, h.name, err)
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), addr.Addr().BitLen())}}
	if addr.Addr().Is6() {
		// Usable at once: the lab's addresses are unique by construction.
		a.Flags = unix.IFA_F_NODAD
	}
	if err := h.nl.AddrAdd(link, a); err != nil {
		return fmt.Errorf("add %s to %s in %s: %w", addr, name, h.name, err)
	}
	return h.setUp(link)
}

func (h *nsHandle) defaultRoute(gw netip.Addr) error {
	r := &netlink.Route{Gw: gw.AsSlice()}
	if err := h.nl.RouteAdd(r); err != nil {
		return fmt.Errorf("add default route via %s in %s: %w", gw, h.name, err)
	}
	return nil
}

// sysctlIn writes a sysctl (path under /proc/sys) inside the named
// namespace; /proc/sys/net shows the namespace of the writing thread.
func sysctlIn(nsName, key, value string) error {
	return ns.WithNetNSPath(netnsPath(nsName), func(ns.NetNS) error {
		if err := os.WriteFile("/proc/sys/"+key, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s in %s: %w", key, value, nsName, err)
		}
		return nil
	})
}
