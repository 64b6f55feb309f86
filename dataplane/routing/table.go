package routing

import (
	"bytes"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/podnet/podnet/dataplane/cluster"
)

// Table is Compute's plan kept up to date one Node at a time: Set and
// Delete cost the same with 5 peers or 5,000 and return only the kernel
// entries that change (a Delta), where computing the plan again and
// diffing it with the last one walked every peer (~7 ms of CPU per change
// at 5,000 VXLAN peers). Plan() renders the same plan Compute returns for
// the same Nodes; TestTableMatchesCompute checks that after every step of
// random changes.
//
// The node itself is not a peer: a change to it (its podCIDR is in every
// overlap check, its address in the device) needs a new Table. A Table is
// safe for concurrent use: the netlink watch reads it (Matches) while the
// sync changes it.
type Table struct {
	cfg Config

	mu     sync.RWMutex
	self   netip.Prefix
	device *VXLANDevice
	// nodes holds every other Node as judged alone: a peer, or why not.
	nodes map[string]tableNode
	// claims lists the peers wanting each VTEP address, by name; the
	// first owns it and has its entries in the plan.
	claims map[netip.Addr][]string
	// skipped and contested index the Nodes that are no peer and the
	// VTEP addresses claimed more than once, so that Skipped walks only
	// those.
	skipped   map[string]struct{}
	contested map[netip.Addr]struct{}
	routes    map[netip.Prefix]Route
	neighs    map[netip.Addr]Neigh
	// fdb counts the peers wanting each entry: two Nodes with one
	// InternalIP share it.
	fdb map[fdbKey]fdbRef
}

type tableNode struct {
	peer Peer
	skip string // why the Node is no peer; "" for a peer
}

type fdbRef struct {
	f    FDB
	refs int
}

// Delta is what one change of the plan asks of the kernel: entries to add
// or replace (Set) and entries to remove (Delete).
type Delta struct {
	Set, Delete Entries
}

// Entries are kernel entries of a plan.
type Entries struct {
	Routes []Route
	Neighs []Neigh
	FDB    []FDB
}

// Empty reports whether d changes nothing.
func (d Delta) Empty() bool {
	return len(d.Set.Routes)+len(d.Set.Neighs)+len(d.Set.FDB)+len(d.Delete.Routes)+len(d.Delete.Neighs)+len(d.Delete.FDB) == 0
}

// NewTable returns the table for this node (c.NodeName, which must be
// among nodes for the plan to have a podCIDR) and the cluster's Nodes.
func NewTable(c Config, nodes []*cluster.Node) *Table {
	t := &Table{cfg: c, nodes: make(map[string]tableNode, len(nodes)), claims: make(map[netip.Addr][]string, len(nodes)),
		routes: make(map[netip.Prefix]Route, len(nodes)), skipped: make(map[string]struct{}), contested: make(map[netip.Addr]struct{})}
	if c.Backend != BackendHostGW {
		t.neighs = make(map[netip.Addr]Neigh, len(nodes))
		t.fdb = make(map[fdbKey]fdbRef, len(nodes))
	}
	if self := find(nodes, c.NodeName); self != nil {
		t.self, _ = self.PodCIDR(c.family())
	}
	t.device = c.device(t.self)
	var d delta
	for _, n := range nodes {
		t.set(&d, n.Name, n)
	}
	return t
}

// Config is the routing config the table was made for.
func (t *Table) Config() Config { return t.cfg }

// Set records Node n as it now is and returns what the kernel must change.
func (t *Table) Set(n *cluster.Node) Delta {
	return t.Update(map[string]*cluster.Node{n.Name: n})
}

// Delete forgets the Node name and returns what the kernel must change.
func (t *Table) Delete(name string) Delta {
	return t.Update(map[string]*cluster.Node{name: nil})
}

// Update records the Nodes named in nodes as they now are (nil: gone) and
// returns what the kernel must change for all of them, as one Delta: a
// podCIDR passing from one Node to another in the same update is one
// replacement, not a removal the other's addition would have to follow.
func (t *Table) Update(nodes map[string]*cluster.Node) Delta {
	t.mu.Lock()
	defer t.mu.Unlock()
	var d delta
	for name, n := range nodes {
		t.set(&d, name, n)
	}
	return d.result(t)
}

// set makes the table hold n (nil: no Node of that name), noting the
// entries it touches in d.
func (t *Table) set(d *delta, name string, n *cluster.Node) {
	if name == t.cfg.NodeName {
		return
	}
	old, had := t.nodes[name]
	var now tableNode
	if n != nil {
		now.peer, now.skip = t.cfg.peerOf(t.self, n)
	}
	if had && n != nil && old == now {
		return
	}
	if had && old.skip == "" {
		t.unclaim(d, old.peer)
	}
	delete(t.nodes, name)
	delete(t.skipped, name)
	if n == nil {
		return
	}
	t.nodes[name] = now
	if now.skip != "" {
		t.skipped[name] = struct{}{}
		return
	}
	t.claim(d, now.peer)
}

