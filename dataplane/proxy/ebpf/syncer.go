package ebpf

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/podnet/podnet/bpf"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Syncer turns ServicePorts into map entries: it is the proxy.Backend of
// ebpf mode, apart from loading and attaching the programs.
type Syncer struct {
	maps *Maps
	// nodeAddrs lists the addresses NodePorts answer on, the one to SNAT
	// to first; read on full syncs. nil: none.
	nodeAddrs func() ([]netip.Addr, error)

	// byKey holds what each Service's ports own in the maps; nil until a
	// full sync succeeded.
	byKey map[cluster.Key][]*portEntries
	owner map[svcKey]*portEntries // frontend (slot 0) -> the port holding it
	// losers are the Services that wanted a frontend another one held:
	// when the holder lets go, they are synced again to take it.
	losers map[svcKey]map[cluster.Key]bool
	nextID uint32
	// synced is false until a full sync succeeded, and after any failure:
	// the next sync is then full and compares with what the kernel holds.
	synced   bool
	taken    map[uint32]bool // service ids handed out in this full sync
	services int             // entries in the services map
	backends int
	// udpRefs counts the UDP backend entries per endpoint; removedUDP
	// collects the endpoints that dropped out of all of them, for
	// TakeRemovedUDP.
	udpRefs    map[netip.AddrPort]int
	removedUDP []netip.AddrPort
	// movedUDP are the UDP backends a partial sync took away from a
	// frontend (the endpoint may still serve elsewhere), for TakeMovedUDP:
	// the tc programs' frontends (flows) and socket LB's (sockets).
	movedUDP moved
}

// moved are the (frontend, backend) pairs of UDP that left, by who pinned
// clients to them.
type moved struct {
	// Flows are the external frontends' pairs, whose flows from outside
	// the tc programs pinned.
	Flows []FlowTarget
	// Sockets are socket LB's pairs, whose connected sockets it pinned.
	Sockets []FlowTarget
}

// NewSyncer returns a Syncer writing to maps.
func NewSyncer(maps *Maps, nodeAddrs func() ([]netip.Addr, error)) *Syncer {
	return &Syncer{maps: maps, nodeAddrs: nodeAddrs, nextID: 1, udpRefs: make(map[netip.AddrPort]int)}
}

// TakeRemovedUDP returns the UDP endpoints no Service uses any more since
// the last call: connected sockets pinned to them are to be destroyed.
func (s *Syncer) TakeRemovedUDP() []netip.AddrPort {
	out := s.removedUDP
	s.removedUDP = nil
	return out
}

// TakeMovedUDP returns, since the last call, the UDP backends frontends
// no longer send to, each with its frontend: flows from outside (tc
// programs' frontends) pinned to them are to be expired, and connected
// sockets (socket LB's) destroyed. Endpoints no Service uses any more
// (TakeRemovedUDP) are not repeated here.
func (s *Syncer) TakeMovedUDP() (flows, sockets []FlowTarget) {
	out := s.movedUDP
	s.movedUDP = moved{}
	return out.Flows, out.Sockets
}

// udpPairs lists the (frontend, backend) pairs of e's UDP frontends in
// scope.
func udpPairs(e entries, scope uint8) map[FlowTarget]bool {
	out := make(map[FlowTarget]bool)
	for k, v := range e.services {
		if k.Slot == 0 || k.Scope != scope || k.Proto != protoNum(cluster.UDP) {
			continue
		}
		if b, ok := e.backends[v.Id]; ok {
			fe := netip.AddrPortFrom(addrFrom16(k.Addr), be16(k.Port))
			out[FlowTarget{Frontend: fe, Backend: backendAddr(b)}] = true
		}
	}
	return out
}

// moveUDP notes the UDP pairs old had and new has not, in both scopes,
// leaving out endpoints no Service uses any more (removedUDP holds them
// whole).
func (s *Syncer) moveUDP(old, new entries) {
	gone := func(scope uint8) []FlowTarget {
		now := udpPairs(new, scope)
		var out []FlowTarget
		for ft := range udpPairs(old, scope) {
			if !now[ft] && s.udpRefs[ft.Backend] > 0 {
				out = append(out, ft)
			}
		}
		return out
	}
	s.movedUDP.Flows = append(s.movedUDP.Flows, gone(scopeExt)...)
	s.movedUDP.Sockets = append(s.movedUDP.Sockets, gone(scopeSock)...)
}

func backendAddr(b backend) netip.AddrPort {
	return netip.AddrPortFrom(addrFrom16(b.Addr), be16(b.Port))
}

