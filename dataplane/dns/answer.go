package dns

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strconv"
	"strings"
)

// zoneResult tells the server what the Zone did with a query.
type zoneResult int

const (
	// notOurs: the name is outside the cluster's names; forward it.
	notOurs zoneResult = iota
	// answered: the response is complete.
	answered
	// needsCNAME: the name is an ExternalName Service and the question asks
	// for addresses; the server follows the CNAME (see Server.externalName).
	needsCNAME
)

var (
	inAddrArpa = wireName("in-addr.arpa")
	ip6Arpa    = wireName("ip6.arpa")
)

// answer answers r if it belongs to the cluster, appending the response to
// buf[:0]. The rcode contract: NOERROR with records; NOERROR without records
// and the SOA (NODATA) when the name exists but not with that type; NXDOMAIN
// with the SOA when it does not exist; SERVFAIL until the cluster state has
// synced; REFUSED for zone transfers. Every in-zone answer is authoritative.
func (z *Zone) answer(buf []byte, r *request) ([]byte, *node, zoneResult) {
	s := z.snap.Load()
	rel := r.nlabel - s.zoneLabels
	if rel < 0 || !bytes.Equal(r.suffix(rel), s.zone) {
		return z.answerOutside(buf, s, r)
	}
	if r.qclass != classINET {
		return errorReply(buf, r, rcodeRefused), nil, answered
	}
	zoneOff := headerLen + int(r.labels[rel])
	if !s.synced {
		return negative(buf, r, s, rcodeServFail, ptrTo(zoneOff), zoneOff), nil, answered
	}
	if r.qtype == typeAXFR || r.qtype == typeIXFR {
		return errorReply(buf, r, rcodeRefused), nil, answered
	}
	var n *node
	// Four labels under the zone ending in svc are endpoint names only
	// (port names are one deeper), never in names: skip its lookup.
	if rel != 4 || string(r.label(3)) != "svc" {
		n = s.names[string(r.lower)]
	}
	if n == nil {
		if e, pos, count := s.endpoint(r, rel); count > 0 {
			return endpointAnswer(buf, r, s, e, pos, count, zoneOff)
		}
		if addr, ok := s.podAddr(r, rel); ok {
			return podAnswer(buf, r, s, addr, zoneOff), nil, answered
		}
		return negative(buf, r, s, rcodeNXDomain, ptrTo(zoneOff), zoneOff), nil, answered
	}
	if rel == 0 {
		switch r.qtype {
		case typeSOA:
			buf = replyHeader(buf, r, flagAA, rcodeSuccess)
			buf = appendSOA(buf, ptrTo(headerLen), headerLen, s)
			setCounts(buf, 1, 0, 0)
			return withOPT(buf, r), nil, answered
		case typeNS:
			return nsAnswer(buf, r, s), nil, answered
		}
	}
	return nodeAnswer(buf, r, s, n, ptrTo(zoneOff), zoneOff)
}

// answerOutside handles names outside the cluster zone that are still ours:
// PTR names of cluster addresses and short Service names.
func (z *Zone) answerOutside(buf []byte, s *snapshot, r *request) ([]byte, *node, zoneResult) {
	if !s.synced || r.qclass != classINET {
		return buf, nil, notOurs
	}
	if r.qtype == typePTR {
		if a, ok := reverseAddr(r); ok {
			if resp, n := s.appendPTR(replyHeader(buf, r, flagAA, rcodeSuccess), a); n > 0 {
				setCounts(resp, n, 0, 0)
				return withOPT(resp, r), nil, answered
			}
		}
		return buf, nil, notOurs
	}
	if z.opts.ShortNames && (r.nlabel == 2 || r.nlabel == 3) {
		if n := s.names[string(r.lower)]; n != nil {
			// The SOA of a negative answer names the cluster zone, written
			// out in full right after the question.
			soaOff := r.qEnd
			return nodeAnswer(buf, r, s, n, s.zone, soaOff)
		}
	}
	return buf, nil, notOurs
}

