package routing

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Kernel is the part of netlink the Reconciler uses. The real one is
// NewNetlinkKernel; tests use NewFakeKernel, which fails like the kernel.
type Kernel interface {
	// VXLAN returns the named link as the kernel holds it, or nil when
	// there is none. A link that is not VXLAN comes back with VNI 0.
	VXLAN(name string) (*VXLANDevice, error)
	// CreateVXLAN creates the device as d says, up when d.Up.
	CreateVXLAN(d VXLANDevice) error
	// UpdateVXLAN sets MTU, MAC, address and up state in place.
	UpdateVXLAN(d VXLANDevice) error
	DeleteLink(name string) error
	// Routes lists the main table's routes tagged with Protocol.
	Routes() ([]Route, error)
	// Neighs lists the permanent IPv4 neighbour entries of dev.
	Neighs(dev string) ([]Neigh, error)
	// FDB lists the forwarding entries of dev that have a destination.
	FDB(dev string) ([]FDB, error)
	// Write makes the changes in order, going on after one fails, and
	// returns the error of each that failed at its index (nil: none did).
	Write(ops []Op) []error
}

// Op is one change to a route, neighbour or FDB entry: exactly one of
// Route, Neigh and FDB is set. Without Delete it adds or replaces.
type Op struct {
	Delete bool
	Route  *Route
	Neigh  *Neigh
	FDB    *FDB
}

func (o Op) String() string {
	switch {
	case o.Route != nil && o.Delete:
		return "delete route " + o.Route.String()
	case o.Route != nil:
		return "replace route " + o.Route.String()
	case o.Neigh != nil && o.Delete:
		return "delete neigh " + o.Neigh.String()
	case o.Neigh != nil:
		return "set neigh " + o.Neigh.String()
	case o.FDB != nil && o.Delete:
		return "delete fdb " + o.FDB.String()
	default:
		return "add fdb " + o.FDB.String()
	}
}

// Reconciler makes the kernel hold a Plan.
type Reconciler struct {
	Kernel Kernel
	// Device is the VXLAN device name to remove when a plan has none.
	Device string
	// SharedFDB, when set, reports FDB entries another plan on the same
	// device wants (the other family's, on a dual-stack node): this
	// reconciler never deletes those.
	SharedFDB func(FDB) bool
}

// keepFDB drops from fs the entries another plan wants.
func (r *Reconciler) keepFDB(fs []FDB) []FDB {
	if r.SharedFDB == nil {
		return fs
	}
	var out []FDB
	for _, f := range fs {
		if !r.SharedFDB(f) {
			out = append(out, f)
		}
	}
	return out
}

// Patch makes the changes of d (a Table's answer to one Node change) and
// nothing else, reading nothing back: one Node among 5,000 costs its own
// few entries, written in one batch. It trusts that the kernel held the
// plan d starts from; after an error, or when netlink reports a change
// that is not podnet's, it is for Apply to compare with the kernel.
func (r *Reconciler) Patch(d Delta) ([]string, error) {
	ops := make([]Op, 0, len(d.Set.Routes)+len(d.Set.Neighs)+len(d.Set.FDB)+len(d.Delete.Routes)+len(d.Delete.Neighs)+len(d.Delete.FDB))
	// Forwarding state before the routes that need it; removals after,
	// in the reverse order.
	for i := range d.Set.FDB {
		ops = append(ops, Op{FDB: &d.Set.FDB[i]})
	}
	for i := range d.Set.Neighs {
		ops = append(ops, Op{Neigh: &d.Set.Neighs[i]})
	}
	for i := range d.Set.Routes {
		ops = append(ops, Op{Route: &d.Set.Routes[i]})
	}
	for i := range d.Delete.Routes {
		ops = append(ops, Op{Delete: true, Route: &d.Delete.Routes[i]})
	}
	for i := range d.Delete.Neighs {
		ops = append(ops, Op{Delete: true, Neigh: &d.Delete.Neighs[i]})
	}
	dels := r.keepFDB(d.Delete.FDB)
	for i := range dels {
		ops = append(ops, Op{Delete: true, FDB: &dels[i]})
	}
	var c changeLog
	c.write(r.Kernel, ops)
	return c.changes, errors.Join(c.errs...)
}

// changeLog collects what a reconciliation changed and the errors it met.
type changeLog struct {
	changes []string
	errs    []error
}

// do records one change, or its error.
func (c *changeLog) do(what string, err error) {
	if err != nil {
		c.errs = append(c.errs, fmt.Errorf("%s: %w", what, err))
		return
	}
	c.changes = append(c.changes, what)
}

// write makes ops and records each.
func (c *changeLog) write(k Kernel, ops []Op) {
	if len(ops) == 0 {
		return
	}
	errs := k.Write(ops)
	if c.changes == nil {
		c.changes = make([]string, 0, len(ops))
	}
	for i, op := range ops {
		var err error
		if errs != nil {
			err = errs[i]
		}
		c.do(op.String(), err)
	}
}

// fdbKey identifies an FDB entry without formatting or allocating: the
// MAC of a VXLAN FDB entry is an Ethernet address.
type fdbKey struct {
	mac [6]byte
	dst netip.Addr
}

func keyOf(f FDB) fdbKey {
	k := fdbKey{dst: f.Dst}
	copy(k.mac[:], f.MAC)
	return k
}

func fdbSet(fs []FDB) map[fdbKey]bool {
	m := make(map[fdbKey]bool, len(fs))
	for _, f := range fs {
		m[keyOf(f)] = true
	}
	return m
}

func neighByIP(ns []Neigh) map[netip.Addr]Neigh {
	m := make(map[netip.Addr]Neigh, len(ns))
	for _, n := range ns {
		m[n.IP] = n
	}
	return m
}

