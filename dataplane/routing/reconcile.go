package routing

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
)

// Kernel is the part of netlink the Reconciler uses. The real one is
// NewNetlinkKernel; tests use NewFakeKernel, which fails like the kernel.
type Kernel interface {
	// VXLAN returns the named link as the kernel holds it, or nil when
	// there is none. A link that is not VXLAN comes back with VNI 0.
	VXLAN(name string) (*VXLANDevice, error)
	CreateVXLAN(d VXLANDevice) error
	// UpdateVXLAN sets MTU, MAC, address and up state in place.
	UpdateVXLAN(d VXLANDevice) error
	DeleteLink(name string) error
	// Routes lists the main table's routes tagged with Protocol.
	Routes() ([]Route, error)
	ReplaceRoute(r Route) error
	DeleteRoute(r Route) error
	// Neighs lists the permanent IPv4 neighbour entries of dev.
	Neighs(dev string) ([]Neigh, error)
	SetNeigh(n Neigh) error
	DeleteNeigh(n Neigh) error
	// FDB lists the forwarding entries of dev that have a destination.
	FDB(dev string) ([]FDB, error)
	SetFDB(f FDB) error
	DeleteFDB(f FDB) error
}

// Reconciler makes the kernel hold a Plan.
type Reconciler struct {
	Kernel Kernel
	// Device is the VXLAN device name to remove when a plan has none.
	Device string

	// applied is the plan the last Apply or Update put in place without
	// an error, with its index; nil when there is none.
	applied *indexedPlan
}

// Apply changes the kernel to hold p, touching only what differs. It
// returns what it changed (for logs and tests) and every error it met; it
// keeps going after an error so one bad entry does not block the rest.
func (r *Reconciler) Apply(p Plan) ([]string, error) {
	changes, err := r.apply(p)
	r.remember(p, err)
	return changes, err
}

// remember records p as the kernel's state when it was put in place
// without an error, and forgets any plan otherwise.
func (r *Reconciler) remember(p Plan, err error) {
	r.applied = nil
	if err == nil {
		r.applied = indexPlan(p)
	}
}