// countUDP adds delta to the count of every UDP backend in bs, noting the
// endpoints whose count drops to zero.
func (s *Syncer) countUDP(bs map[uint32]backend, ids []uint32, delta int) {
	for _, id := range ids {
		b, ok := bs[id]
		if !ok || b.Proto != 17 {
			continue
		}
		ap := backendAddr(b)
		s.udpRefs[ap] += delta
		if s.udpRefs[ap] <= 0 {
			delete(s.udpRefs, ap)
			s.removedUDP = append(s.removedUDP, ap)
		}
	}
}

var _ proxy.Backend = (*Syncer)(nil)

// Sync implements proxy.Backend.
func (s *Syncer) Sync(ports map[cluster.Key][]*proxy.ServicePort, changed map[cluster.Key]bool, full bool) (proxy.SyncResult, error) {
	var err error
	if full || !s.synced {
		err = s.full(ports)
	} else {
		err = s.partial(ports, changed)
	}
	s.synced = err == nil
	if err != nil {
		return proxy.SyncResult{}, err
	}
	return proxy.SyncResult{Rules: map[string]int{"services": s.services, "backends": s.backends}}, nil
}

// held returns the entries Service k's port of sp's name and family held;
// nil if none. A dual-stack Service has a port of each family under one
// name: each has ids of its own.
func (s *Syncer) held(k cluster.Key, sp *proxy.ServicePort) *portEntries {
	for _, pe := range s.byKey[k] {
		if pe.sp.Name == sp.Name && pe.sp.Family() == sp.Family() {
			return pe
		}
	}
	return nil
}

// previous hands out the ids a port held, then those the kernel held for
// its frontends (after a restart), then fresh ones.
type previous struct {
	s      *Syncer
	port   *portEntries // what the port held; may be nil
	kernel *kernelIDs   // may be nil
}

// kernelIDs are the ids found in the maps when the syncer had no state of
// its own (a restart): reusing them keeps entries, and affinity, in place.
type kernelIDs struct {
	services map[svcKey]svcVal // the frontends (slot 0)
	backends map[kernelBackend]uint32
}

// kernelBackend names a backend entry by its service and endpoint.
type kernelBackend struct {
	svc  uint32
	addr [16]byte
	port uint16
}

func (p previous) serviceID(_ proxy.PortName, st set, fe svcKey) uint32 {
	if p.port != nil && p.port.sets[st].id != 0 {
		return p.port.sets[st].id
	}
	if p.kernel != nil {
		if v, ok := p.kernel.services[fe]; ok && !p.s.idTaken(v.Id) {
			return v.Id
		}
	}
	return p.s.freshID()
}

func (p previous) backendID(svc uint32, ep netip.AddrPort, i int) uint32 {
	if p.port != nil {
		if s, st := p.port.set(svc); st != nil {
			eps := endpointsOf(p.port.sp, s)
			// The endpoints come sorted: mostly in the same place as
			// before, or one further or back.
			for _, j := range [3]int{i, i - 1, i + 1} {
				if j >= 0 && j < len(eps) && eps[j].AddrPort() == ep {
					return st.ids[j]
				}
			}
			if j := slices.IndexFunc(eps, func(e proxy.Endpoint) bool { return e.AddrPort() == ep }); j >= 0 {
				return st.ids[j]
			}
		}
	}
	if p.kernel != nil {
		if id, ok := p.kernel.backends[kernelBackend{svc, addr16(ep.Addr()), be16(ep.Port())}]; ok {
			return id
		}
	}
	return p.s.freshID()
}

func (s *Syncer) freshID() uint32 {
	id := s.nextID
	s.nextID++
	return id
}

// idTaken is only consulted while adopting kernel ids in a full sync,
// where taken collects the service ids handed out so far.
func (s *Syncer) idTaken(id uint32) bool { return s.taken[id] }

// fullSync is the state of one full sync: the ports it wants, by service
// id, and the writes and deletes found so far.
type fullSync struct {
	bySvc    map[uint32]*portEntries
	held     int // entries in the services map
	d        diff
	services int
	backends int
	udpRefs  map[netip.AddrPort]int
	// staleUDP are UDP endpoints whose kernel entries were rewritten or
	// are unwanted: removed unless a wanted backend still uses them.
	staleUDP []netip.AddrPort
}