// claim adds peer to the claimants of its VTEP address; when it comes
// first by name it takes the entries over from the owner before it.
func (t *Table) claim(d *delta, peer Peer) {
	key := VTEPAddr(peer.PodCIDR)
	names := t.claims[key]
	i, _ := slices.BinarySearch(names, peer.Name)
	if i == 0 && len(names) > 0 {
		t.remove(d, t.nodes[names[0]].peer)
	}
	t.claims[key] = slices.Insert(names, i, peer.Name)
	if len(names) > 0 {
		t.contested[key] = struct{}{}
	}
	if i == 0 {
		t.add(d, peer)
	}
}

// unclaim removes peer from the claimants of its VTEP address; when it
// owned it, the next one by name takes its entries over.
func (t *Table) unclaim(d *delta, peer Peer) {
	key := VTEPAddr(peer.PodCIDR)
	names := t.claims[key]
	i, found := slices.BinarySearch(names, peer.Name)
	if !found {
		return
	}
	names = slices.Delete(names, i, i+1)
	if len(names) == 0 {
		delete(t.claims, key)
	} else {
		t.claims[key] = names
	}
	if len(names) < 2 {
		delete(t.contested, key)
	}
	if i != 0 {
		return
	}
	t.remove(d, peer)
	if len(names) > 0 {
		t.add(d, t.nodes[names[0]].peer)
	}
}

func (t *Table) add(d *delta, peer Peer) {
	r, n, f := t.cfg.entries(peer)
	d.touchRoute(t, r.Dst)
	t.routes[r.Dst] = r
	if !peer.VXLAN {
		return
	}
	d.touchNeigh(t, n.IP)
	t.neighs[n.IP] = n
	k := keyOf(f)
	d.touchFDB(t, k)
	ref := t.fdb[k]
	t.fdb[k] = fdbRef{f: f, refs: ref.refs + 1}
}

func (t *Table) remove(d *delta, peer Peer) {
	r, n, f := t.cfg.entries(peer)
	d.touchRoute(t, r.Dst)
	delete(t.routes, r.Dst)
	if !peer.VXLAN {
		return
	}
	d.touchNeigh(t, n.IP)
	delete(t.neighs, n.IP)
	k := keyOf(f)
	d.touchFDB(t, k)
	if ref := t.fdb[k]; ref.refs > 1 {
		t.fdb[k] = fdbRef{f: ref.f, refs: ref.refs - 1}
	} else {
		delete(t.fdb, k)
	}
}

// delta notes the entries one change touches, with what the table held
// for each before it, so that a peer removed and added back under one key
// (a new gateway, a new owner) nets out to one replacement or nothing.
type delta struct {
	routes []touched[netip.Prefix, Route]
	neighs []touched[netip.Addr, Neigh]
	fdb    []touched[fdbKey, FDB]
}

type touched[K comparable, V any] struct {
	key    K
	before V
	had    bool
}

func touch[K comparable, V any](ts []touched[K, V], key K, before V, had bool) []touched[K, V] {
	for _, t := range ts {
		if t.key == key {
			return ts
		}
	}
	return append(ts, touched[K, V]{key, before, had})
}

func (d *delta) touchRoute(t *Table, k netip.Prefix) {
	r, ok := t.routes[k]
	d.routes = touch(d.routes, k, r, ok)
}

func (d *delta) touchNeigh(t *Table, k netip.Addr) {
	n, ok := t.neighs[k]
	d.neighs = touch(d.neighs, k, n, ok)
}

func (d *delta) touchFDB(t *Table, k fdbKey) {
	f, ok := t.fdb[k]
	d.fdb = touch(d.fdb, k, f.f, ok)
}

// result compares each touched entry before and after the change.
func (d *delta) result(t *Table) Delta {
	var out Delta
	out.Set.Routes, out.Delete.Routes = settle(d.routes, func(k netip.Prefix) (Route, bool) { r, ok := t.routes[k]; return r, ok },
		func(a, b Route) bool { return a == b })
	out.Set.Neighs, out.Delete.Neighs = settle(d.neighs, func(k netip.Addr) (Neigh, bool) { n, ok := t.neighs[k]; return n, ok },
		func(a, b Neigh) bool { return bytes.Equal(a.MAC, b.MAC) })
	// An FDB entry's key is all of it.
	out.Set.FDB, out.Delete.FDB = settle(d.fdb, func(k fdbKey) (FDB, bool) { f, ok := t.fdb[k]; return f.f, ok },
		func(FDB, FDB) bool { return true })
	return out
}

