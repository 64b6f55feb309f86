package routing

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// FakeKernel is an in-memory Kernel that refuses what the kernel refuses:
// links on a missing parent, routes through a missing device or an
// unreachable gateway, entries on a missing device, deleting what is not
// there. Deleting a link drops its routes, neighbours and FDB entries, as
// the kernel does. Safe for concurrent use.
type FakeKernel struct {
	mu       sync.Mutex
	underlay map[string]netip.Prefix // parent interfaces and their subnets
	mtu      map[string]int          // parent MTUs; 1500 unless set
	links    map[string]*VXLANDevice
	routes   map[netip.Prefix]Route
	neighs   map[string]map[netip.Addr]Neigh
	fdb      map[string]map[string]FDB
	// famAddrs holds the device addresses written through Family's
	// views, one per family, as the kernel holds them.
	famAddrs map[string]map[ipfamily.Family]netip.Prefix
	// Mutations counts every successful change.
	Mutations int
}

// NewFakeKernel returns a kernel with the given underlay interfaces (name →
// subnet of its address).
func NewFakeKernel(underlay map[string]netip.Prefix) *FakeKernel {
	return &FakeKernel{
		underlay: underlay,
		mtu:      make(map[string]int),
		links:    make(map[string]*VXLANDevice),
		routes:   make(map[netip.Prefix]Route),
		neighs:   make(map[string]map[netip.Addr]Neigh),
		fdb:      make(map[string]map[string]FDB),
		famAddrs: make(map[string]map[ipfamily.Family]netip.Prefix),
	}
}

// Family returns a view of k for the reconciler of family f, as
// NewNetlinkKernel(ns, f) is of the real kernel: routes and neighbours of
// f alone, the device's address of f alone; FDB entries and the device
// itself are shared with the other family's view.
func (k *FakeKernel) Family(f ipfamily.Family) Kernel { return fakeFamily{k, f} }

type fakeFamily struct {
	*FakeKernel
	f ipfamily.Family
}

func (v fakeFamily) VXLAN(name string) (*VXLANDevice, error) {
	d, err := v.FakeKernel.VXLAN(name)
	if d != nil {
		v.mu.Lock()
		d.Addr = v.famAddrs[name][v.f]
		v.mu.Unlock()
	}
	return d, err
}

func (v fakeFamily) setAddr(d VXLANDevice) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.famAddrs[d.Name] == nil {
		v.famAddrs[d.Name] = make(map[ipfamily.Family]netip.Prefix)
	}
	if d.Addr.IsValid() {
		v.famAddrs[d.Name][v.f] = d.Addr
	} else {
		delete(v.famAddrs[d.Name], v.f)
	}
}

func (v fakeFamily) CreateVXLAN(d VXLANDevice) error {
	if err := v.FakeKernel.CreateVXLAN(d); err != nil {
		return err
	}
	v.setAddr(d)
	return nil
}

func (v fakeFamily) UpdateVXLAN(d VXLANDevice) error {
	if err := v.FakeKernel.UpdateVXLAN(d); err != nil {
		return err
	}
	v.setAddr(d)
	return nil
}

func (v fakeFamily) Routes() ([]Route, error) {
	rs, err := v.FakeKernel.Routes()
	return slices.DeleteFunc(rs, func(r Route) bool { return !v.f.HasPrefix(r.Dst) }), err
}

func (v fakeFamily) Neighs(dev string) ([]Neigh, error) {
	ns, err := v.FakeKernel.Neighs(dev)
	return slices.DeleteFunc(ns, func(n Neigh) bool { return !v.f.Has(n.IP) }), err
}

// SetMTU sets an underlay interface's MTU (default 1500).
func (k *FakeKernel) SetMTU(iface string, mtu int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.mtu[iface] = mtu
}

// checkMTULocked refuses a VXLAN MTU the parent cannot carry, as the
// kernel does.
func (k *FakeKernel) checkMTULocked(d VXLANDevice) error {
	parent := k.mtu[d.Parent]
	if parent == 0 {
		parent = 1500
	}
	if d.MTU > parent-Overhead(ipfamily.Of(d.Local)) {
		return fmt.Errorf("link %s: mtu %d over parent %s's %d: %w", d.Name, d.MTU, d.Parent, parent, syscall.EINVAL)
	}
	return nil
}