// compare reads what the maps hold, in batches, and matches every entry
// to the port wanting it (through the frontend's owner, or the service
// id): entries nobody wants are deleted, wrong ones rewritten, and each
// port counts those it found. No map of either side's 200,000 entries is
// built: a periodic full sync at 10,000 Services × 10 allocated 15 MB of
// such maps (BENCHMARKS.md).
func (f *fullSync) compare(m *Maps, owner map[svcKey]*portEntries) error {
	err := m.Services.Each(func(k svcKey, v svcVal) {
		f.held++
		fk := k
		fk.Slot = 0
		pe := owner[fk]
		want, ok := pe.serviceAt(k)
		if !ok {
			f.d.delService(k)
			return
		}
		pe.seen++
		if v != want {
			f.d.putService(k, want)
		}
	})
	if err != nil {
		return err
	}
	if err := m.Backends.Each(func(id uint32, b backend) {
		pe := f.bySvc[b.Svc]
		want, ok := pe.backendAt(id, b.Svc)
		if !ok {
			f.d.delBackends = append(f.d.delBackends, id)
			if b.Proto == 17 {
				f.staleUDP = append(f.staleUDP, backendAddr(b))
			}
			return
		}
		pe.seen++
		if b != want {
			f.d.putBackends.add(id, want)
			if b.Proto == 17 {
				f.staleUDP = append(f.staleUDP, backendAddr(b))
			}
		}
	}); err != nil {
		return err
	}
	if err := m.Ranges.Each(func(k rangeKey, _ uint8) {
		if pe := f.bySvc[k.Svc]; pe != nil && slices.Contains(pe.ranges, k) {
			pe.seen++
			return
		}
		f.d.delRanges = append(f.d.delRanges, k)
	}); err != nil {
		return err
	}
	return m.Maglev.Each(func(id uint32, t maglevTable) {
		pe := f.bySvc[id]
		want, ok := pe.maglevOf(id)
		if !ok {
			f.d.delMaglev = append(f.d.delMaglev, id)
			return
		}
		pe.seen++
		if t != want {
			f.d.putMaglev.add(id, want)
		}
	})
}

// want counts pe's entries and writes them all unless the kernel held
// every one (right or rewritten by compare): writing one again is
// harmless, and a port missing entries is rare but after a load into
// empty maps.
func (f *fullSync) want(pe *portEntries) {
	nS, nB, nO := pe.count()
	f.services += nS
	f.backends += nB
	if pe.sp.Protocol == cluster.UDP {
		for _, b := range pe.backends {
			f.udpRefs[backendAddr(b)]++
		}
	}
	if pe.seen == nS+nB+nO {
		return
	}
	for id, b := range pe.backends {
		f.d.putBackends.add(id, b)
	}
	for k, v := range pe.services {
		f.d.putService(k, v)
	}
	for k := range pe.rangeEntries {
		f.d.putRanges.add(k, 1)
	}
	for id, t := range pe.maglev {
		f.d.putMaglev.add(id, t)
	}
}

func (s *Syncer) full(ports map[cluster.Key][]*proxy.ServicePort) error {
	var kernel *kernelIDs
	if s.byKey == nil {
		var err error
		if kernel, err = s.adopt(); err != nil {
			return err
		}
		s.taken = make(map[uint32]bool)
		defer func() { s.taken = nil }()
	}
	s.losers = make(map[svcKey]map[cluster.Key]bool)

	byKey := make(map[cluster.Key][]*portEntries, len(ports))
	owner := make(map[svcKey]*portEntries, len(ports))
	f := &fullSync{bySvc: make(map[uint32]*portEntries, len(ports)), udpRefs: make(map[netip.AddrPort]int)}
	var all, scratch []*portEntries
	// The UDP ports rebuilt, as they were and as they are: a change a
	// full sync carries moves UDP clients as a partial sync's does.
	udpNew := newEntries()
	for _, k := range sortedKeys(ports) {
		pes := scratch[:0]
		for _, sp := range ports[k] {
			// Ports unchanged since the last sync keep their entries:
			// a periodic full sync then allocates little.
			pe := s.held(k, sp)
			if !pe.reuse(sp, owner) {
				pe = desiredPort(sp, previous{s: s, port: pe, kernel: kernel}, owner, s.lose(sp))
				if sp.Protocol == cluster.UDP {
					udpNew.add(pe)
				}
			}
			pe.seen = 0
			for _, st := range pe.sets {
				if st.id != 0 {
					f.bySvc[st.id] = pe
					if kernel != nil {
						s.taken[st.id] = true
					}
				}
			}
			pes = append(pes, pe)
			all = append(all, pe)
		}
		// Most ports are kept as they were: their list too.
		scratch = pes
		if held := s.byKey[k]; slices.Equal(held, pes) {
			byKey[k] = held
		} else {
			byKey[k] = slices.Clone(pes)
		}
	}
	if err := f.compare(s.maps, owner); err != nil {
		return err
	}
	if f.held == 0 {
		f.d.reserve(ports)
	}
	for _, pe := range all {
		f.want(pe)
	}
	if err := f.d.apply(s.maps); err != nil {
		return err
	}
	if err := s.syncNodeAddrs(); err != nil {
		return err
	}
	s.services, s.backends = f.services, f.backends
	for _, ap := range f.staleUDP {
		if f.udpRefs[ap] == 0 {
			s.removedUDP = append(s.removedUDP, ap)
		}
	}
	s.removedUDP = slices.Compact(sortedAddrPorts(s.removedUDP))
	s.udpRefs = f.udpRefs
	s.moveUDP(s.replacedUDP(byKey), udpNew)
	s.byKey, s.owner = byKey, owner
	return nil
}

