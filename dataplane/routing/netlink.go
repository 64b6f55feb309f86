package routing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetlinkKernel is the real Kernel, over one netlink handle (which names
// the network namespace it works in). Not safe for concurrent use.
type NetlinkKernel struct {
	h *netlink.Handle
	// index caches link indexes by name. Every route, neighbour and FDB
	// entry names its device, and looking it up each time doubled the
	// netlink round trips of a sync (15,000 more for 5,000 VXLAN peers).
	// A change that fails is retried once with a fresh lookup, so a link
	// recreated behind our back costs one failed call, not a wrong one.
	index map[string]int
}

// NewNetlinkKernel returns a Kernel working through h.
func NewNetlinkKernel(h *netlink.Handle) *NetlinkKernel {
	return &NetlinkKernel{h: h, index: make(map[string]int)}
}

func (k *NetlinkKernel) linkByName(name string) (netlink.Link, error) {
	l, err := k.h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		delete(k.index, name)
		return nil, nil
	}
	if err == nil {
		k.index[name] = l.Attrs().Index
	}
	return l, err
}

// withIndex calls f with the index of the link name, looked up afresh and
// tried again when f fails with a cached one.
func (k *NetlinkKernel) withIndex(name string, f func(index int) error) error {
	if i, ok := k.index[name]; ok {
		err := f(i)
		if err == nil {
			return nil
		}
		delete(k.index, name)
		if l, lerr := k.linkByName(name); lerr != nil || l == nil || l.Attrs().Index == i {
			return err
		}
	}
	l, err := k.linkByName(name)
	if err != nil {
		return err
	}
	if l == nil {
		return fmt.Errorf("link %s: %w", name, netlink.LinkNotFoundError{})
	}
	return f(l.Attrs().Index)
}

func (k *NetlinkKernel) VXLAN(name string) (*VXLANDevice, error) {
	l, err := k.linkByName(name)
	if err != nil || l == nil {
		return nil, err
	}
	a := l.Attrs()
	d := &VXLANDevice{Name: name, MAC: a.HardwareAddr, MTU: a.MTU, Up: a.Flags&net.FlagUp != 0}
	if v, ok := l.(*netlink.Vxlan); ok {
		d.VNI, d.Port, d.Learning = v.VxlanId, v.Port, v.Learning
		if ip, ok := netip.AddrFromSlice(v.SrcAddr); ok {
			d.Local = ip.Unmap()
		}
		if v.VtepDevIndex != 0 {
			if p, err := k.h.LinkByIndex(v.VtepDevIndex); err == nil {
				d.Parent = p.Attrs().Name
			}
		}
	}
	addrs, err := k.h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list addresses of %s: %w", name, err)
	}
	if len(addrs) > 0 {
		ip, _ := netip.AddrFromSlice(addrs[0].IP)
		ones, _ := addrs[0].Mask.Size()
		d.Addr = netip.PrefixFrom(ip.Unmap(), ones)
	}
	return d, nil
}

func (k *NetlinkKernel) CreateVXLAN(d VXLANDevice) error {
	parent, err := k.h.LinkByName(d.Parent)
	if err != nil {
		return fmt.Errorf("find parent %s: %w", d.Parent, err)
	}
	v := &netlink.Vxlan{
		LinkAttrs:    netlink.LinkAttrs{Name: d.Name, MTU: d.MTU, HardwareAddr: d.MAC},
		VxlanId:      d.VNI,
		VtepDevIndex: parent.Attrs().Index,
		SrcAddr:      d.Local.AsSlice(),
		Port:         d.Port,
		Learning:     d.Learning,
	}
	delete(k.index, d.Name)
	if err := k.h.LinkAdd(v); err != nil {
		return err
	}
	return k.UpdateVXLAN(d)
}