func (k *FakeKernel) VXLAN(name string) (*VXLANDevice, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	d, ok := k.links[name]
	if !ok {
		return nil, nil
	}
	c := *d
	return &c, nil
}

func (k *FakeKernel) CreateVXLAN(d VXLANDevice) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.links[d.Name]; ok {
		return fmt.Errorf("link %s: %w", d.Name, syscall.EEXIST)
	}
	if _, ok := k.underlay[d.Parent]; !ok {
		return fmt.Errorf("parent %s: %w", d.Parent, syscall.ENODEV)
	}
	if err := k.checkMTULocked(d); err != nil {
		return err
	}
	k.links[d.Name] = &d
	k.Mutations++
	return nil
}

func (k *FakeKernel) UpdateVXLAN(d VXLANDevice) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	l, ok := k.links[d.Name]
	if !ok {
		return fmt.Errorf("link %s: %w", d.Name, syscall.ENODEV)
	}
	want := d
	want.Parent = l.Parent
	if err := k.checkMTULocked(want); err != nil {
		return err
	}
	l.MTU, l.MAC, l.Addr, l.Up = d.MTU, d.MAC, d.Addr, d.Up
	if !l.Up {
		k.dropDevLocked(d.Name, false)
	}
	k.Mutations++
	return nil
}

func (k *FakeKernel) DeleteLink(name string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.links[name]; !ok {
		return fmt.Errorf("link %s: %w", name, syscall.ENODEV)
	}
	delete(k.links, name)
	delete(k.famAddrs, name)
	k.dropDevLocked(name, true)
	k.Mutations++
	return nil
}

// dropDevLocked removes routes through dev (a link going down does that)
// and, when the link is gone, its neighbour and FDB entries too.
func (k *FakeKernel) dropDevLocked(dev string, gone bool) {
	for dst, r := range k.routes {
		if r.Dev == dev {
			delete(k.routes, dst)
		}
	}
	if gone {
		delete(k.neighs, dev)
		delete(k.fdb, dev)
	}
}

func (k *FakeKernel) Routes() ([]Route, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]Route, 0, len(k.routes))
	for _, r := range k.routes {
		out = append(out, r)
	}
	return out, nil
}

func (k *FakeKernel) ReplaceRoute(r Route) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ipfamily.Of(r.Gw) != ipfamily.Of(r.Dst.Addr()) {
		return fmt.Errorf("route %s: gateway of another family: %w", r, syscall.EINVAL)
	}
	if subnet, ok := k.underlay[r.Dev]; ok {
		if !r.Onlink && !subnet.Contains(r.Gw) {
			return fmt.Errorf("route %s: gateway not on %s: %w", r, r.Dev, syscall.ENETUNREACH)
		}
	} else if l, ok := k.links[r.Dev]; !ok {
		return fmt.Errorf("route %s: %w", r, syscall.ENODEV)
	} else if !l.Up {
		return fmt.Errorf("route %s: link down: %w", r, syscall.ENETDOWN)
	} else if !r.Onlink {
		return fmt.Errorf("route %s: gateway not on %s: %w", r, r.Dev, syscall.ENETUNREACH)
	}
	if cover, ok := k.covering(r.Gw); ok && r.Onlink && r.Gw.Is6() && cover.Dev != r.Dev {
		return fmt.Errorf("route %s: nexthop has invalid gateway or device mismatch (%s): %w", r, cover, syscall.EINVAL)
	}
	k.routes[r.Dst] = r
	k.Mutations++
	return nil
}

// covering is the most specific route holding a, the route being
// replaced included, as the kernel's IPv6 onlink check looks it up.
func (k *FakeKernel) covering(a netip.Addr) (Route, bool) {
	var best Route
	found := false
	for _, r := range k.routes {
		if r.Dst.Bits() > 0 && r.Dst.Contains(a) && (!found || r.Dst.Bits() > best.Dst.Bits()) {
			best, found = r, true
		}
	}
	return best, found
}

