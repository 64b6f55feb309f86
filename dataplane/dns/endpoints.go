package dns

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"

	"github.com/podnet/podnet/dataplane/cluster"
)

// Endpoint names (<host>.<svc>.<ns>.svc.<zone>) and reverse records are most
// of a cluster's names, so they are kept compact and encoded when asked.
// With a name, an encoded answer, a reverse record set and an owner entry
// of its own for every endpoint, they took ~84 MB of dnsd's 119 MB live
// heap at 10,000 Services × 10 endpoints; now an endpoint is its entry in
// its Service's svcEntry (36 bytes and its host label) and its address in
// the PTR map. Finding and encoding an endpoint's answer takes ~50 ns more
// than copying an encoded one did (an A record 171 against 122 ns at that
// size, BENCHMARKS.md); Service names are answered as before.

// svcEntry is what one Service contributes to the index besides the names
// in snapshot.names: its endpoint names and the reverse records it owns.
// It is immutable once in a snapshot.
type svcEntry struct {
	key  cluster.Key
	name string // the Service's lowercase wire name
	// hosts holds the endpoints' host parts (wire labels without the root)
	// back to back, in the order of eps.
	hosts string
	eps   []epEntry // ready addresses, in slice order
	// byHost is eps' indexes sorted by host part (in slice order among
	// equal ones): the endpoint names, for lookups.
	byHost []uint32
	ports  [][]cluster.EndpointPort // by epEntry.ports: its slice's ports
	// multi holds the answers of the names with more than one address,
	// encoded once, by the position of their first address in byHost.
	multi map[uint32]*node
	// clusterIPs are the addresses whose reverse record is the Service's
	// own name.
	clusterIPs []netip.Addr
	// names are the Service's names in snapshot.names, for its removal.
	names []string
}

// epEntry is one ready endpoint address.
type epEntry struct {
	addr  netip.Addr
	host  uint32 // where its host part starts in svcEntry.hosts
	ports uint32 // its slice's ports: an index in svcEntry.ports
}

// hostAt is the host part of eps[i]'s name.
func (e *svcEntry) hostAt(i int) string {
	end := len(e.hosts)
	if i+1 < len(e.eps) {
		end = int(e.eps[i+1].host)
	}
	return e.hosts[e.eps[i].host:end]
}

// appendTarget appends eps[i]'s full wire name.
func (e *svcEntry) appendTarget(b []byte, i int) []byte {
	return append(append(b, e.hostAt(i)...), e.name...)
}

// entries are eps[i]'s SRV entries for the ports match accepts (all when
// nil). A slice without ports gives one entry without a port, counted only
// when every port is asked for.
func (e *svcEntry) entries(i int, target []byte, match func(cluster.EndpointPort) bool) []srvEntry {
	ep := e.eps[i]
	ports := e.ports[ep.ports]
	if len(ports) == 0 {
		if match == nil {
			return []srvEntry{{addr: ep.addr, port: -1, target: target}}
		}
		return nil
	}
	var es []srvEntry
	for _, p := range ports {
		if match == nil || match(p) {
			es = append(es, srvEntry{addr: ep.addr, port: int32(p.Port), target: target})
		}
	}
	return es
}

// index sorts the endpoint names for lookups and encodes those with more
// than one address.
func (e *svcEntry) index(ttl uint32) {
	if len(e.eps) == 0 {
		return
	}
	e.byHost = make([]uint32, len(e.eps))
	for i := range e.byHost {
		e.byHost[i] = uint32(i)
	}
	slices.SortStableFunc(e.byHost, func(a, b uint32) int { return strings.Compare(e.hostAt(int(a)), e.hostAt(int(b))) })
	for pos := 0; pos < len(e.byHost); {
		n := e.run(pos)
		if n > 1 {
			target := e.appendTarget(nil, int(e.byHost[pos]))
			var es []srvEntry
			for _, i := range e.byHost[pos : pos+n] {
				es = append(es, e.entries(int(i), target, nil)...)
			}
			if e.multi == nil {
				e.multi = map[uint32]*node{}
			}
			e.multi[uint32(pos)] = entryNode(es, ttl)
		}
		pos += n
	}
}

