package dns

import (
	"encoding/binary"
	"errors"
	"strings"
)

// DNS wire constants used by the fast path (RFC 1035, 6891).
const (
	headerLen = 12

	flagQR = 1 << 15
	flagAA = 1 << 10
	flagTC = 1 << 9
	flagRD = 1 << 8
	flagRA = 1 << 7
	flagCD = 1 << 4

	typeA     = 1
	typeNS    = 2
	typeCNAME = 5
	typeSOA   = 6
	typePTR   = 12
	typeTXT   = 16
	typeAAAA  = 28
	typeSRV   = 33
	typeOPT   = 41
	typeIXFR  = 251
	typeAXFR  = 252

	classINET = 1

	rcodeSuccess  = 0
	rcodeFormErr  = 1
	rcodeServFail = 2
	rcodeNXDomain = 3
	rcodeNotImp   = 4
	rcodeRefused  = 5
	rcodeBadVers  = 16 // extended, carried in the OPT record

	maxLabels   = 128
	minUDPSize  = 512
	ourUDPSize  = 1232 // the DNS flag day 2020 size, advertised and used upstream
	namePointer = 0xC000 | headerLen
)

// errMalformed marks a request that cannot be parsed far enough to answer
// with anything but FORMERR (or to be dropped, when even the header is bad).
var errMalformed = errors.New("malformed message")

// request is a parsed query. It aliases the packet it was parsed from.
type request struct {
	pkt    []byte
	id     uint16
	flags  uint16
	qname  []byte // wire-format question name, as sent (case kept)
	lower  []byte // the same name lowercased, in a per-call buffer
	labels [maxLabels]uint8
	nlabel int // number of labels excluding the root
	qtype  uint16
	qclass uint16
	qEnd   int // offset just past the question

	edns     bool
	ednsVer  uint8
	udpSize  uint16
	do       bool
	ednsOpts bool // the OPT record carried options (we never echo them)
}

// opcode returns the header's opcode.
func (r *request) opcode() int { return int(r.flags>>11) & 0xF }

// parseRequest reads a query: header, exactly one question and at most one
// additional record, which must be OPT. lowerBuf receives the lowercased name.
// It returns errMalformed when the header itself is unusable (the caller
// drops the packet) and errFormErr when the header is fine but the rest is
// not (the caller answers FORMERR).
//
// It is one pass over the packet on every query's path, and stays one
// piece: split into name and OPT parts it took ~30 % longer in
// BenchmarkParse (one more call and bounds check per part).
//
//gocyclo:ignore
//funclen:ignore
func parseRequest(pkt []byte, lowerBuf []byte, r *request) error {
	if len(pkt) < headerLen {
		return errMalformed
	}
	r.pkt = pkt
	r.id = binary.BigEndian.Uint16(pkt)
	r.flags = binary.BigEndian.Uint16(pkt[2:])
	if r.flags&flagQR != 0 {
		return errMalformed // never answer answers: no reflection loops
	}
	qd := binary.BigEndian.Uint16(pkt[4:])
	an := binary.BigEndian.Uint16(pkt[6:])
	ns := binary.BigEndian.Uint16(pkt[8:])
	ar := binary.BigEndian.Uint16(pkt[10:])
	r.edns = false
	r.do = false
	r.ednsOpts = false
	r.udpSize = minUDPSize
	if qd != 1 || an != 0 || ns != 0 || ar > 1 {
		return errFormErr
	}
	off := headerLen
	r.nlabel = 0
	lower := lowerBuf[:0]
	for {
		if off >= len(pkt) {
			return errFormErr
		}
		l := int(pkt[off])
		if l == 0 {
			lower = append(lower, 0)
			off++
			break
		}
		if l > 63 || r.nlabel >= maxLabels { // pointers are not allowed in a question
			return errFormErr
		}
		if off+1+l > len(pkt) {
			return errFormErr
		}
		r.labels[r.nlabel] = uint8(len(lower))
		r.nlabel++
		lower = append(lower, byte(l))
		for _, c := range pkt[off+1 : off+1+l] {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			lower = append(lower, c)
		}
		off += 1 + l
	}
	if len(lower) > 255 {
		return errFormErr
	}
	r.qname = pkt[headerLen:off]
	r.lower = lower
	if off+4 > len(pkt) {
		return errFormErr
	}
	r.qtype = binary.BigEndian.Uint16(pkt[off:])
	r.qclass = binary.BigEndian.Uint16(pkt[off+2:])
	off += 4
	r.qEnd = off
	if ar == 1 {
		// OPT: root name, type 41, class = UDP size, TTL = ext-rcode|version|DO|Z.
		if off+11 > len(pkt) || pkt[off] != 0 || binary.BigEndian.Uint16(pkt[off+1:]) != typeOPT {
			return errFormErr
		}
		r.edns = true
		size := binary.BigEndian.Uint16(pkt[off+3:])
		r.udpSize = max(size, minUDPSize)
		r.ednsVer = pkt[off+6]
		r.do = pkt[off+7]&0x80 != 0
		rdlen := int(binary.BigEndian.Uint16(pkt[off+9:]))
		if off+11+rdlen > len(pkt) {
			return errFormErr
		}
		r.ednsOpts = rdlen > 0
	}
	return nil
}