// replacedUDP is the UDP ports of the last sync a full sync did not keep
// (its byKey holds other entries for them, or none).
func (s *Syncer) replacedUDP(byKey map[cluster.Key][]*portEntries) entries {
	old := newEntries()
	for k, pes := range s.byKey {
		for _, pe := range pes {
			if pe.sp.Protocol == cluster.UDP && !slices.Contains(byKey[k], pe) {
				old.add(pe)
			}
		}
	}
	return old
}

// sortedKeys orders a full sync, which decides who gets a frontend two
// Services claim: by "namespace/name", compared without building the
// strings (10,000 of them a full sync).
func sortedKeys(ports map[cluster.Key][]*proxy.ServicePort) []cluster.Key {
	keys := slices.AppendSeq(make([]cluster.Key, 0, len(ports)), maps.Keys(ports))
	slices.SortFunc(keys, compareSlashed)
	return keys
}

// compareSlashed compares a and b as their "namespace/name" strings.
func compareSlashed(a, b cluster.Key) int {
	at := func(k cluster.Key, i int) (byte, bool) {
		switch {
		case i < len(k.Namespace):
			return k.Namespace[i], true
		case i == len(k.Namespace):
			return '/', true
		case i-len(k.Namespace)-1 < len(k.Name):
			return k.Name[i-len(k.Namespace)-1], true
		}
		return 0, false
	}
	for i := 0; ; i++ {
		x, okA := at(a, i)
		y, okB := at(b, i)
		switch {
		case !okA || !okB:
			return cmp.Compare(len(a.Namespace)+len(a.Name), len(b.Namespace)+len(b.Name))
		case x != y:
			return cmp.Compare(x, y)
		}
	}
}

// adopt reads the ids of the entries in the maps, for a syncer that has
// none of its own (a restart), and hands out new ids above them.
func (s *Syncer) adopt() (*kernelIDs, error) {
	k := &kernelIDs{services: make(map[svcKey]svcVal), backends: make(map[kernelBackend]uint32)}
	if err := s.maps.Services.Each(func(key svcKey, v svcVal) {
		s.nextID = max(s.nextID, v.Id+1)
		if key.Slot == 0 {
			k.services[key] = v
		}
	}); err != nil {
		return nil, err
	}
	if err := s.maps.Backends.Each(func(id uint32, be backend) {
		s.nextID = max(s.nextID, id+1, be.Svc+1)
		k.backends[kernelBackend{be.Svc, be.Addr, be.Port}] = id
	}); err != nil {
		return nil, err
	}
	return k, nil
}

// lose returns the callback recording that sp did not get a frontend.
func (s *Syncer) lose(sp *proxy.ServicePort) func(svcKey) {
	return func(fk svcKey) {
		m := s.losers[fk]
		if m == nil {
			m = make(map[cluster.Key]bool)
			s.losers[fk] = m
		}
		m[sp.Name.Service] = true
	}
}

// release gives up the frontends the Services in changed hold, adding to
// changed the Services waiting for them.
func (s *Syncer) release(changed map[cluster.Key]bool) map[cluster.Key]bool {
	out := make(map[cluster.Key]bool, len(changed))
	queue := make([]cluster.Key, 0, len(changed))
	for k := range changed {
		out[k] = true
		queue = append(queue, k)
	}
	for len(queue) > 0 {
		k := queue[0]
		queue = queue[1:]
		for _, pe := range s.byKey[k] {
			for _, f := range pe.fronts {
				if o := s.owner[f.key]; o != pe {
					continue
				}
				delete(s.owner, f.key)
				for w := range s.losers[f.key] {
					if !out[w] {
						out[w] = true
						queue = append(queue, w)
					}
				}
				delete(s.losers, f.key)
			}
		}
	}
	return out
}