// nodeAnswer answers from a name that exists. soaOwner/zoneOff place the
// SOA of a NODATA answer.
func nodeAnswer(buf []byte, r *request, s *snapshot, n *node, soaOwner []byte, zoneOff int) ([]byte, *node, zoneResult) {
	part := -1
	switch r.qtype {
	case typeA:
		if n.cname != "" {
			return buf, n, needsCNAME
		}
		part = partA
	case typeAAAA:
		if n.cname != "" {
			return buf, n, needsCNAME
		}
		part = partAAAA
	case typeSRV:
		part = partSRV
	case typeTXT:
		part = partTXT
	case typeCNAME:
		if n.cname != "" {
			buf = replyHeader(buf, r, flagAA, rcodeSuccess)
			buf = appendRR(buf, ptrTo(headerLen), typeCNAME, s.ttl, wireName(n.cname))
			setCounts(buf, 1, 0, 0)
			return withOPT(buf, r), nil, answered
		}
	case typeAXFR, typeIXFR:
		return errorReply(buf, r, rcodeRefused), nil, answered
	}
	if part < 0 {
		return negative(buf, r, s, rcodeSuccess, soaOwner, zoneOff), nil, answered
	}
	an, count := n.part(part)
	if count == 0 {
		return negative(buf, r, s, rcodeSuccess, soaOwner, zoneOff), nil, answered
	}
	buf = replyHeader(buf, r, flagAA, rcodeSuccess)
	buf = append(buf, an...)
	extra := 0
	if part == partSRV {
		ex, nx := n.part(partSRVExtra)
		buf = append(buf, ex...)
		extra = nx
	}
	setCounts(buf, count, 0, extra)
	return withOPT(buf, r), nil, answered
}

// negative is NODATA (rcode NOERROR), NXDOMAIN or SERVFAIL with the zone's
// SOA in the authority section.
func negative(buf []byte, r *request, s *snapshot, rcode int, soaOwner []byte, zoneOff int) []byte {
	buf = replyHeader(buf, r, flagAA, rcode)
	buf = appendSOA(buf, soaOwner, zoneOff, s)
	setCounts(buf, 0, 1, 0)
	return withOPT(buf, r)
}

// appendSOA writes the zone's SOA: ns.dns.<zone> hostmaster.<zone>, both
// pointing at the zone name already in the message at zoneOff.
func appendSOA(buf, owner []byte, zoneOff int, s *snapshot) []byte {
	zp := ptrTo(zoneOff)
	var rd [64]byte
	d := rd[:0]
	d = append(d, "\x02ns\x03dns"...)
	d = append(d, zp...)
	d = append(d, "\x0ahostmaster"...)
	d = append(d, zp...)
	d = binary.BigEndian.AppendUint32(d, s.serial)
	d = binary.BigEndian.AppendUint32(d, 7200)
	d = binary.BigEndian.AppendUint32(d, 1800)
	d = binary.BigEndian.AppendUint32(d, 86400)
	d = binary.BigEndian.AppendUint32(d, s.ttl)
	return appendRR(buf, owner, typeSOA, min(s.ttl, 300), d)
}

// nsAnswer is the apex NS: ns.dns.<zone>, with its addresses as glue.
func nsAnswer(buf []byte, r *request, s *snapshot) []byte {
	buf = replyHeader(buf, r, flagAA, rcodeSuccess)
	nsOff := len(buf) + 12 // where the NS target starts: owner(2) type class ttl rdlen(10)
	buf = appendRR(buf, ptrTo(headerLen), typeNS, s.ttl, append([]byte("\x02ns\x03dns"), ptrTo(headerLen)...))
	for _, a := range s.nsAddrs {
		buf = appendAddrRR(buf, ptrTo(nsOff), a, s.ttl)
	}
	setCounts(buf, 1, 0, len(s.nsAddrs))
	return withOPT(buf, r)
}