// run is how many addresses from byHost[pos] on share its name.
func (e *svcEntry) run(pos int) int {
	h := e.hostAt(int(e.byHost[pos]))
	n := 1
	for pos+n < len(e.byHost) && e.hostAt(int(e.byHost[pos+n])) == h {
		n++
	}
	return n
}

// find returns where the name with host part host starts in byHost, and
// how many addresses it has (0: no such name). The search is written out:
// with slices.BinarySearchFunc's callback it took a quarter of an
// endpoint query's time.
func (e *svcEntry) find(host []byte) (int, int) {
	lo, hi := 0, len(e.byHost)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if e.hostAt(int(e.byHost[m])) < string(host) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == len(e.byHost) || e.hostAt(int(e.byHost[lo])) != string(host) {
		return 0, 0
	}
	return lo, e.run(lo)
}

// endpoint finds the endpoint name r asks for: <host>.<svc>.<ns>.svc.<zone>.
func (s *snapshot) endpoint(r *request, rel int) (*svcEntry, int, int) {
	if rel < 4 || string(r.label(rel-1)) != "svc" {
		return nil, 0, 0
	}
	e := s.eps[string(r.suffix(rel-3))]
	if e == nil {
		return nil, 0, 0
	}
	pos, n := e.find(r.lower[:r.labels[rel-3]])
	return e, pos, n
}

// endpointAnswer answers an endpoint name: as nodeAnswer would the node
// entryNode encodes for its one address.
func endpointAnswer(buf []byte, r *request, s *snapshot, e *svcEntry, pos, n, zoneOff int) ([]byte, *node, zoneResult) {
	if n > 1 {
		return nodeAnswer(buf, r, s, e.multi[uint32(pos)], ptrTo(zoneOff), zoneOff)
	}
	i := int(e.byHost[pos])
	ep := e.eps[i]
	ports := e.ports[ep.ports]
	switch {
	case r.qtype == typeA && ep.addr.Is4(), r.qtype == typeAAAA && ep.addr.Is6():
		buf = replyHeader(buf, r, flagAA, rcodeSuccess)
		buf = appendAddrRR(buf, ptrTo(headerLen), ep.addr, s.ttl)
		setCounts(buf, 1, 0, 0)
	case r.qtype == typeSRV && len(ports) > 0:
		buf = replyHeader(buf, r, flagAA, rcodeSuccess)
		var tb [256]byte
		target := e.appendTarget(tb[:0], i)
		weight := uint16(max(100/len(ports), 1))
		count := 0
		for j, p := range ports {
			if slices.ContainsFunc(ports[:j], func(q cluster.EndpointPort) bool { return q.Port == p.Port }) {
				continue
			}
			buf = appendSRV(buf, weight, p.Port, target, s.ttl)
			count++
		}
		buf = appendAddrRR(buf, target, ep.addr, s.ttl)
		setCounts(buf, count, 0, 1)
	default:
		return negative(buf, r, s, rcodeSuccess, ptrTo(zoneOff), zoneOff), nil, answered
	}
	return withOPT(buf, r), nil, answered
}

// appendSRV appends an SRV record of priority 0 whose owner is the
// question.
func appendSRV(buf []byte, weight, port uint16, target []byte, ttl uint32) []byte {
	buf = append(buf, ptrTo(headerLen)...)
	buf = binary.BigEndian.AppendUint16(buf, typeSRV)
	buf = binary.BigEndian.AppendUint16(buf, classINET)
	buf = binary.BigEndian.AppendUint32(buf, ttl)
	buf = binary.BigEndian.AppendUint16(buf, uint16(6+len(target)))
	buf = binary.BigEndian.AppendUint16(buf, 0)
	buf = binary.BigEndian.AppendUint16(buf, weight)
	buf = binary.BigEndian.AppendUint16(buf, port)
	return append(buf, target...)
}