func (k *FakeKernel) DeleteRoute(r Route) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if have, ok := k.routes[r.Dst]; !ok || have != r {
		return fmt.Errorf("route %s: %w", r, syscall.ESRCH)
	}
	delete(k.routes, r.Dst)
	k.Mutations++
	return nil
}

func (k *FakeKernel) Neighs(dev string) ([]Neigh, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []Neigh
	for _, n := range k.neighs[dev] {
		out = append(out, n)
	}
	return out, nil
}

func (k *FakeKernel) SetNeigh(n Neigh) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.links[n.Dev]; !ok {
		return fmt.Errorf("neigh %s: %w", n, syscall.ENODEV)
	}
	if k.neighs[n.Dev] == nil {
		k.neighs[n.Dev] = make(map[netip.Addr]Neigh)
	}
	k.neighs[n.Dev][n.IP] = n
	k.Mutations++
	return nil
}

func (k *FakeKernel) DeleteNeigh(n Neigh) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.neighs[n.Dev][n.IP]; !ok {
		return fmt.Errorf("neigh %s: %w", n, syscall.ENOENT)
	}
	delete(k.neighs[n.Dev], n.IP)
	k.Mutations++
	return nil
}

func (k *FakeKernel) FDB(dev string) ([]FDB, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []FDB
	for _, f := range k.fdb[dev] {
		out = append(out, f)
	}
	return out, nil
}

func (k *FakeKernel) SetFDB(f FDB) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.links[f.Dev]; !ok {
		return fmt.Errorf("fdb %s: %w", f, syscall.ENODEV)
	}
	if k.fdb[f.Dev] == nil {
		k.fdb[f.Dev] = make(map[string]FDB)
	}
	// The kernel keys FDB entries by MAC (and destination, for the
	// all-zeros entry); podnet only installs one destination per MAC.
	k.fdb[f.Dev][f.MAC.String()] = f
	k.Mutations++
	return nil
}

func (k *FakeKernel) DeleteFDB(f FDB) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if have, ok := k.fdb[f.Dev][f.MAC.String()]; !ok || have.Dst != f.Dst {
		return fmt.Errorf("fdb %s: %w", f, syscall.ENOENT)
	}
	delete(k.fdb[f.Dev], f.MAC.String())
	k.Mutations++
	return nil
}

// Write makes ops one by one, as the kernel would in one batch.
func (k *FakeKernel) Write(ops []Op) []error {
	var errs []error
	for i, o := range ops {
		var err error
		switch {
		case o.Route != nil && o.Delete:
			err = k.DeleteRoute(*o.Route)
		case o.Route != nil:
			err = k.ReplaceRoute(*o.Route)
		case o.Neigh != nil && o.Delete:
			err = k.DeleteNeigh(*o.Neigh)
		case o.Neigh != nil:
			err = k.SetNeigh(*o.Neigh)
		case o.FDB != nil && o.Delete:
			err = k.DeleteFDB(*o.FDB)
		default:
			err = k.SetFDB(*o.FDB)
		}
		if err != nil {
			if errs == nil {
				errs = make([]error, len(ops))
			}
			errs[i] = err
		}
	}
	return errs
}

// Dump renders the whole state, sorted, in `ip`-like text for golden tests.
func (k *FakeKernel) Dump() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var lines []string
	for _, l := range k.links {
		lines = append(lines, "link "+l.String())
	}
	for name, m := range k.famAddrs {
		for _, a := range m {
			lines = append(lines, fmt.Sprintf("addr %s dev %s", a, name))
		}
	}
	for _, r := range k.routes {
		lines = append(lines, fmt.Sprintf("route %s proto %d", r, Protocol))
	}
	for _, m := range k.neighs {
		for _, n := range m {
			lines = append(lines, "neigh "+n.String())
		}
	}
	for _, m := range k.fdb {
		for _, f := range m {
			lines = append(lines, "fdb "+f.String())
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n") + "\n"
}
