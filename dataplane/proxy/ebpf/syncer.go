package ebpf

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/podnet/podnet/bpf"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Syncer turns ServicePorts into map entries: it is the proxy.Backend of
// ebpf mode, apart from loading and attaching the programs.
type Syncer struct {
	maps *Maps
	// nodeAddrs lists the addresses NodePorts answer on, the one to SNAT
	// to first; read on full syncs. nil: none.
	nodeAddrs func() ([]netip.Addr, error)

	applied map[proxy.PortName]*portEntries
	byKey   map[cluster.Key][]proxy.PortName
	owner   map[svcKey]proxy.PortName // frontend (slot 0) -> the port holding it
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
	frontend map[svcKey]uint32
	backends map[uint32]map[netip.AddrPort]uint32
}

func (p previous) serviceID(_ proxy.PortName, st set, fe svcKey) uint32 {
	if p.port != nil {
		if id, ok := p.port.ids.svc[st]; ok {
			return id
		}
	}
	if p.kernel != nil {
		if id, ok := p.kernel.frontend[fe]; ok && !p.s.idTaken(id) {
			return id
		}
	}
	return p.s.freshID()
}

func (p previous) backendID(svc uint32, ep netip.AddrPort) uint32 {
	if p.port != nil {
		if id, ok := p.port.ids.backends[svc][ep]; ok {
			return id
		}
	}
	if p.kernel != nil {
		if id, ok := p.kernel.backends[svc][ep]; ok {
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

func (s *Syncer) full(ports map[cluster.Key][]*proxy.ServicePort) error {
	haveS, err := s.maps.Services.Dump()
	if err != nil {
		return err
	}
	haveB, err := s.maps.Backends.Dump()
	if err != nil {
		return err
	}
	var kernel *kernelIDs
	if s.applied == nil {
		kernel = adopt(haveS, haveB)
		for _, v := range haveS {
			s.nextID = max(s.nextID, v.Id+1)
		}
		for id, be := range haveB {
			s.nextID = max(s.nextID, id+1, be.Svc+1)
		}
	}
	s.taken = make(map[uint32]bool)
	defer func() { s.taken = nil }()
	s.losers = make(map[svcKey]map[cluster.Key]bool)

	applied := make(map[proxy.PortName]*portEntries)
	byKey := make(map[cluster.Key][]proxy.PortName)
	owner := make(map[svcKey]proxy.PortName)
	// Sized for ten endpoints per port: growing maps of 100,000 entries
	// rehashes them several times.
	wantS := make(map[svcKey]svcVal, 11*len(ports))
	wantB := make(map[uint32]backend, 10*len(ports))
	wantR := make(map[rangeKey]uint8)
	wantM := make(map[uint32]maglevTable)
	keys := make([]cluster.Key, 0, len(ports))
	for k := range ports {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b cluster.Key) int { return cmp.Compare(a.String(), b.String()) })
	for _, k := range keys {
		for _, sp := range ports[k] {
			pe := desiredPort(sp, previous{s: s, port: s.applied[sp.Name], kernel: kernel}, owner, s.lose(sp))
			for _, id := range pe.ids.svc {
				s.taken[id] = true
			}
			applied[sp.Name] = pe
			byKey[k] = append(byKey[k], sp.Name)
			for fk, v := range pe.services {
				wantS[fk] = v
			}
			for id, b := range pe.backends {
				wantB[id] = b
			}
			maps.Copy(wantR, pe.ranges)
			maps.Copy(wantM, pe.maglev)
		}
	}
	haveR, err := s.maps.Ranges.Dump()
	if err != nil {
		return err
	}
	haveM, err := s.maps.Maglev.Dump()
	if err != nil {
		return err
	}
	d := newDiff()
	d.add(haveS, haveB, wantS, wantB)
	d.addRanges(haveR, wantR)
	d.addMaglev(haveM, wantM)
	if err := d.apply(s.maps); err != nil {
		return err
	}
	if err := s.syncNodeAddrs(); err != nil {
		return err
	}
	s.applied, s.byKey, s.owner = applied, byKey, owner
	s.services, s.backends = len(wantS), len(wantB)
	s.trackUDP(haveB, wantB)
	return nil
}

// trackUDP counts the UDP backends a full sync left in the maps and notes
// those the kernel held but nothing wants now (before a restart too).
func (s *Syncer) trackUDP(haveB, wantB map[uint32]backend) {
	refs := make(map[netip.AddrPort]int)
	for _, b := range wantB {
		if b.Proto == 17 {
			refs[backendAddr(b)]++
		}
	}
	for _, b := range haveB {
		if ap := backendAddr(b); b.Proto == 17 && refs[ap] == 0 {
			s.removedUDP = append(s.removedUDP, ap)
		}
	}
	s.removedUDP = slices.Compact(sortedAddrPorts(s.removedUDP))
	s.udpRefs = refs
}

// adopt reads the ids of the entries in the maps.
func adopt(haveS map[svcKey]svcVal, haveB map[uint32]backend) *kernelIDs {
	k := &kernelIDs{frontend: make(map[svcKey]uint32), backends: make(map[uint32]map[netip.AddrPort]uint32)}
	for key, v := range haveS {
		if key.Slot == 0 {
			k.frontend[key] = v.Id
		}
	}
	for id, be := range haveB {
		m := k.backends[be.Svc]
		if m == nil {
			m = make(map[netip.AddrPort]uint32)
			k.backends[be.Svc] = m
		}
		m[netip.AddrPortFrom(addrFrom16(be.Addr), be16(be.Port))] = id
	}
	return k
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
		for _, name := range s.byKey[k] {
			for fk := range s.applied[name].services {
				if fk.Slot != 0 || s.owner[fk] != name {
					continue
				}
				delete(s.owner, fk)
				for w := range s.losers[fk] {
					if !out[w] {
						out[w] = true
						queue = append(queue, w)
					}
				}
				delete(s.losers, fk)
			}
		}
	}
	return out
}

func (s *Syncer) partial(ports map[cluster.Key][]*proxy.ServicePort, changed map[cluster.Key]bool) error {
	d := newDiff()
	applied := make(map[proxy.PortName]*portEntries)
	changed = s.release(changed)
	// One diff over all changed Services: a frontend handed from one to
	// another is then a rewrite, not a put and a delete.
	oldS, oldB, oldR, oldM := make(map[svcKey]svcVal), make(map[uint32]backend), make(map[rangeKey]uint8), make(map[uint32]maglevTable)
	newS, newB, newR, newM := make(map[svcKey]svcVal), make(map[uint32]backend), make(map[rangeKey]uint8), make(map[uint32]maglevTable)
	for k := range changed {
		for _, name := range s.byKey[k] {
			pe := s.applied[name]
			maps.Copy(oldS, pe.services)
			maps.Copy(oldB, pe.backends)
			maps.Copy(oldR, pe.ranges)
			maps.Copy(oldM, pe.maglev)
		}
		for _, sp := range ports[k] {
			pe := desiredPort(sp, previous{s: s, port: s.applied[sp.Name]}, s.owner, s.lose(sp))
			applied[sp.Name] = pe
			maps.Copy(newS, pe.services)
			maps.Copy(newB, pe.backends)
			maps.Copy(newR, pe.ranges)
			maps.Copy(newM, pe.maglev)
		}
	}
	d.add(oldS, oldB, newS, newB)
	d.addRanges(oldR, newR)
	d.addMaglev(oldM, newM)
	// On failure the syncer's state is dropped with synced=false; the
	// next full sync starts from what the kernel holds.
	if err := d.apply(s.maps); err != nil {
		return err
	}
	var added []uint32
	for id := range d.putBackends {
		if _, ok := oldB[id]; !ok {
			added = append(added, id)
		}
	}
	s.countUDP(newB, added, 1)
	s.countUDP(oldB, d.delBackends, -1)
	for k := range changed {
		for _, name := range s.byKey[k] {
			pe := s.applied[name]
			s.services -= len(pe.services)
			s.backends -= len(pe.backends)
			delete(s.applied, name)
		}
		s.byKey[k] = nil
		for _, sp := range ports[k] {
			pe := applied[sp.Name]
			s.applied[sp.Name] = pe
			s.byKey[k] = append(s.byKey[k], sp.Name)
			s.services += len(pe.services)
			s.backends += len(pe.backends)
		}
		if len(s.byKey[k]) == 0 {
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
	var snat bpf.NodeportSnatAddr
	if len(addrs) > 0 {
		snat.Addr = addr16(addrs[0])
	}
	if err := s.maps.SNAT.Put(map[uint32]bpf.NodeportSnatAddr{0: snat}); err != nil {
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
	for k := range want {
		if _, ok := have[k]; ok {
			delete(want, k)
		}
	}
	if err := s.maps.NodeAddrs.Put(want); err != nil {
		return err
	}
	return s.maps.NodeAddrs.Delete(stale)
}

func sortedAddrPorts(s []netip.AddrPort) []netip.AddrPort {
	slices.SortFunc(s, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return s
}