// settle compares each touched entry with what the table now holds: the
// entries to set (new or different) and those to delete (gone).
func settle[K comparable, V any](ts []touched[K, V], now func(K) (V, bool), same func(a, b V) bool) (set, del []V) {
	for _, t := range ts {
		v, ok := now(t.key)
		switch {
		case ok && (!t.had || !same(v, t.before)):
			set = append(set, v)
		case !ok && t.had:
			del = append(del, t.before)
		}
	}
	return set, del
}

// Plan renders the table as Compute would: sorted by name, skipped nodes
// with their reason. It walks every peer; full syncs and status use it.
func (t *Table) Plan() Plan {
	t.mu.RLock()
	defer t.mu.RUnlock()
	p := Plan{PodCIDR: t.self, Device: t.device}
	names := make([]string, 0, len(t.nodes))
	for name := range t.nodes {
		names = append(names, name)
	}
	slices.SortFunc(names, strings.Compare)
	p.Peers = make([]Peer, 0, len(t.routes))
	p.Routes = make([]Route, 0, len(t.routes))
	if t.device != nil {
		p.Neighs = make([]Neigh, 0, len(t.neighs))
		p.FDB = make([]FDB, 0, len(t.routes))
	}
	for _, name := range names {
		n := t.nodes[name]
		if n.skip != "" || t.claims[VTEPAddr(n.peer.PodCIDR)][0] != name {
			p.Skipped = append(p.Skipped, t.skipReason(name))
			continue
		}
		p.Peers = append(p.Peers, n.peer)
		r, nb, f := t.cfg.entries(n.peer)
		p.Routes = append(p.Routes, r)
		if n.peer.VXLAN {
			p.Neighs = append(p.Neighs, nb)
			p.FDB = append(p.FDB, f)
		}
	}
	return p
}

// Skipped is the plan's Skipped: the Nodes that are no peer, and why.
func (t *Table) Skipped() []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	names := make([]string, 0, len(t.skipped))
	for name := range t.skipped {
		names = append(names, name)
	}
	for key := range t.contested {
		names = append(names, t.claims[key][1:]...)
	}
	slices.SortFunc(names, strings.Compare)
	out := make([]string, len(names))
	for i, name := range names {
		out[i] = t.skipReason(name)
	}
	return out
}

// skipReason says why the Node name is no peer.
func (t *Table) skipReason(name string) string {
	n := t.nodes[name]
	if n.skip != "" {
		return n.skip
	}
	return duplicate(n.peer, t.nodes[t.claims[VTEPAddr(n.peer.PodCIDR)][0]].peer)
}

// HasFDB reports whether the table wants the FDB entry f (whose device
// another family's table may share).
func (t *Table) HasFDB(f FDB) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	_, ok := t.fdb[keyOf(f)]
	return ok
}

// Peers counts the peers reached with VXLAN and with host-gw.
func (t *Table) Peers() (vxlan, hostGW int) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	vxlan = len(t.neighs)
	return vxlan, len(t.routes) - vxlan
}

// Matches reports whether the kernel event e leaves the kernel as the
// table wants it: an entry of the plan written as planned, an entry the
// plan does not hold removed, a change to something podnet does not
// manage. Every change podnet makes echoes back as such an event; only
// the others (a route or neighbour of the plan deleted or changed, a
// stray entry tagged as podnet's, the device or the underlay gone or
// down, lost events) need a full sync to repair them.
func (t *Table) Matches(e Event) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	switch e.Kind {
	case EventRoute:
		want, ok := t.routes[e.Route.Dst]
		if e.Deleted {
			return !ok
		}
		return ok && want == e.Route
	case EventNeigh:
		want, ok := t.neighs[e.Neigh.IP]
		switch {
		case e.Deleted:
			return !ok
		case !ok:
			return !e.Permanent // the kernel's own; Apply leaves those alone
		}
		return e.Permanent && bytes.Equal(want.MAC, e.Neigh.MAC)
	case EventFDB:
		_, ok := t.fdb[keyOf(e.FDB)]
		return ok != e.Deleted
	case EventLink:
		return t.linkMatches(e)
	}
	return false
}

func (t *Table) linkMatches(e Event) bool {
	switch e.Link {
	case t.cfg.Device:
		d := t.device
		if d == nil || e.Deleted {
			// Without VXLAN the device goes (Apply removes it); with it,
			// it must stay.
			return d == nil && e.Deleted
		}
		v := e.Device
		return v != nil && (e.Up == d.Up || e.New) && v.VNI == d.VNI && v.Port == d.Port && v.MTU == d.MTU && bytes.Equal(v.MAC, d.MAC) && v.Learning == d.Learning
	case t.cfg.Iface:
		// Routes through a link that goes down or away are dropped
		// without an event of their own.
		return !e.Deleted && e.Up
	}
	return true
}
