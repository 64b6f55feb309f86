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
// zero address (NodePort wildcard) is all zeroes.
func addr16(a netip.Addr) [16]byte {
	if !a.IsValid() {
		return [16]byte{}
	}
	return netip.AddrFrom16(a.As16()).As16()
}

// addrFrom16 is the inverse of addr16.
func addrFrom16(b [16]byte) netip.Addr {
	if b == [16]byte{} {
		return netip.Addr{}
	}
	return netip.AddrFrom16(b).Unmap()
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
		out = append(out, mk(scopeSock, netip.Addr{}, sp.NodePort, fromPods, 0), mk(scopeExt, netip.Addr{}, sp.NodePort, fromOutside, local))
	}
	return out
}

// sourceRanges are the LPM entries letting sp's ranges reach service id.
func sourceRanges(sp *proxy.ServicePort, id uint32, into map[rangeKey]uint8) {
	for _, r := range sp.LoadBalancerSourceRanges {
		bits := r.Bits()
		if r.Addr().Is4() {
			bits += 96
		}
		into[rangeKey{Prefixlen: uint32(32 + bits), Svc: id, Addr: addr16(r.Masked().Addr())}] = 1
	}
}

func endpointsOf(sp *proxy.ServicePort, s set) []netip.AddrPort {
	eps := sp.ClusterEndpoints
	if s == setLocal {
		eps = sp.LocalEndpoints
	}
	out := make([]netip.AddrPort, 0, len(eps))
	for _, e := range eps {
		out = append(out, e.AddrPort())
	}
	return out
}

// ids are the service and backend ids a port holds; they survive syncs so
// an unchanged backend keeps its entry.
type ids struct {
	svc      map[set]uint32
	backends map[uint32]map[netip.AddrPort]uint32 // svc id -> endpoint -> backend id
}

// portEntries is every map entry one ServicePort owns.
type portEntries struct {
	ids      ids
	services map[svcKey]svcVal
	backends map[uint32]backend
	ranges   map[rangeKey]uint8
	maglev   map[uint32]maglevTable // by service id, for the tc programs
}

// idSource hands out ids: first those the port held before (or the kernel
// held after a restart), then fresh ones.
type idSource interface {
	serviceID(name proxy.PortName, s set, fe svcKey) uint32
	backendID(svc uint32, ep netip.AddrPort) uint32
}

// desiredPort computes the entries of sp. owner says which port holds each
// frontend; a frontend another port already holds (two Services claiming
// one external IP and port) is left to it, and the ones sp gets are
// recorded; lost hears of the ones it did not get.
func desiredPort(sp *proxy.ServicePort, src idSource, owner map[svcKey]proxy.PortName, lost func(svcKey)) *portEntries {
	pe := &portEntries{
		ids:      ids{svc: map[set]uint32{}, backends: map[uint32]map[netip.AddrPort]uint32{}},
		services: make(map[svcKey]svcVal),
		backends: make(map[uint32]backend),
		ranges:   make(map[rangeKey]uint8),
		maglev:   make(map[uint32]maglevTable),
	}
	proto := protoNum(sp.Protocol)
	for _, fe := range frontends(sp) {
		if o, ok := owner[fe.key]; ok && o != sp.Name {
			if lost != nil {
				lost(fe.key)
			}
			continue
		}
		owner[fe.key] = sp.Name
		id, ok := pe.ids.svc[fe.set]
		if !ok {
			id = src.serviceID(sp.Name, fe.set, fe.key)
			pe.ids.svc[fe.set] = id
			byEP := make(map[netip.AddrPort]uint32)
			for _, ep := range endpointsOf(sp, fe.set) {
				bid := src.backendID(id, ep)
				byEP[ep] = bid
				pe.backends[bid] = backend{Addr: addr16(ep.Addr()), Port: be16(ep.Port()), Proto: proto, Svc: id}
			}
			pe.ids.backends[id] = byEP
		}
		if fe.flags&feSrcRange != 0 {
			sourceRanges(sp, id, pe.ranges)
		}
		eps := endpointsOf(sp, fe.set)
		if _, done := pe.maglev[id]; fe.key.Scope == scopeExt && len(eps) > 0 && !done {
			bids := make([]uint32, len(eps))
			for i, ep := range eps {
				bids[i] = pe.ids.backends[id][ep]
			}
			pe.maglev[id] = maglev(eps, bids)
		}
		pe.services[fe.key] = svcVal{Id: id, Count: uint16(len(eps)), Flags: fe.flags, Affinity: fe.affinity}
		for i, ep := range eps {
			k := fe.key
			k.Slot = uint16(i + 1)
			pe.services[k] = svcVal{Id: pe.ids.backends[id][ep]}
		}
	}
	return pe
}

// diff is the writes and deletes turning one set of entries into another.
type diff struct {
	putBackends  map[uint32]backend
	putSlots     map[svcKey]svcVal
	putFrontends map[svcKey]svcVal
	delFrontends []svcKey
	delSlots     []svcKey
	delBackends  []uint32
	putRanges    map[rangeKey]uint8
	delRanges    []rangeKey
	putMaglev    map[uint32]maglevTable
	delMaglev    []uint32
}

func newDiff() *diff {
	return &diff{putBackends: map[uint32]backend{}, putSlots: map[svcKey]svcVal{}, putFrontends: map[svcKey]svcVal{}, putRanges: map[rangeKey]uint8{}, putMaglev: map[uint32]maglevTable{}}
}

// addRanges records what turns the old source ranges into the new.
func (d *diff) addRanges(old, new map[rangeKey]uint8) {
	for k := range new {
		if _, ok := old[k]; !ok {
			d.putRanges[k] = 1
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
			d.putMaglev[id] = t
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
			d.putBackends[id] = b
		}
	}
	for k, v := range newS {
		if o, ok := oldS[k]; ok && o == v {
			continue
		}
		if k.Slot == 0 {
			d.putFrontends[k] = v
		} else {
			d.putSlots[k] = v
		}
	}
	for k := range oldS {
		if _, ok := newS[k]; ok {
			continue
		}
		if k.Slot == 0 {
			d.delFrontends = append(d.delFrontends, k)
		} else {
			d.delSlots = append(d.delSlots, k)
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
	if err := m.Backends.Put(d.putBackends); err != nil {
		return err
	}
	if err := m.Maglev.Put(d.putMaglev); err != nil {
		return err
	}
	if err := m.Ranges.Put(d.putRanges); err != nil {
		return err
	}
	if err := m.Services.Put(d.putSlots); err != nil {
		return err
	}
	if err := m.Services.Put(d.putFrontends); err != nil {
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