// podAddr reads "<a-b-c-d>.<ns>.pod.<zone>" under the pod mode.
func (s *snapshot) podAddr(r *request, rel int) (netip.Addr, bool) {
	if rel != 3 || s.pods == PodsDisabled || string(r.label(2)) != "pod" {
		return netip.Addr{}, false
	}
	ns := r.label(1)
	if _, ok := s.namespaces[string(ns)]; !ok {
		return netip.Addr{}, false
	}
	a, ok := parsePodLabel(r.label(0))
	if !ok {
		return netip.Addr{}, false
	}
	if s.pods == PodsVerified {
		if _, ok := s.podIPs[string(ns)][a]; !ok {
			return netip.Addr{}, false
		}
	}
	return a, true
}

// parsePodLabel turns "10-244-1-5" or "fd00--5" into an address, the way
// CoreDNS does: three dashes and no "--" is IPv4, anything else IPv6.
func parsePodLabel(l []byte) (netip.Addr, bool) {
	var buf [64]byte
	if len(l) > len(buf) {
		return netip.Addr{}, false
	}
	sep := byte(':')
	if bytes.Count(l, []byte("-")) == 3 && !bytes.Contains(l, []byte("--")) {
		sep = '.'
	}
	b := buf[:len(l)]
	for i, c := range l {
		if c == '-' {
			c = sep
		}
		b[i] = c
	}
	a, err := netip.ParseAddr(string(b))
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a, true
}

func podAnswer(buf []byte, r *request, s *snapshot, a netip.Addr, zoneOff int) []byte {
	want := uint16(typeA)
	if !a.Is4() {
		want = typeAAAA
	}
	if r.qtype != want {
		return negative(buf, r, s, rcodeSuccess, ptrTo(zoneOff), zoneOff)
	}
	buf = replyHeader(buf, r, flagAA, rcodeSuccess)
	buf = appendAddrRR(buf, ptrTo(headerLen), a, s.ttl)
	setCounts(buf, 1, 0, 0)
	return withOPT(buf, r)
}

func withOPT(buf []byte, r *request) []byte {
	if r.edns {
		return appendOPT(buf, 0, r.do)
	}
	return buf
}

// reverseAddr reads a full PTR name: d.c.b.a.in-addr.arpa or the 32
// nibbles of ip6.arpa.
func reverseAddr(r *request) (netip.Addr, bool) {
	switch {
	case r.nlabel == 6 && bytes.Equal(r.suffix(4), inAddrArpa):
		var b [4]byte
		for i := range 4 {
			l := r.label(3 - i)
			if len(l) == 0 || len(l) > 3 || (len(l) > 1 && l[0] == '0') {
				return netip.Addr{}, false
			}
			v, err := strconv.Atoi(string(l))
			if err != nil || v > 255 {
				return netip.Addr{}, false
			}
			b[i] = byte(v)
		}
		return netip.AddrFrom4(b), true
	case r.nlabel == 34 && bytes.Equal(r.suffix(32), ip6Arpa):
		var b [16]byte
		for i := range 32 {
			l := r.label(31 - i)
			if len(l) != 1 {
				return netip.Addr{}, false
			}
			v := strings.IndexByte("0123456789abcdef", l[0])
			if v < 0 {
				return netip.Addr{}, false
			}
			b[i/2] |= byte(v) << (4 * (1 - i%2))
		}
		return netip.AddrFrom16(b), true
	}
	return netip.Addr{}, false
}

// negativeFor answers r with rcode and the zone's SOA, wherever r's name is.
func (z *Zone) negativeFor(buf []byte, r *request, rcode int) []byte {
	s := z.snap.Load()
	rel := r.nlabel - s.zoneLabels
	if rel >= 0 && bytes.Equal(r.suffix(rel), s.zone) {
		off := headerLen + int(r.labels[rel])
		return negative(buf, r, s, rcode, ptrTo(off), off)
	}
	return negative(buf, r, s, rcode, s.zone, r.qEnd)
}
