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
}

// Apply changes the kernel to hold p, touching only what differs. It
// returns what it changed (for logs and tests) and every error it met; it
// keeps going after an error so one bad entry does not block the rest.
func (r *Reconciler) Apply(p Plan) ([]string, error) {
	var changes []string
	var errs []error
	do := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			return
		}
		changes = append(changes, what)
	}

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
		r.syncFDB(p, do, &errs)
		r.syncNeighs(p, do, &errs)
	}
	r.syncRoutes(p, do, &errs)
	return changes, errors.Join(errs...)
}

func sameIdentity(a, b VXLANDevice) bool {
	return a.VNI == b.VNI && a.Port == b.Port && a.Local == b.Local && a.Parent == b.Parent && a.Learning == b.Learning
}

func (r *Reconciler) syncFDB(p Plan, do func(string, error), errs *[]error) {
	have, err := r.Kernel.FDB(p.Device.Name)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("list fdb: %w", err))
		return
	}
	haveSet := make(map[string]bool)
	for _, f := range have {
		haveSet[f.String()] = true
	}
	wantSet := make(map[string]bool)
	for _, f := range p.FDB {
		wantSet[f.String()] = true
		if !haveSet[f.String()] {
			do("add fdb "+f.String(), r.Kernel.SetFDB(f))
		}
	}
	for _, f := range have {
		if !wantSet[f.String()] {
			do("delete fdb "+f.String(), r.Kernel.DeleteFDB(f))
		}
	}
}

func (r *Reconciler) syncNeighs(p Plan, do func(string, error), errs *[]error) {
	have, err := r.Kernel.Neighs(p.Device.Name)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("list neighbours: %w", err))
		return
	}
	haveByIP := make(map[netip.Addr]Neigh)
	for _, n := range have {
		haveByIP[n.IP] = n
	}
	wantIP := make(map[netip.Addr]bool)
	for _, n := range p.Neighs {
		wantIP[n.IP] = true
		if h, ok := haveByIP[n.IP]; !ok || !bytes.Equal(h.MAC, n.MAC) {
			do("set neigh "+n.String(), r.Kernel.SetNeigh(n))
		}
	}
	for _, n := range have {
		if !wantIP[n.IP] {
			do("delete neigh "+n.String(), r.Kernel.DeleteNeigh(n))
		}
	}
}

func (r *Reconciler) syncRoutes(p Plan, do func(string, error), errs *[]error) {
	have, err := r.Kernel.Routes()
	if err != nil {
		*errs = append(*errs, fmt.Errorf("list routes: %w", err))
		return
	}
	haveByDst := make(map[netip.Prefix]Route)
	for _, rt := range have {
		haveByDst[rt.Dst] = rt
	}
	wantDst := make(map[netip.Prefix]bool)
	for _, rt := range p.Routes {
		wantDst[rt.Dst] = true
		if h, ok := haveByDst[rt.Dst]; !ok || h != rt {
			do("replace route "+rt.String(), r.Kernel.ReplaceRoute(rt))
		}
	}
	for _, rt := range have {
		if !wantDst[rt.Dst] {
			do("delete route "+rt.String(), r.Kernel.DeleteRoute(rt))
		}
	}
}