// Update changes the kernel from the plan last put in place to p, touching
// only the entries in which the two differ and reading nothing back: one
// Node added or removed costs its own few netlink calls instead of a dump
// of every peer's entries. When no plan is known to be in place (none yet,
// or the last Apply or Update met an error) or the device differs, it is
// Apply. Changes made behind podnet's back are for Apply to repair.
func (r *Reconciler) Update(p Plan) ([]string, error) {
	old := r.applied
	if old == nil || !sameDevice(old.Device, p.Device) {
		return r.Apply(p)
	}
	np := indexPlan(p)
	var c changeLog
	do := c.do
	// Forwarding state before the routes that need it; removals after,
	// in the reverse order.
	for _, f := range p.FDB {
		if _, ok := old.fdb[keyOf(f)]; !ok {
			do("add fdb "+f.String(), r.Kernel.SetFDB(f))
		}
	}
	for _, n := range p.Neighs {
		if i, ok := old.neigh[n.IP]; !ok || !bytes.Equal(old.Neighs[i].MAC, n.MAC) {
			do("set neigh "+n.String(), r.Kernel.SetNeigh(n))
		}
	}
	for _, rt := range p.Routes {
		if i, ok := old.route[rt.Dst]; !ok || old.Routes[i] != rt {
			do("replace route "+rt.String(), r.Kernel.ReplaceRoute(rt))
		}
	}
	for _, rt := range old.Routes {
		if _, ok := np.route[rt.Dst]; !ok {
			do("delete route "+rt.String(), r.Kernel.DeleteRoute(rt))
		}
	}
	for _, n := range old.Neighs {
		if _, ok := np.neigh[n.IP]; !ok {
			do("delete neigh "+n.String(), r.Kernel.DeleteNeigh(n))
		}
	}
	for _, f := range old.FDB {
		if _, ok := np.fdb[keyOf(f)]; !ok {
			do("delete fdb "+f.String(), r.Kernel.DeleteFDB(f))
		}
	}
	err := errors.Join(c.errs...)
	r.applied = nil
	if err == nil {
		r.applied = np
	}
	return c.changes, err
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

// indexedPlan is a plan with its entries indexed by what identifies them
// in the kernel, built once when the plan is put in place so that the
// next Update indexes only its own plan.
type indexedPlan struct {
	Plan
	fdb   map[fdbKey]int
	neigh map[netip.Addr]int
	route map[netip.Prefix]int
}

func indexPlan(p Plan) *indexedPlan {
	ip := &indexedPlan{Plan: p, fdb: make(map[fdbKey]int, len(p.FDB)),
		neigh: make(map[netip.Addr]int, len(p.Neighs)), route: make(map[netip.Prefix]int, len(p.Routes))}
	for i, f := range p.FDB {
		ip.fdb[keyOf(f)] = i
	}
	for i, n := range p.Neighs {
		ip.neigh[n.IP] = i
	}
	for i, r := range p.Routes {
		ip.route[r.Dst] = i
	}
	return ip
}

func sameDevice(a, b *VXLANDevice) bool {
	if a == nil || b == nil {
		return a == b
	}
	return sameIdentity(*a, *b) && a.Name == b.Name && a.MTU == b.MTU && bytes.Equal(a.MAC, b.MAC) && a.Addr == b.Addr && a.Up == b.Up
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

// apply is Apply without remembering the plan.
func (r *Reconciler) apply(p Plan) ([]string, error) {
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
	// next hop; removals after, in the reverse order.
	if p.Device != nil && devReady {
		r.syncFDB(p, &c)
		r.syncNeighs(p, &c)
	}
	r.syncRoutes(p, &c)
	return c.changes, errors.Join(c.errs...)
}

func sameIdentity(a, b VXLANDevice) bool {
	return a.VNI == b.VNI && a.Port == b.Port && a.Local == b.Local && a.Parent == b.Parent && a.Learning == b.Learning
}

func (r *Reconciler) syncFDB(p Plan, c *changeLog) {
	do := c.do
	have, err := r.Kernel.FDB(p.Device.Name)
	if err != nil {
		c.errs = append(c.errs, fmt.Errorf("list fdb: %w", err))
		return
	}
	haveSet, wantSet := fdbSet(have), fdbSet(p.FDB)
	for _, f := range p.FDB {
		if !haveSet[keyOf(f)] {
			do("add fdb "+f.String(), r.Kernel.SetFDB(f))
		}
	}
	for _, f := range have {
		if !wantSet[keyOf(f)] {
			do("delete fdb "+f.String(), r.Kernel.DeleteFDB(f))
		}
	}
}

func (r *Reconciler) syncNeighs(p Plan, c *changeLog) {
	do := c.do
	have, err := r.Kernel.Neighs(p.Device.Name)
	if err != nil {
		c.errs = append(c.errs, fmt.Errorf("list neighbours: %w", err))
		return
	}
	haveByIP, want := neighByIP(have), neighByIP(p.Neighs)
	for _, n := range p.Neighs {
		if h, ok := haveByIP[n.IP]; !ok || !bytes.Equal(h.MAC, n.MAC) {
			do("set neigh "+n.String(), r.Kernel.SetNeigh(n))
		}
	}
	for _, n := range have {
		if _, ok := want[n.IP]; !ok {
			do("delete neigh "+n.String(), r.Kernel.DeleteNeigh(n))
		}
	}
}

func (r *Reconciler) syncRoutes(p Plan, c *changeLog) {
	do := c.do
	have, err := r.Kernel.Routes()
	if err != nil {
		c.errs = append(c.errs, fmt.Errorf("list routes: %w", err))
		return
	}
	haveByDst, want := routeByDst(have), routeByDst(p.Routes)
	for _, rt := range p.Routes {
		if h, ok := haveByDst[rt.Dst]; !ok || h != rt {
			do("replace route "+rt.String(), r.Kernel.ReplaceRoute(rt))
		}
	}
	for _, rt := range have {
		if _, ok := want[rt.Dst]; !ok {
			do("delete route "+rt.String(), r.Kernel.DeleteRoute(rt))
		}
	}
}