func (k *NetlinkKernel) UpdateVXLAN(d VXLANDevice) error {
	l, err := k.h.LinkByName(d.Name)
	if err != nil {
		return err
	}
	a := l.Attrs()
	if a.MTU != d.MTU {
		if err := k.h.LinkSetMTU(l, d.MTU); err != nil {
			return fmt.Errorf("set mtu: %w", err)
		}
	}
	if !bytes.Equal(a.HardwareAddr, d.MAC) {
		if err := k.h.LinkSetHardwareAddr(l, d.MAC); err != nil {
			return fmt.Errorf("set mac: %w", err)
		}
	}
	addrs, err := k.h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	found := false
	for _, ad := range addrs {
		ip, _ := netip.AddrFromSlice(ad.IP)
		ones, _ := ad.Mask.Size()
		if d.Addr.IsValid() && netip.PrefixFrom(ip.Unmap(), ones) == d.Addr {
			found = true
			continue
		}
		if err := k.h.AddrDel(l, &ad); err != nil {
			return fmt.Errorf("delete address %s: %w", ad.IPNet, err)
		}
	}
	if d.Addr.IsValid() && !found {
		ipn := &net.IPNet{IP: d.Addr.Addr().AsSlice(), Mask: net.CIDRMask(d.Addr.Bits(), 32)}
		if err := k.h.AddrAdd(l, &netlink.Addr{IPNet: ipn}); err != nil {
			return fmt.Errorf("add address %s: %w", d.Addr, err)
		}
	}
	if d.Up {
		return k.h.LinkSetUp(l)
	}
	return k.h.LinkSetDown(l)
}

func (k *NetlinkKernel) DeleteLink(name string) error {
	delete(k.index, name)
	l, err := k.h.LinkByName(name)
	if err != nil {
		return err
	}
	return k.h.LinkDel(l)
}

func (k *NetlinkKernel) Routes() ([]Route, error) {
	rs, err := k.h.RouteListFiltered(netlink.FAMILY_V4,
		&netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: Protocol},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, err
	}
	// Thousands of routes go through one or two links: name each once.
	names := make(map[int]string)
	out := make([]Route, 0, len(rs))
	for _, r := range rs {
		if r.Dst == nil {
			continue
		}
		dst, _ := netip.AddrFromSlice(r.Dst.IP)
		ones, _ := r.Dst.Mask.Size()
		gw, _ := netip.AddrFromSlice(r.Gw)
		rt := Route{Dst: netip.PrefixFrom(dst.Unmap(), ones), Gw: gw.Unmap(), Onlink: r.Flags&int(netlink.FLAG_ONLINK) != 0}
		name, ok := names[r.LinkIndex]
		if !ok {
			if l, err := k.h.LinkByIndex(r.LinkIndex); err == nil {
				name = l.Attrs().Name
			}
			names[r.LinkIndex] = name
		}
		rt.Dev = name
		out = append(out, rt)
	}
	return out, nil
}

func (k *NetlinkKernel) route(r Route, index int) *netlink.Route {
	nr := &netlink.Route{
		LinkIndex: index,
		Dst:       &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), 32)},
		Gw:        r.Gw.AsSlice(),
		Protocol:  Protocol,
		Table:     unix.RT_TABLE_MAIN,
	}
	if r.Onlink {
		nr.Flags = int(netlink.FLAG_ONLINK)
	}
	return nr
}

func (k *NetlinkKernel) ReplaceRoute(r Route) error {
	return k.withIndex(r.Dev, func(index int) error { return k.h.RouteReplace(k.route(r, index)) })
}

func (k *NetlinkKernel) DeleteRoute(r Route) error {
	dst := &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), 32)}
	return k.h.RouteDel(&netlink.Route{Dst: dst, Protocol: Protocol, Table: unix.RT_TABLE_MAIN})
}

func (k *NetlinkKernel) Neighs(dev string) ([]Neigh, error) {
	l, err := k.linkByName(dev)
	if err != nil || l == nil {
		return nil, err
	}
	ns, err := k.h.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	var out []Neigh
	for _, n := range ns {
		if n.State&netlink.NUD_PERMANENT == 0 {
			continue
		}
		ip, _ := netip.AddrFromSlice(n.IP)
		out = append(out, Neigh{Dev: dev, IP: ip.Unmap(), MAC: n.HardwareAddr})
	}
	return out, nil
}

func (k *NetlinkKernel) SetNeigh(n Neigh) error {
	return k.withIndex(n.Dev, func(index int) error {
		return k.h.NeighSet(&netlink.Neigh{
			LinkIndex: index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: n.IP.AsSlice(), HardwareAddr: n.MAC,
		})
	})
}

func (k *NetlinkKernel) DeleteNeigh(n Neigh) error {
	return k.withIndex(n.Dev, func(index int) error {
		return k.h.NeighDel(&netlink.Neigh{LinkIndex: index, Family: netlink.FAMILY_V4, IP: n.IP.AsSlice()})
	})
}