// entries collects the entries of ports, for a partial sync's diff.
type entries struct {
	services map[svcKey]svcVal
	backends map[uint32]backend
	ranges   map[rangeKey]uint8
	maglev   map[uint32]maglevTable
}

func newEntries() entries {
	return entries{make(map[svcKey]svcVal), make(map[uint32]backend), make(map[rangeKey]uint8), make(map[uint32]maglevTable)}
}

func (e entries) add(pe *portEntries) {
	maps.Insert(e.services, pe.services)
	maps.Insert(e.backends, pe.backends)
	maps.Insert(e.ranges, pe.rangeEntries)
	maps.Insert(e.maglev, pe.maglev)
}

func (s *Syncer) partial(ports map[cluster.Key][]*proxy.ServicePort, changed map[cluster.Key]bool) error {
	changed = s.release(changed)
	// One diff over all changed Services: a frontend handed from one to
	// another is then a rewrite, not a put and a delete.
	old, new := newEntries(), newEntries()
	byKey := make(map[cluster.Key][]*portEntries, len(changed))
	for k := range changed {
		for _, pe := range s.byKey[k] {
			old.add(pe)
		}
		for _, sp := range ports[k] {
			pe := desiredPort(sp, previous{s: s, port: s.held(k, sp)}, s.owner, s.lose(sp))
			byKey[k] = append(byKey[k], pe)
			new.add(pe)
		}
	}
	var d diff
	d.add(old.services, old.backends, new.services, new.backends)
	d.addRanges(old.ranges, new.ranges)
	d.addMaglev(old.maglev, new.maglev)
	// On failure the syncer's state is dropped with synced=false; the
	// next full sync starts from what the kernel holds.
	if err := d.apply(s.maps); err != nil {
		return err
	}
	var added []uint32
	for _, id := range d.putBackends.keys {
		if _, ok := old.backends[id]; !ok {
			added = append(added, id)
		}
	}
	s.countUDP(new.backends, added, 1)
	s.countUDP(old.backends, d.delBackends, -1)
	s.moveUDP(old, new)
	s.services += len(new.services) - len(old.services)
	s.backends += len(new.backends) - len(old.backends)
	for k := range changed {
		if pes := byKey[k]; len(pes) > 0 {
			s.byKey[k] = pes
		} else {
			delete(s.byKey, k)
		}
	}
	return nil
}

func (s *Syncer) syncNodeAddrs() error {
	var addrs []netip.Addr
	if s.nodeAddrs != nil {
		var err error
		if addrs, err = s.nodeAddrs(); err != nil {
			return fmt.Errorf("list node addresses: %w", err)
		}
	}
	if err := s.maps.SNAT.Put([]uint32{snatIPv4, snatIPv6}, snatAddrs(addrs)); err != nil {
		return err
	}
	want := nodeAddrEntries(addrs)
	have, err := s.maps.NodeAddrs.Dump()
	if err != nil {
		return err
	}
	var stale []nodeKey
	for k := range have {
		if _, ok := want[k]; !ok {
			stale = append(stale, k)
		}
	}
	var put batch[nodeKey, uint8]
	for k, v := range want {
		if _, ok := have[k]; !ok {
			put.add(k, v)
		}
	}
	if err := s.maps.NodeAddrs.Put(put.keys, put.vals); err != nil {
		return err
	}
	return s.maps.NodeAddrs.Delete(stale)
}

// The SNAT map's keys (bpf/nodeport.c, SNAT_V4 and SNAT_V6).
const (
	snatIPv4 uint32 = 0
	snatIPv6 uint32 = 1
)

// snatAddrs are the SNAT map's values for node addresses addrs: the first
// address of each family (addrs lists the preferred first), zero where the
// node has none.
func snatAddrs(addrs []netip.Addr) []bpf.NodeportSnatAddr {
	out := make([]bpf.NodeportSnatAddr, 2)
	for _, a := range addrs {
		i := snatIPv4
		if ipfamily.Of(a.Unmap()) == ipfamily.IPv6 {
			i = snatIPv6
		}
		if out[i].Addr == [16]byte{} {
			out[i].Addr = addr16(a)
		}
	}
	return out
}

func sortedAddrPorts(s []netip.AddrPort) []netip.AddrPort {
	slices.SortFunc(s, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return s
}