// ptrRef is one owner of an address's reverse record: a Service's endpoint
// (eps[ep]) or, with ep -1, the Service itself (a cluster IP).
type ptrRef struct {
	e  *svcEntry
	ep int32
}

func (p ptrRef) appendTarget(b []byte) []byte {
	if p.ep < 0 {
		return append(b, p.e.name...)
	}
	return p.e.appendTarget(b, int(p.ep))
}

// sameTarget reports whether two owners name the same record.
func (p ptrRef) sameTarget(q ptrRef) bool {
	if p.e != q.e || (p.ep < 0) != (q.ep < 0) {
		return false
	}
	return p.ep < 0 || p.e.hostAt(int(p.ep)) == q.e.hostAt(int(q.ep))
}

// comparePTR orders the owners of one address the way their reverse
// records are answered (CoreDNS's order of preference): the Service whose
// cluster IP it is first, then endpoints by Service, in slice order.
func comparePTR(a, b ptrRef) int {
	if (a.ep < 0) != (b.ep < 0) {
		if a.ep < 0 {
			return -1
		}
		return 1
	}
	if a.e != b.e {
		return strings.Compare(a.e.key.String(), b.e.key.String())
	}
	return cmp.Compare(a.ep, b.ep)
}

// appendPTR appends the reverse records of a and how many: the Service
// whose cluster IP it is, else every endpoint name it has.
func (s *snapshot) appendPTR(buf []byte, a netip.Addr) ([]byte, int) {
	var tb [256]byte
	if ref, ok := s.ptr[a]; ok {
		return appendRR(buf, ptrTo(headerLen), typePTR, s.ttl, ref.appendTarget(tb[:0])), 1
	}
	refs := s.ptrMulti[a]
	if len(refs) > 0 && refs[0].ep < 0 {
		refs = refs[:1]
	}
	for _, ref := range refs {
		buf = appendRR(buf, ptrTo(headerLen), typePTR, s.ttl, ref.appendTarget(tb[:0]))
	}
	return buf, len(refs)
}

// claimPTR makes ref an owner of a's reverse record. s.ptr and s.ptrMulti
// must be s's own; their values are never changed in place.
func (s *snapshot) claimPTR(a netip.Addr, ref ptrRef) {
	if cur, ok := s.ptr[a]; ok {
		if cur.sameTarget(ref) {
			return
		}
		delete(s.ptr, a)
		s.ptrMulti[a] = insertPTR([]ptrRef{cur}, ref)
		return
	}
	if refs, ok := s.ptrMulti[a]; ok {
		if !slices.ContainsFunc(refs, ref.sameTarget) {
			s.ptrMulti[a] = insertPTR(slices.Clone(refs), ref)
		}
		return
	}
	s.ptr[a] = ref
}

func insertPTR(refs []ptrRef, ref ptrRef) []ptrRef {
	i, _ := slices.BinarySearchFunc(refs, ref, comparePTR)
	return slices.Insert(refs, i, ref)
}

// releasePTR drops e's claims on a's reverse record.
func (s *snapshot) releasePTR(a netip.Addr, e *svcEntry) {
	if cur, ok := s.ptr[a]; ok {
		if cur.e == e {
			delete(s.ptr, a)
		}
		return
	}
	refs, ok := s.ptrMulti[a]
	if !ok {
		return
	}
	refs = slices.DeleteFunc(slices.Clone(refs), func(r ptrRef) bool { return r.e == e })
	switch len(refs) {
	case 0:
		delete(s.ptrMulti, a)
	case 1:
		delete(s.ptrMulti, a)
		s.ptr[a] = refs[0]
	default:
		s.ptrMulti[a] = refs
	}
}