func routeByDst(rs []Route) map[netip.Prefix]Route {
	m := make(map[netip.Prefix]Route, len(rs))
	for _, r := range rs {
		m[r.Dst] = r
	}
	return m
}

// Apply changes the kernel to hold p, touching only what differs. It
// returns what it changed (for logs and tests) and every error it met; it
// keeps going after an error so one bad entry does not block the rest.
func (r *Reconciler) Apply(p Plan) ([]string, error) {
	var c changeLog
	do := c.do

	devName := r.Device
	if p.Device != nil {
		devName = p.Device.Name
	}
	have, err := r.Kernel.VXLAN(devName)
	if err != nil {
		return nil, fmt.Errorf("read link %s: %w", devName, err)
	}

	devReady := false
	switch want := p.Device; {
	case want == nil:
		if have != nil {
			do("delete link "+devName, r.Kernel.DeleteLink(devName))
		}
	case have == nil:
		err := r.Kernel.CreateVXLAN(*want)
		do("create link "+want.String(), err)
		devReady = err == nil
	case !sameIdentity(*have, *want):
		// VNI, port, source or parent cannot change on a live device.
		if err := r.Kernel.DeleteLink(devName); err != nil {
			do("delete link "+devName, err)
			break
		}
		err := r.Kernel.CreateVXLAN(*want)
		do("recreate link "+want.String(), err)
		devReady = err == nil
	case have.MTU != want.MTU || !bytes.Equal(have.MAC, want.MAC) || have.Addr != want.Addr || have.Up != want.Up:
		err := r.Kernel.UpdateVXLAN(*want)
		do("update link "+want.String(), err)
		devReady = err == nil
	default:
		devReady = true
	}

	// Forwarding state first, so a route never points at an unresolvable
	// next hop; removals after, in the reverse order. What the kernel
	// holds is read first, then every change goes in one Write.
	var sets, dels []Op
	if p.Device != nil && devReady {
		s, d := r.diffFDB(p, &c)
		sets, dels = append(sets, s...), append(dels, d...)
		s, d = r.diffNeighs(p, &c)
		sets, dels = append(sets, s...), append(dels, d...)
	}
	s, d := r.diffRoutes(p, &c)
	sets = append(sets, s...)
	slices.Reverse(dels)
	dels = append(d, dels...)
	c.write(r.Kernel, append(sets, dels...))
	return c.changes, errors.Join(c.errs...)
}

func sameIdentity(a, b VXLANDevice) bool {
	return a.VNI == b.VNI && a.Port == b.Port && a.Local == b.Local && a.Parent == b.Parent && a.Learning == b.Learning
}

func (r *Reconciler) diffFDB(p Plan, c *changeLog) (sets, dels []Op) {
	have, err := r.Kernel.FDB(p.Device.Name)
	if err != nil {
		c.errs = append(c.errs, fmt.Errorf("list fdb: %w", err))
		return nil, nil
	}
	haveSet, wantSet := fdbSet(have), fdbSet(p.FDB)
	for i, f := range p.FDB {
		if !haveSet[keyOf(f)] {
			sets = append(sets, Op{FDB: &p.FDB[i]})
		}
	}
	for i, f := range have {
		if !wantSet[keyOf(f)] && (r.SharedFDB == nil || !r.SharedFDB(f)) {
			dels = append(dels, Op{Delete: true, FDB: &have[i]})
		}
	}
	return sets, dels
}

func (r *Reconciler) diffNeighs(p Plan, c *changeLog) (sets, dels []Op) {
	have, err := r.Kernel.Neighs(p.Device.Name)
	if err != nil {
		c.errs = append(c.errs, fmt.Errorf("list neighbours: %w", err))
		return nil, nil
	}
	haveByIP, want := neighByIP(have), neighByIP(p.Neighs)
	for i, n := range p.Neighs {
		if h, ok := haveByIP[n.IP]; !ok || !bytes.Equal(h.MAC, n.MAC) {
			sets = append(sets, Op{Neigh: &p.Neighs[i]})
		}
	}
	for i, n := range have {
		if _, ok := want[n.IP]; !ok {
			dels = append(dels, Op{Delete: true, Neigh: &have[i]})
		}
	}
	return sets, dels
}

func (r *Reconciler) diffRoutes(p Plan, c *changeLog) (sets, dels []Op) {
	have, err := r.Kernel.Routes()
	if err != nil {
		c.errs = append(c.errs, fmt.Errorf("list routes: %w", err))
		return nil, nil
	}
	haveByDst, want := routeByDst(have), routeByDst(p.Routes)
	for i, rt := range p.Routes {
		h, ok := haveByDst[rt.Dst]
		if ok && h == rt {
			continue
		}
		if ok && movesDevice(h, rt) {
			sets = append(sets, Op{Delete: true, Route: &h})
		}
		sets = append(sets, Op{Route: &p.Routes[i]})
	}
	for i, rt := range have {
		if _, ok := want[rt.Dst]; !ok {
			dels = append(dels, Op{Delete: true, Route: &have[i]})
		}
	}
	return sets, dels
}

// movesDevice reports whether replacing route have by want would fail in
// the kernel: IPv6 checks an onlink gateway against the routes that cover
// it (the default route aside) and refuses one reached through another
// device ("Nexthop has invalid gateway or device mismatch"). A VXLAN
// route's gateway is the peer's VTEP address, inside the very podCIDR the
// host-gw route it replaces covers through the underlay, so switching a
// peer from host-gw to VXLAN has to delete the old route first (a moment
// without a route to that peer; IPv4 replaces in place).
func movesDevice(have, want Route) bool {
	return want.Onlink && have.Dev != want.Dev && want.Dst.Addr().Is6() && have.Dst.Contains(want.Gw)
}
