package dns

import (
	"net/netip"
)

// Wire encoding of the index's records: every answer is encoded once, when
// a Service changes, with its owner written as a compression pointer to the
// question, so answering a query only appends bytes.

// rrset is a run of encoded records of one section, ready to append.
type rrset struct {
	an []byte
	n  uint16
	ex []byte // additional records (SRV targets' addresses)
	nx uint16
}

// node is everything a name owns: its answers for A, AAAA, SRV (then the
// SRV targets' addresses for the additional section) and TXT, back to back
// in one exact-size allocation; with tens of thousands of names the index
// stays small.
type node struct {
	wire  []byte
	end   [numParts]uint32 // where each part ends in wire
	count [numParts]uint16 // records in each part
	// cname is an ExternalName target; answers for it take the slow path.
	cname string
}

const (
	partA = iota
	partAAAA
	partSRV
	partSRVExtra
	partTXT
	numParts
)

// part returns the records of one part and how many there are.
func (n *node) part(i int) ([]byte, int) {
	start := uint32(0)
	if i > 0 {
		start = n.end[i-1]
	}
	return n.wire[start:n.end[i]], int(n.count[i])
}

// packNode builds a node from its record sets.
func packNode(a, aaaa, srv, txt rrset, cname string) *node {
	n := &node{cname: cname}
	parts := [numParts]struct {
		b []byte
		c uint16
	}{{a.an, a.n}, {aaaa.an, aaaa.n}, {srv.an, srv.n}, {srv.ex, srv.nx}, {txt.an, txt.n}}
	size := 0
	for _, p := range parts {
		size += len(p.b)
	}
	if size > 0 {
		n.wire = make([]byte, 0, size)
	}
	for i, p := range parts {
		n.wire = append(n.wire, p.b...)
		n.end[i] = uint32(len(n.wire))
		n.count[i] = p.c
	}
	return n
}

// sameRecords reports whether two nodes answer alike.
func sameRecords(a, b *node) bool {
	return a.end == b.end && a.count == b.count && a.cname == b.cname && string(a.wire) == string(b.wire)
}

// joinWire concatenates a relative wire name (ending in the root label) and
// a zone.
func joinWire(rel, zone []byte) []byte {
	out := make([]byte, 0, len(rel)+len(zone))
	out = append(out, rel[:len(rel)-1]...)
	return append(out, zone...)
}

// shared returns base when n answers exactly like it (a Service with one
// port: its _port._proto name), so both names share one node.
func shared(base, n *node) *node {
	if base != nil && sameRecords(base, n) {
		return base
	}
	return n
}

// entryNode encodes the A, AAAA and SRV answers of a set of entries. SRV
// weights follow CoreDNS: 100 split evenly over all entries (at least 1).
func entryNode(es []srvEntry, ttl uint32) *node {
	addrs := make([]netip.Addr, 0, len(es))
	for _, e := range es {
		addrs = append(addrs, e.addr)
	}
	a, aaaa := addressSets(addrs, ttl)
	if len(es) == 0 {
		return packNode(a, aaaa, rrset{}, rrset{}, "")
	}
	var srv rrset
	weight := uint16(max(100/len(es), 1))
	type srvKey struct {
		target string
		port   int32
	}
	type exKey struct {
		target string
		addr   netip.Addr
	}
	seenSRV := map[srvKey]bool{}
	seenEx := map[exKey]bool{}
	for _, e := range es {
		if e.port < 0 {
			continue
		}
		if k := (srvKey{string(e.target), e.port}); !seenSRV[k] {
			seenSRV[k] = true
			srv.an = appendSRV(srv.an, weight, uint16(e.port), e.target, ttl)
			srv.n++
		}
		if k := (exKey{string(e.target), e.addr}); !seenEx[k] {
			seenEx[k] = true
			srv.ex = appendAddrRR(srv.ex, e.target, e.addr, ttl)
			srv.nx++
		}
	}
	return packNode(a, aaaa, srv, rrset{}, "")
}

// addressSets encodes A and AAAA answers (owner: the question), without
// duplicates, in the given order.
func addressSets(addrs []netip.Addr, ttl uint32) (a, aaaa rrset) {
	seen := make(map[netip.Addr]bool, len(addrs))
	for _, ad := range addrs {
		if seen[ad] {
			continue
		}
		seen[ad] = true
		if ad.Is4() {
			a.an = appendAddrRR(a.an, ptrTo(headerLen), ad, ttl)
			a.n++
		} else {
			aaaa.an = appendAddrRR(aaaa.an, ptrTo(headerLen), ad, ttl)
			aaaa.n++
		}
	}
	return a, aaaa
}

func appendAddrRR(buf, owner []byte, a netip.Addr, ttl uint32) []byte {
	if a.Is4() {
		b := a.As4()
		return appendRR(buf, owner, typeA, ttl, b[:])
	}
	b := a.As16()
	return appendRR(buf, owner, typeAAAA, ttl, b[:])
}