func (k *NetlinkKernel) FDB(dev string) ([]FDB, error) {
	l, err := k.linkByName(dev)
	if err != nil || l == nil {
		return nil, err
	}
	ns, err := k.h.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		return nil, err
	}
	var out []FDB
	for _, n := range ns {
		if n.LinkIndex != l.Attrs().Index || len(n.IP) == 0 {
			continue
		}
		ip, _ := netip.AddrFromSlice(n.IP)
		out = append(out, FDB{Dev: dev, MAC: n.HardwareAddr, Dst: ip.Unmap()})
	}
	return out, nil
}

func fdbNeigh(f FDB, index int) *netlink.Neigh {
	return &netlink.Neigh{
		LinkIndex: index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
		Flags: netlink.NTF_SELF, IP: f.Dst.AsSlice(), HardwareAddr: f.MAC,
	}
}

func (k *NetlinkKernel) SetFDB(f FDB) error {
	return k.withIndex(f.Dev, func(index int) error { return k.h.NeighSet(fdbNeigh(f, index)) })
}

func (k *NetlinkKernel) DeleteFDB(f FDB) error {
	return k.withIndex(f.Dev, func(index int) error { return k.h.NeighDel(fdbNeigh(f, index)) })
}

// Watch sends on changed (without blocking) whenever the kernel reports a
// change to a route, neighbour or link that may be podnet's, so that what
// someone else removed comes back before the next periodic sync. It runs
// until ctx ends; ns is the namespace to watch (netns.None() for the
// caller's own).
func Watch(ctx context.Context, ns netns.NsHandle, device string, changed chan<- struct{}) error {
	done := make(chan struct{})
	defer close(done)
	routes, neighs, links, err := subscribe(ns, done, func(error) {
		// An overflowed socket loses events; a sync catches up on all of them.
		notify(changed)
	})
	if err != nil {
		return err
	}
	// The device's index, to tell its neighbour events from the rest; the
	// link subscription keeps it current as the device comes and goes.
	devIndex := 0
	if h, err := netlink.NewHandleAt(ns); err == nil {
		if l, err := h.LinkByName(device); err == nil {
			devIndex = l.Attrs().Index
		}
		h.Close()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case u, ok := <-routes:
			if !ok {
				return errors.New("route subscription closed")
			}
			if u.Protocol == Protocol || u.Type == syscall.RTM_DELROUTE && u.Table == unix.RT_TABLE_MAIN {
				notify(changed)
			}
		case u, ok := <-neighs:
			if !ok {
				return errors.New("neighbour subscription closed")
			}
			// Ordinary ARP churns on every other interface; only the
			// device's entries (neighbours and FDB) are podnet's.
			if devIndex != 0 && u.LinkIndex == devIndex {
				notify(changed)
			}
		case u, ok := <-links:
			if !ok {
				return errors.New("link subscription closed")
			}
			if u.Attrs().Name == device {
				devIndex = u.Attrs().Index
				if u.Header.Type == syscall.RTM_DELLINK {
					devIndex = 0
				}
				notify(changed)
			} else if u.Header.Type == syscall.RTM_DELLINK {
				notify(changed)
			}
		}
	}
}

// subscribe subscribes to the route, neighbour and link events of ns
// until done closes.
func subscribe(ns netns.NsHandle, done chan struct{}, errFn func(error)) (chan netlink.RouteUpdate, chan netlink.NeighUpdate, chan netlink.LinkUpdate, error) {
	routes := make(chan netlink.RouteUpdate, 64)
	neighs := make(chan netlink.NeighUpdate, 64)
	links := make(chan netlink.LinkUpdate, 16)
	if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{Namespace: &ns, ErrorCallback: errFn}); err != nil {
		return nil, nil, nil, fmt.Errorf("subscribe to routes: %w", err)
	}
	if err := netlink.NeighSubscribeWithOptions(neighs, done, netlink.NeighSubscribeOptions{Namespace: &ns, ErrorCallback: errFn}); err != nil {
		return nil, nil, nil, fmt.Errorf("subscribe to neighbours: %w", err)
	}
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{Namespace: &ns, ErrorCallback: errFn}); err != nil {
		return nil, nil, nil, fmt.Errorf("subscribe to links: %w", err)
	}
	return routes, neighs, links, nil
}

func notify(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
