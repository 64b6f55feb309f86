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

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// NetlinkKernel is the real Kernel, in one network namespace: dumps and
// link changes through a netlink handle, routes, neighbour and FDB entries
// in batches through a socket of its own. Not safe for concurrent use.
type NetlinkKernel struct {
	h     *netlink.Handle
	batch *batchSocket
	// index caches link indexes by name. Every route, neighbour and FDB
	// entry names its device, and looking it up each time doubled the
	// netlink round trips of a sync (15,000 more for 5,000 VXLAN peers).
	// Changes that fail are tried again once with a fresh lookup, so a
	// link recreated behind our back costs one failed batch, not a wrong one.
	index map[string]int
	// family is the one whose routes, neighbours and device addresses
	// this kernel reads: a Table routes one family.
	family ipfamily.Family
}

// NewNetlinkKernel returns a Kernel for family f working in the network
// namespace ns (netns.None(): the caller's own). Close releases its
// sockets.
func NewNetlinkKernel(ns netns.NsHandle, f ipfamily.Family) (*NetlinkKernel, error) {
	if !f.Valid() {
		return nil, fmt.Errorf("netlink kernel: address family %v: want IPv4 or IPv6", f)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	b, err := newBatchSocket(ns)
	if err != nil {
		h.Close()
		return nil, err
	}
	return &NetlinkKernel{h: h, batch: b, index: make(map[string]int), family: f}, nil
}

// Close releases the kernel's netlink sockets.
func (k *NetlinkKernel) Close() {
	k.h.Close()
	k.batch.Close()
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

// indexOf is the index of the link name, cached.
func (k *NetlinkKernel) indexOf(name string) (int, error) {
	if i, ok := k.index[name]; ok {
		return i, nil
	}
	l, err := k.linkByName(name)
	if err != nil {
		return 0, err
	}
	if l == nil {
		return 0, fmt.Errorf("link %s: %w", name, netlink.LinkNotFoundError{})
	}
	return l.Attrs().Index, nil
}

// Write makes ops in batches. Ops that fail on a link whose index has
// changed since it was cached are made once more with the new index.
func (k *NetlinkKernel) Write(ops []Op) []error {
	errs := k.write(ops, nil)
	if errs == nil {
		return nil
	}
	var retry []int
	recheck := make(map[string]bool)
	for i, err := range errs {
		if err == nil {
			continue
		}
		dev := opDev(ops[i])
		if _, ok := recheck[dev]; !ok {
			old, cached := k.index[dev]
			delete(k.index, dev)
			now, lerr := k.indexOf(dev)
			recheck[dev] = cached && lerr == nil && now != old
		}
		if recheck[dev] {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		again := k.write(ops, retry)
		for i, o := range retry {
			errs[o] = nil
			if again != nil {
				errs[o] = again[i]
			}
		}
	}
	return errs
}

// write makes ops (only those at the indexes in only, when set) and
// returns their errors in the same order, nil when none failed.
func (k *NetlinkKernel) write(ops []Op, only []int) []error {
	if only == nil {
		only = make([]int, len(ops))
		for i := range only {
			only[i] = i
		}
	}
	var errs []error
	fail := func(i int, err error) {
		if errs == nil {
			errs = make([]error, len(only))
		}
		errs[i] = err
	}
	// Link indexes first: a missing link fails its own ops, unsent.
	send := make([]int, 0, len(only))
	idx := make([]int, len(only))
	for i, o := range only {
		op := ops[o]
		if op.Route == nil || !op.Delete { // a route is deleted by its destination
			var err error
			if idx[i], err = k.indexOf(opDev(op)); err != nil {
				fail(i, err)
				continue
			}
		}
		send = append(send, i)
	}
	berrs := k.batch.do(len(send), func(j int) request {
		i := send[j]
		op := ops[only[i]]
		switch {
		case op.Route != nil:
			return routeRequest(op.Route, idx[i], op.Delete)
		case op.Neigh != nil:
			return neighRequest(op.Neigh, idx[i], op.Delete)
		default:
			return fdbRequest(op.FDB, idx[i], op.Delete)
		}
	})
	for j, err := range berrs {
		if err != nil {
			fail(send[j], err)
		}
	}
	return errs
}

// opDev is the link an op's entry is on.
func opDev(o Op) string {
	switch {
	case o.Route != nil:
		return o.Route.Dev
	case o.Neigh != nil:
		return o.Neigh.Dev
	default:
		return o.FDB.Dev
	}
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
	addrs, err := k.h.AddrList(l, k.family.AF())
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

// ErrVXLANTaken says another device holds the VXLAN network identifier and
// UDP port podnet's device needs: the kernel allows one device per pair.
var ErrVXLANTaken = errors.New("the VXLAN VNI and port are taken")

// vxlanHolding names the VXLAN device other than name holding vni on port
// ("" if none): what the kernel's EEXIST for a new device was about.
func (k *NetlinkKernel) vxlanHolding(name string, vni, port int) string {
	links, err := k.h.LinkList()
	if err != nil {
		return ""
	}
	for _, l := range links {
		v, ok := l.(*netlink.Vxlan)
		// A port of 0 is the kernel's default, the IANA port 4789.
		if ok && v.Name != name && v.VxlanId == vni && (v.Port == port || v.Port == 0 && port == 4789) {
			return v.Name
		}
	}
	return ""
}

// CreateVXLAN creates the device up, with its MTU and MAC, in one
// request (a netlink event per attribute set afterwards would each look
// like a change made by someone else), then gives it its address.
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
	if d.Up {
		v.Flags = net.FlagUp
	}
	delete(k.index, d.Name)
	if err := k.h.LinkAdd(v); err != nil {
		if other := k.vxlanHolding(d.Name, d.VNI, d.Port); other != "" {
			return fmt.Errorf("%w: %s already holds VNI %d on UDP port %d (another network's device, such as flannel's flannel.1): remove it, or move podnet's with --vxlan-vni or --vxlan-port: %v",
				ErrVXLANTaken, other, d.VNI, d.Port, err)
		}
		return err
	}
	if !d.Addr.IsValid() {
		return nil
	}
	ipn := &net.IPNet{IP: d.Addr.Addr().AsSlice(), Mask: net.CIDRMask(d.Addr.Bits(), d.Addr.Addr().BitLen())}
	if err := k.h.AddrAdd(v, vxlanAddr(ipn)); err != nil {
		return fmt.Errorf("add address %s: %w", d.Addr, err)
	}
	return nil
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
	addrs, err := k.h.AddrList(l, k.family.AF())
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
		ipn := &net.IPNet{IP: d.Addr.Addr().AsSlice(), Mask: net.CIDRMask(d.Addr.Bits(), d.Addr.Addr().BitLen())}
		if err := k.h.AddrAdd(l, vxlanAddr(ipn)); err != nil {
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
	rs, err := k.h.RouteListFiltered(k.family.AF(),
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

func (k *NetlinkKernel) Neighs(dev string) ([]Neigh, error) {
	l, err := k.linkByName(dev)
	if err != nil || l == nil {
		return nil, err
	}
	ns, err := k.h.NeighList(l.Attrs().Index, k.family.AF())
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

// EventKind says what an Event is about.
type EventKind int

const (
	// EventLost: the subscription overflowed and events were lost.
	EventLost EventKind = iota
	EventRoute
	EventNeigh
	EventFDB
	EventLink
)

// Event is one change the kernel reported to a route tagged with
// Protocol, to a neighbour or FDB entry of the VXLAN device, or to a link.
// Table.Matches tells podnet's own changes from the rest.
type Event struct {
	Kind    EventKind
	Deleted bool
	Route   Route // EventRoute, Dev named
	Neigh   Neigh // EventNeigh
	// Permanent says the neighbour entry is static (as podnet's are).
	Permanent bool
	FDB       FDB // EventFDB
	// Link names the link of an EventLink; Up is its state, New says it
	// was just made (and may not be up yet), and Device, for a VXLAN
	// link, is what its message says of it (no parent, no address).
	Link   string
	Up     bool
	New    bool
	Device *VXLANDevice
}

// Watch calls onEvent for every change the kernel reports to podnet's
// routes, to the neighbour and FDB entries of device and to links, until
// ctx ends; ns is the namespace to watch (netns.None() for the caller's
// own). onEvent runs on Watch's goroutine and must not block. live, if not
// nil, is called once, on that goroutine, when the subscriptions are in
// place: every change made after it returns is reported.
func Watch(ctx context.Context, ns netns.NsHandle, device string, onEvent func(Event), live func()) error {
	done := make(chan struct{})
	defer close(done)
	// An overflowed socket loses events; a sync catches up on all of them.
	lost := make(chan struct{}, 1)
	routes, neighs, links, err := subscribe(ns, done, func(error) {
		select {
		case lost <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("open netlink: %w", err)
	}
	defer h.Close()
	names := newLinkNames(h)
	if live != nil {
		live()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-lost:
			onEvent(Event{Kind: EventLost})
		case u, ok := <-routes:
			if !ok {
				return errors.New("route subscription closed")
			}
			if e, ok := routeEvent(u, names.name); ok {
				onEvent(e)
			}
		case u, ok := <-neighs:
			if !ok {
				return errors.New("neighbour subscription closed")
			}
			// Ordinary ARP churns on every other interface; only the
			// device's entries (neighbours and FDB) are podnet's.
			if names.name(u.LinkIndex) == device {
				if e, ok := neighEvent(u, device); ok {
					onEvent(e)
				}
			}
		case u, ok := <-links:
			if !ok {
				return errors.New("link subscription closed")
			}
			e := linkEvent(u)
			names.follow(u.Attrs().Index, e)
			onEvent(e)
		}
	}
}

// linkNames names links by index, to name a route's device and to tell
// the device's neighbour events from the rest; the link subscription keeps
// it current (follow), and an index met before its link's event is looked
// up.
type linkNames struct {
	h     *netlink.Handle
	names map[int]string
}

func newLinkNames(h *netlink.Handle) *linkNames {
	n := &linkNames{h: h, names: make(map[int]string)}
	if ls, err := h.LinkList(); err == nil {
		for _, l := range ls {
			n.names[l.Attrs().Index] = l.Attrs().Name
		}
	}
	return n
}

func (n *linkNames) name(index int) string {
	if name, ok := n.names[index]; ok {
		return name
	}
	if l, err := n.h.LinkByIndex(index); err == nil {
		n.names[index] = l.Attrs().Name
		return l.Attrs().Name
	}
	return ""
}

// follow records the link event e of the link at index.
func (n *linkNames) follow(index int, e Event) {
	if e.Deleted {
		delete(n.names, index)
	} else {
		n.names[index] = e.Link
	}
}

func linkEvent(u netlink.LinkUpdate) Event {
	a := u.Attrs()
	e := Event{Kind: EventLink, Deleted: u.Header.Type == syscall.RTM_DELLINK, Link: a.Name, Up: a.Flags&net.FlagUp != 0,
		// A link being registered is announced with every flag as
		// changed, before it is set up.
		New: u.Change == ^uint32(0)}
	if v, ok := u.Link.(*netlink.Vxlan); ok {
		e.Device = &VXLANDevice{Name: a.Name, VNI: v.VxlanId, Port: v.Port, MAC: a.HardwareAddr, MTU: a.MTU, Learning: v.Learning, Up: e.Up}
	}
	return e
}

func routeEvent(u netlink.RouteUpdate, name func(int) string) (Event, bool) {
	if u.Protocol != Protocol || u.Table != unix.RT_TABLE_MAIN || u.Dst == nil {
		return Event{}, false
	}
	dst, _ := netip.AddrFromSlice(u.Dst.IP)
	ones, _ := u.Dst.Mask.Size()
	gw, _ := netip.AddrFromSlice(u.Gw)
	r := Route{Dst: netip.PrefixFrom(dst.Unmap(), ones), Gw: gw.Unmap(), Dev: name(u.LinkIndex), Onlink: u.Flags&int(netlink.FLAG_ONLINK) != 0}
	return Event{Kind: EventRoute, Deleted: u.Type == syscall.RTM_DELROUTE, Route: r}, true
}

func neighEvent(u netlink.NeighUpdate, device string) (Event, bool) {
	ip, _ := netip.AddrFromSlice(u.IP)
	e := Event{Deleted: u.Type == syscall.RTM_DELNEIGH}
	if u.Family == unix.AF_BRIDGE {
		if len(u.IP) == 0 {
			return Event{}, false // not one of podnet's: they all have a destination
		}
		e.Kind, e.FDB = EventFDB, FDB{Dev: device, MAC: u.HardwareAddr, Dst: ip.Unmap()}
		return e, true
	}
	e.Kind, e.Permanent = EventNeigh, u.State&netlink.NUD_PERMANENT != 0
	e.Neigh = Neigh{Dev: device, IP: ip.Unmap(), MAC: u.HardwareAddr}
	return e, true
}

// watchBuffer is the receive buffer of the route and neighbour
// subscriptions. The first sync of a node among 5,000 VXLAN peers echoes
// 15,000 events within a fraction of a second, which overflowed the
// default (~200 KiB) and so asked for a full sync of their own.
const watchBuffer = 16 << 20

// subscribe subscribes to the route, neighbour and link events of ns
// until done closes.
func subscribe(ns netns.NsHandle, done chan struct{}, errFn func(error)) (chan netlink.RouteUpdate, chan netlink.NeighUpdate, chan netlink.LinkUpdate, error) {
	routes := make(chan netlink.RouteUpdate, 1024)
	neighs := make(chan netlink.NeighUpdate, 1024)
	links := make(chan netlink.LinkUpdate, 16)
	if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{Namespace: &ns, ErrorCallback: errFn,
		ReceiveBufferSize: watchBuffer, ReceiveBufferForceSize: true}); err != nil {
		return nil, nil, nil, fmt.Errorf("subscribe to routes: %w", err)
	}
	if err := netlink.NeighSubscribeWithOptions(neighs, done, netlink.NeighSubscribeOptions{Namespace: &ns, ErrorCallback: errFn,
		ReceiveBufferSize: watchBuffer, ReceiveBufferForceSize: true}); err != nil {
		return nil, nil, nil, fmt.Errorf("subscribe to neighbours: %w", err)
	}
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{Namespace: &ns, ErrorCallback: errFn}); err != nil {
		return nil, nil, nil, fmt.Errorf("subscribe to links: %w", err)
	}
	return routes, neighs, links, nil
}

// vxlanAddr is the VXLAN device's address; an IPv6 one skips duplicate
// address detection (it is the node's own, from its podCIDR), so that the
// node's traffic to other nodes' pods can use it as its source at once.
func vxlanAddr(ipn *net.IPNet) *netlink.Addr {
	a := &netlink.Addr{IPNet: ipn}
	if ipn.IP.To4() == nil {
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}
