// Package ebpf is the eBPF Service proxy backend: socket-level load
// balancing by cgroup programs (bpf/sock.c) for the node's pods and its own
// processes, programmed through pinned BPF maps.
//
// The maps hold, per Service frontend {address, port, protocol, scope}, a
// slot 0 entry with the backend count (the single commit point) and slots
// 1..n naming backends by id; backends live in their own map. A ServicePort
// owns one service id per endpoint set it uses (all cluster endpoints, or
// this node's), and each service id owns its backends, so one endpoint
// change rewrites only that Service's entries and a session-affinity entry
// can tell whether its backend still belongs to the Service.
//
// Generation is pure (desiredPort), applying is ordered (apply): new
// backends, then slots, then frontends; removals in the reverse order, so a
// reader never meets a slot whose backend is missing.
package ebpf

import (
	"net/netip"
	"slices"

	"github.com/podnet/podnet/bpf"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Kernel entry types, as the programs see them.
type (
	svcKey   = bpf.SockSvcKey
	svcVal   = bpf.SockSvcVal
	backend  = bpf.SockBackend
	nodeKey  = bpf.SockNodeaddrKey
	rangeKey = bpf.NodeportSrcrangeKey
)

// Frontend scopes and flags; they mirror bpf/lb.h.
const (
	scopeSock = 0
	scopeExt  = 1

	feReject   = 1
	feAffinity = 2
	feSrcRange = 4
	feLocal    = 8
)

// set names one of a ServicePort's endpoint sets.
type set uint8

const (
	setCluster set = iota
	setLocal
)

func protoNum(p cluster.Protocol) uint8 {
	switch p {
	case cluster.UDP:
		return 17
	case cluster.SCTP:
		return 132
	}
	return 6
}

// be16 converts a port to the network byte order the maps hold.
func be16(p uint16) uint16 { return p<<8 | p>>8 }

// addr16 is addr in the maps' 16-byte form (IPv4 as ::ffff:a.b.c.d); the
// zero address is all zeroes.
func addr16(a netip.Addr) [16]byte {
	if !a.IsValid() {
		return [16]byte{}
	}
	return netip.AddrFrom16(a.As16()).As16()
}

// addrFrom16 is the inverse of addr16, but for the NodePort wildcards
// (nodePortKeyAddr): both read as the zero address.
func addrFrom16(b [16]byte) netip.Addr {
	a := netip.AddrFrom16(b).Unmap()
	if a.IsUnspecified() {
		return netip.Addr{}
	}
	return a
}

// nodePortKeyAddr is the address of a NodePort frontend of family f: any
// of the node's addresses of that family (bpf/lb.h, lb_frontend):
// ::ffff:0.0.0.0 for IPv4, :: for IPv6.
func nodePortKeyAddr(f ipfamily.Family) netip.Addr {
	if f == ipfamily.IPv4 {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}

// frontendSpec is one frontend of a ServicePort: where clients connect and
// which endpoint set answers.
type frontendSpec struct {
	key      svcKey // slot 0
	set      set
	flags    uint8
	affinity uint32
}

// frontends lists sp's frontends in both scopes.
//
// Socket LB (scopeSock) serves pods and the node itself, so its external
// entry points use the endpoints iptables mode gives those clients: all of
// them, unless the Service has only local ones. Load-balancer IPs with
// loadBalancerSourceRanges are left to the tc programs there: the client's
// address is not known at connect time.
//
// The tc programs (scopeExt) serve clients outside the node: the external
// endpoint set, the client address kept for policy Local.
func frontends(sp *proxy.ServicePort) []frontendSpec {
	flags := uint8(0)
	if !sp.HasEndpoints {
		flags |= feReject
	}
	var affinity uint32
	if sp.AffinityTimeout > 0 {
		flags |= feAffinity
		affinity = uint32(sp.AffinityTimeout.Seconds())
	}
	mk := func(scope uint8, a netip.Addr, port uint16, s set, extra uint8) frontendSpec {
		return frontendSpec{
			key: svcKey{Addr: addr16(a), Port: be16(port), Proto: protoNum(sp.Protocol), Scope: scope},
			set: s, flags: flags | extra, affinity: affinity,
		}
	}
	internal := setCluster
	if sp.InternalPolicyLocal {
		internal = setLocal
	}
	out := []frontendSpec{mk(scopeSock, sp.ClusterIP, sp.Port, internal, 0)}
	if !sp.External() {
		return out
	}
	fromPods := setCluster
	if sp.ExternalPolicyLocal && len(sp.ClusterEndpoints) == 0 {
		fromPods = setLocal
	}
	fromOutside, local := setCluster, uint8(0)
	if sp.ExternalPolicyLocal {
		fromOutside, local = setLocal, feLocal
	}
	ranged := uint8(0)
	if len(sp.LoadBalancerSourceRanges) > 0 {
		ranged = feSrcRange
	}
	for _, a := range sp.ExternalIPs {
		out = append(out, mk(scopeSock, a, sp.Port, fromPods, 0), mk(scopeExt, a, sp.Port, fromOutside, local))
	}
	for _, a := range sp.LoadBalancerIPs {
		if ranged == 0 {
			out = append(out, mk(scopeSock, a, sp.Port, fromPods, 0))
		}
		out = append(out, mk(scopeExt, a, sp.Port, fromOutside, local|ranged))
	}
	if sp.NodePort != 0 {
		wild := nodePortKeyAddr(sp.Family())
		out = append(out, mk(scopeSock, wild, sp.NodePort, fromPods, 0), mk(scopeExt, wild, sp.NodePort, fromOutside, local))
	}
	return out
}

// sourceRanges appends the LPM entries letting sp's ranges reach service
// id to into, once each.
func sourceRanges(sp *proxy.ServicePort, id uint32, into []rangeKey) []rangeKey {
	for _, r := range sp.LoadBalancerSourceRanges {
		bits := r.Bits()
		if r.Addr().Is4() {
			bits += 96
		}
		k := rangeKey{Prefixlen: uint32(32 + bits), Svc: id, Addr: addr16(r.Masked().Addr())}
		if !slices.Contains(into, k) {
			into = append(into, k)
		}
	}
	return into
}

// endpointSet is one service id of a port and its backends: backend
// ids[i] is the set's endpoint i (of the ServicePort's cluster or local
// endpoints), named by slot i+1 of every frontend using the set.
type endpointSet struct {
	id   uint32 // 0: the port does not use the set
	ids  []uint32
	dups []int // slots naming an endpoint an earlier slot names; mostly nil
}

// frontend is one slot 0 entry a port holds; its slots are those of the
// set whose service id it names.
type frontend struct {
	key svcKey
	val svcVal
	ext bool // scopeExt: the tc programs pick by Maglev
}

// portEntries is every map entry one ServicePort owns, held as compactly
// as the syncer can keep 10,000s of them: the ids it handed out and the
// frontends it holds; addresses are read from the ServicePort, which is
// never changed once built, and Maglev tables (4 KiB each) are recomputed
// when wanted. Maps of entries per port were 29 MB of proxyd's live heap
// at 10,000 Services × 10 endpoints (BENCHMARKS.md).
type portEntries struct {
	sp     *proxy.ServicePort
	sets   [2]endpointSet // by set
	fronts []frontend
	ranges []rangeKey
	lost   bool // a frontend of sp went to another port
	seen   int  // entries a full sync found in the maps
}

// count returns how many service, backend and other (source range,
// Maglev) entries pe holds.
func (pe *portEntries) count() (services, backends, others int) {
	for _, f := range pe.fronts {
		_, st := pe.set(f.val.Id)
		services += 1 + len(st.ids)
	}
	for _, st := range pe.sets {
		backends += len(st.ids) - len(st.dups)
		if pe.external(st) {
			others++
		}
	}
	return services, backends, others + len(pe.ranges)
}

// external tells whether st has a Maglev table: an external frontend uses
// it and it has backends.
func (pe *portEntries) external(st endpointSet) bool {
	return len(st.ids) > 0 && slices.ContainsFunc(pe.fronts, func(f frontend) bool { return f.ext && f.val.Id == st.id })
}

// serviceAt returns the value pe wants at k; false if none. pe may be nil.
func (pe *portEntries) serviceAt(k svcKey) (svcVal, bool) {
	if pe == nil {
		return svcVal{}, false
	}
	fk := k
	fk.Slot = 0
	i := slices.IndexFunc(pe.fronts, func(f frontend) bool { return f.key == fk })
	if i < 0 {
		return svcVal{}, false
	}
	f := pe.fronts[i]
	if k.Slot == 0 {
		return f.val, true
	}
	_, st := pe.set(f.val.Id)
	if int(k.Slot) > len(st.ids) {
		return svcVal{}, false
	}
	return svcVal{Id: st.ids[k.Slot-1]}, true
}

// backendAt returns the backend pe wants at id, of service id svc; false
// if none. pe may be nil.
func (pe *portEntries) backendAt(id, svc uint32) (backend, bool) {
	if pe == nil {
		return backend{}, false
	}
	s, st := pe.set(svc)
	if st == nil {
		return backend{}, false
	}
	i := slices.Index(st.ids, id)
	if i < 0 {
		return backend{}, false
	}
	e := endpointsOf(pe.sp, s)[i]
	return backend{Addr: addr16(e.Addr()), Port: be16(e.Port), Proto: protoNum(pe.sp.Protocol), Svc: svc}, true
}

// maglevOf returns the Maglev table pe wants for service id svc; false if
// none. pe may be nil.
func (pe *portEntries) maglevOf(svc uint32) (maglevTable, bool) {
	if pe == nil {
		return maglevTable{}, false
	}
	s, st := pe.set(svc)
	if st == nil || !pe.external(*st) {
		return maglevTable{}, false
	}
	return st.maglev(endpointsOf(pe.sp, s)), true
}

// maglev computes the set's table.
func (st endpointSet) maglev(eps []proxy.Endpoint) maglevTable {
	aps := make([]netip.AddrPort, len(eps))
	for i, e := range eps {
		aps[i] = e.AddrPort()
	}
	return maglev(aps, st.ids)
}

// set returns the set with service id id.
func (pe *portEntries) set(id uint32) (set, *endpointSet) {
	for i := range pe.sets {
		if pe.sets[i].id == id {
			return set(i), &pe.sets[i]
		}
	}
	return 0, nil
}

func endpointsOf(sp *proxy.ServicePort, s set) []proxy.Endpoint {
	if s == setLocal {
		return sp.LocalEndpoints
	}
	return sp.ClusterEndpoints
}

// services yields the frontend and slot entries.
func (pe *portEntries) services(yield func(svcKey, svcVal) bool) {
	for _, f := range pe.fronts {
		if !yield(f.key, f.val) {
			return
		}
		_, st := pe.set(f.val.Id)
		for i, id := range st.ids {
			k := f.key
			k.Slot = uint16(i + 1)
			if !yield(k, svcVal{Id: id}) {
				return
			}
		}
	}
}

// backends yields the backend entries.
func (pe *portEntries) backends(yield func(uint32, backend) bool) {
	proto := protoNum(pe.sp.Protocol)
	for s, st := range pe.sets {
		eps := endpointsOf(pe.sp, set(s))
		for i, id := range st.ids {
			if st.dups != nil && slices.Contains(st.dups, i) {
				continue
			}
			if !yield(id, backend{Addr: addr16(eps[i].Addr()), Port: be16(eps[i].Port), Proto: proto, Svc: st.id}) {
				return
			}
		}
	}
}

// rangeEntries yields the source-range entries.
func (pe *portEntries) rangeEntries(yield func(rangeKey, uint8) bool) {
	for _, k := range pe.ranges {
		if !yield(k, 1) {
			return
		}
	}
}

// maglev yields the Maglev table of every set an external frontend uses,
// when it has backends.
func (pe *portEntries) maglev(yield func(uint32, maglevTable) bool) {
	for s, st := range pe.sets {
		if pe.external(st) && !yield(st.id, st.maglev(endpointsOf(pe.sp, set(s)))) {
			return
		}
	}
}

// idSource hands out ids: first those the port held before (or the kernel
// held after a restart), then fresh ones. i is ep's place in the set, a
// hint where the port held it before.
type idSource interface {
	serviceID(name proxy.PortName, s set, fe svcKey) uint32
	backendID(svc uint32, ep netip.AddrPort, i int) uint32
}

// desiredPort computes the entries of sp. owner says which port holds each
// frontend; a frontend another port already holds (two Services claiming
// one external IP and port) is left to it, and the ones sp gets are
// recorded; lost hears of the ones it did not get.
func desiredPort(sp *proxy.ServicePort, src idSource, owner map[svcKey]*portEntries, lost func(svcKey)) *portEntries {
	pe := &portEntries{sp: sp}
	fes := frontends(sp)
	pe.fronts = make([]frontend, 0, len(fes))
	for _, fe := range fes {
		if o, ok := owner[fe.key]; ok && o.sp.Name != sp.Name {
			pe.lost = true
			if lost != nil {
				lost(fe.key)
			}
			continue
		}
		owner[fe.key] = pe
		st := &pe.sets[fe.set]
		if st.id == 0 {
			st.id = src.serviceID(sp.Name, fe.set, fe.key)
			st.ids, st.dups = backendIDs(endpointsOf(sp, fe.set), st.id, src)
		}
		if fe.flags&feSrcRange != 0 {
			pe.ranges = sourceRanges(sp, st.id, pe.ranges)
		}
		f := frontend{key: fe.key, val: svcVal{Id: st.id, Count: uint16(len(st.ids)), Flags: fe.flags, Affinity: fe.affinity}, ext: fe.key.Scope == scopeExt}
		// One key listed twice (an address both external and a load
		// balancer's): the last one counts, as in a map.
		if i := slices.IndexFunc(pe.fronts, func(o frontend) bool { return o.key == f.key }); i >= 0 {
			pe.fronts[i] = f
		} else {
			pe.fronts = append(pe.fronts, f)
		}
	}
	return pe
}

// reuse tells whether a full sync can keep pe, built from the same
// ServicePort in an earlier sync, as it is: it got every frontend then,
// and no port before it in this sync has taken one. It then holds them
// again.
func (pe *portEntries) reuse(sp *proxy.ServicePort, owner map[svcKey]*portEntries) bool {
	if pe == nil || pe.sp != sp || pe.lost {
		return false
	}
	for _, f := range pe.fronts {
		if _, ok := owner[f.key]; ok {
			return false
		}
	}
	for _, f := range pe.fronts {
		owner[f.key] = pe
	}
	return true
}

// backendIDs names the backends of eps, service id svc. An endpoint
// listed twice gets one backend; dups are the later places.
func backendIDs(eps []proxy.Endpoint, svc uint32, src idSource) (ids []uint32, dups []int) {
	ids = make([]uint32, len(eps))
	var seen map[netip.AddrPort]int // for large sets only
	if len(eps) > 16 {
		seen = make(map[netip.AddrPort]int, len(eps))
	}
	for i, e := range eps {
		ap := e.AddrPort()
		j := -1
		if seen != nil {
			if k, ok := seen[ap]; ok {
				j = k
			} else {
				seen[ap] = i
			}
		} else {
			j = slices.IndexFunc(eps[:i], func(o proxy.Endpoint) bool { return o.AddrPort() == ap })
		}
		if j >= 0 {
			ids[i] = ids[j]
			dups = append(dups, i)
		} else {
			ids[i] = src.backendID(svc, ap, i)
		}
	}
	return ids, dups
}

// batch is entries to write in one go.
type batch[K comparable, V any] struct {
	keys []K
	vals []V
}

func (b *batch[K, V]) add(k K, v V) {
	b.keys = append(b.keys, k)
	b.vals = append(b.vals, v)
}

// diff is the writes and deletes turning one set of entries into another.
type diff struct {
	putBackends  batch[uint32, backend]
	putSlots     batch[svcKey, svcVal]
	putFrontends batch[svcKey, svcVal]
	delFrontends []svcKey
	delSlots     []svcKey
	delBackends  []uint32
	putRanges    batch[rangeKey, uint8]
	delRanges    []rangeKey
	putMaglev    batch[uint32, maglevTable]
	delMaglev    []uint32
}

// reserve sizes d for a load of ports into empty maps (one frontend and
// one set a port), so 200,000 entries are not copied over and over as
// they grow.
func (d *diff) reserve(ports map[cluster.Key][]*proxy.ServicePort) {
	var fronts, eps int
	for _, sps := range ports {
		for _, sp := range sps {
			fronts++
			eps += len(sp.ClusterEndpoints)
		}
	}
	d.putBackends.keys, d.putBackends.vals = make([]uint32, 0, eps), make([]backend, 0, eps)
	d.putSlots.keys, d.putSlots.vals = make([]svcKey, 0, eps), make([]svcVal, 0, eps)
	d.putFrontends.keys, d.putFrontends.vals = make([]svcKey, 0, fronts), make([]svcVal, 0, fronts)
}

// putService records writing k: a frontend or a slot.
func (d *diff) putService(k svcKey, v svcVal) {
	if k.Slot == 0 {
		d.putFrontends.add(k, v)
	} else {
		d.putSlots.add(k, v)
	}
}

// delService records deleting k: a frontend or a slot.
func (d *diff) delService(k svcKey) {
	if k.Slot == 0 {
		d.delFrontends = append(d.delFrontends, k)
	} else {
		d.delSlots = append(d.delSlots, k)
	}
}

// addRanges records what turns the old source ranges into the new.
func (d *diff) addRanges(old, new map[rangeKey]uint8) {
	for k := range new {
		if _, ok := old[k]; !ok {
			d.putRanges.add(k, 1)
		}
	}
	for k := range old {
		if _, ok := new[k]; !ok {
			d.delRanges = append(d.delRanges, k)
		}
	}
}

// addMaglev records what turns the old Maglev tables into the new.
func (d *diff) addMaglev(old, new map[uint32]maglevTable) {
	for id, t := range new {
		if o, ok := old[id]; !ok || o != t {
			d.putMaglev.add(id, t)
		}
	}
	for id := range old {
		if _, ok := new[id]; !ok {
			d.delMaglev = append(d.delMaglev, id)
		}
	}
}

// add records what turns old into new. old may be nil.
func (d *diff) add(oldS map[svcKey]svcVal, oldB map[uint32]backend, newS map[svcKey]svcVal, newB map[uint32]backend) {
	for id, b := range newB {
		if o, ok := oldB[id]; !ok || o != b {
			d.putBackends.add(id, b)
		}
	}
	for k, v := range newS {
		if o, ok := oldS[k]; !ok || o != v {
			d.putService(k, v)
		}
	}
	for k := range oldS {
		if _, ok := newS[k]; !ok {
			d.delService(k)
		}
	}
	for id := range oldB {
		if _, ok := newB[id]; !ok {
			d.delBackends = append(d.delBackends, id)
		}
	}
}

// apply writes d in the order that keeps every reader consistent. Source
// ranges and Maglev tables go in before the frontends that use them (after
// the backends they name) and out after.
func (d *diff) apply(m *Maps) error {
	if err := m.Backends.Put(d.putBackends.keys, d.putBackends.vals); err != nil {
		return err
	}
	if err := m.Maglev.Put(d.putMaglev.keys, d.putMaglev.vals); err != nil {
		return err
	}
	if err := m.Ranges.Put(d.putRanges.keys, d.putRanges.vals); err != nil {
		return err
	}
	if err := m.Services.Put(d.putSlots.keys, d.putSlots.vals); err != nil {
		return err
	}
	if err := m.Services.Put(d.putFrontends.keys, d.putFrontends.vals); err != nil {
		return err
	}
	if err := m.Services.Delete(d.delFrontends); err != nil {
		return err
	}
	if err := m.Services.Delete(d.delSlots); err != nil {
		return err
	}
	if err := m.Ranges.Delete(d.delRanges); err != nil {
		return err
	}
	if err := m.Maglev.Delete(d.delMaglev); err != nil {
		return err
	}
	return m.Backends.Delete(d.delBackends)
}

// sortedAddrs is used where output must be deterministic.
func sortedAddrs(s []netip.Addr) []netip.Addr {
	s = slices.Clone(s)
	slices.SortFunc(s, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(s)
}