var errFormErr = errors.New("format error")

// label returns label i (0 is the leftmost) of the lowercased name.
func (r *request) label(i int) []byte {
	o := int(r.labels[i])
	return r.lower[o+1 : o+1+int(r.lower[o])]
}

// suffix returns the lowercased wire name from label i on.
func (r *request) suffix(i int) []byte {
	if i >= r.nlabel {
		return r.lower[len(r.lower)-1:]
	}
	return r.lower[r.labels[i]:]
}

// replyHeader starts a response in buf: the header with counts zeroed and the
// question copied from the request (so its case is the client's).
func replyHeader(buf []byte, r *request, flags uint16, rcode int) []byte {
	buf = buf[:0]
	buf = binary.BigEndian.AppendUint16(buf, r.id)
	f := flagQR | r.flags&(flagRD|flagCD) | r.flags&0x7800 | flags | uint16(rcode&0xF)
	buf = binary.BigEndian.AppendUint16(buf, f)
	buf = append(buf, 0, 1, 0, 0, 0, 0, 0, 0)
	return append(buf, r.pkt[headerLen:r.qEnd]...)
}

// setCounts writes the answer, authority and additional counts.
func setCounts(buf []byte, an, ns, ar int) {
	binary.BigEndian.PutUint16(buf[6:], uint16(an))
	binary.BigEndian.PutUint16(buf[8:], uint16(ns))
	binary.BigEndian.PutUint16(buf[10:], uint16(ar))
}

// appendOPT adds our OPT record (no options) and counts it in ARCOUNT.
func appendOPT(buf []byte, extRcode int, do bool) []byte {
	var ttl uint32 = uint32(extRcode>>4) << 24
	if do {
		ttl |= 1 << 15
	}
	buf = append(buf, 0)
	buf = binary.BigEndian.AppendUint16(buf, typeOPT)
	buf = binary.BigEndian.AppendUint16(buf, ourUDPSize)
	buf = binary.BigEndian.AppendUint32(buf, ttl)
	buf = append(buf, 0, 0)
	ar := binary.BigEndian.Uint16(buf[10:])
	binary.BigEndian.PutUint16(buf[10:], ar+1)
	return buf
}

// errorReply builds a bare response with rcode and the question, plus OPT
// when the client used EDNS0.
func errorReply(buf []byte, r *request, rcode int) []byte {
	buf = replyHeader(buf, r, 0, rcode)
	if r.edns {
		buf = appendOPT(buf, rcode, r.do)
	}
	return buf
}

// headerOnlyReply answers a packet whose question could not be parsed:
// the ID, opcode and flags echoed, no question.
func headerOnlyReply(buf []byte, pkt []byte, rcode int) []byte {
	buf = buf[:0]
	buf = append(buf, pkt[0], pkt[1])
	f := binary.BigEndian.Uint16(pkt[2:])
	f = flagQR | f&(flagRD|flagCD|0x7800) | uint16(rcode&0xF)
	buf = binary.BigEndian.AppendUint16(buf, f)
	return append(buf, 0, 0, 0, 0, 0, 0, 0, 0)
}

// appendRR appends one record with a wire-format owner name.
func appendRR(buf []byte, owner []byte, rrtype uint16, ttl uint32, rdata []byte) []byte {
	buf = append(buf, owner...)
	buf = binary.BigEndian.AppendUint16(buf, rrtype)
	buf = binary.BigEndian.AppendUint16(buf, classINET)
	buf = binary.BigEndian.AppendUint32(buf, ttl)
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(rdata)))
	return append(buf, rdata...)
}

// ptrTo is a compression pointer to an offset in the message.
func ptrTo(off int) []byte { return []byte{byte(0xC0 | off>>8), byte(off)} }

// wireName converts a presentation-format name ("a.b.c." or "a.b.c") to
// lowercase wire format. Names here are built from Kubernetes object names,
// which are valid DNS labels; nothing needs escaping.
func wireName(name string) []byte {
	return appendWireName(make([]byte, 0, len(name)+2), name)
}

// appendWireName appends wireName(name) to b.
func appendWireName(b []byte, name string) []byte {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if name == "" {
		return append(b, 0)
	}
	for label := range strings.SplitSeq(name, ".") {
		b = append(b, byte(len(label)))
		b = append(b, label...)
	}
	return append(b, 0)
}

// presentName converts a wire name back to presentation form (for logs and
// the slow path).
func presentName(w []byte) string {
	var b strings.Builder
	for i := 0; i < len(w) && w[i] != 0; {
		l := int(w[i])
		if i+1+l > len(w) {
			break
		}
		b.Write(w[i+1 : i+1+l])
		b.WriteByte('.')
		i += 1 + l
	}
	if b.Len() == 0 {
		return "."
	}
	return b.String()
}
