package nftables

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// Packet is the first packet of a connection, as the node sees it.
type Packet struct {
	Src, Dst netip.Addr
	Proto    string // tcp, udp, sctp
	DPort    uint16
	// FromHost is true for a packet the node itself sends (output hook),
	// false for one arriving from a pod or the network (prerouting).
	FromHost bool
}

// Trace is where a first packet ends up.
type Trace struct {
	// Endpoints are the DNAT destinations the packet may be sent to
	// ("IP:port", several when the choice is random); empty when not
	// DNATed.
	Endpoints []string
	// Masquerade tells, per endpoint ("" when not DNATed), whether the
	// packet leaves with the node's address as source.
	Masquerade map[string]bool
	// Verdict is accept, drop or reject.
	Verdict string
	// Rules counts the rules evaluated in the nat hook, the cost of the
	// first packet.
	Rules int
}

type verdict uint8

const (
	vContinue verdict = iota
	vAccept
	vDrop
	vReject
)

func (v verdict) String() string {
	return [...]string{"continue", "accept", "drop", "reject"}[v]
}

type tracer struct {
	s       *fakeState
	p       Packet
	fam     ipfamily.Family
	local   []netip.Addr
	mark    uint32
	dnat    bool
	eps     []string
	masq    bool
	count   int
	counted bool
}

// Trace walks the first packet of a connection through the table's base
// chains in hook and priority order, given the node's local addresses.
// numgen's choice is taken every way, so every endpoint the packet could
// reach is listed; an affinity map answers with what it holds.
func (f *Fake) Trace(p Packet, local []netip.Addr) Trace {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &tracer{s: f.state, p: p, fam: ipfamily.Of(p.Dst), local: local}
	res := Trace{Masquerade: map[string]bool{}, Verdict: "accept"}
	first := "prerouting"
	if p.FromHost {
		first = "output"
	}
	t.counted = true
	v := t.hook(first)
	t.counted = false
	res.Rules, res.Endpoints = t.count, t.eps
	if v != vAccept && v != vContinue {
		res.Verdict = v.String()
		return res
	}
	dests := t.eps
	if len(dests) == 0 {
		dests = []string{""}
	}
	for _, d := range dests {
		pt := *t
		if d != "" {
			pt.dnat = true
			pt.p.Dst = netip.MustParseAddrPort(d).Addr()
		}
		if !p.FromHost {
			h := "forward"
			if slices.Contains(local, pt.p.Dst) {
				h = "input"
			}
			if v := pt.hook(h); v == vDrop || v == vReject {
				res.Verdict = v.String()
				return res
			}
		}
		pt.masq = false
		pt.hook("postrouting")
		res.Masquerade[d] = pt.masq
	}
	return res
}

// hook runs the base chains of hook h by priority; a NAT decision ends
// the nat chains' part, a drop or reject everything.
func (t *tracer) hook(h string) verdict {
	var base []*fakeChain
	for _, c := range t.s.chains {
		if c.Hook != nil && c.Hook.Hook == h {
			base = append(base, c)
		}
	}
	slices.SortFunc(base, func(a, b *fakeChain) int {
		if a.Hook.Priority != b.Hook.Priority {
			return int(a.Hook.Priority - b.Hook.Priority)
		}
		return strings.Compare(a.Name, b.Name)
	})
	out := vContinue
	for _, c := range base {
		v := t.chain(c)
		switch v {
		case vDrop, vReject:
			return v
		case vAccept:
			out = vAccept
		}
	}
	return out
}

func (t *tracer) chain(c *fakeChain) verdict {
	for _, r := range c.Rules {
		if t.counted {
			t.count++
		}
		if !t.matches(c, r) {
			continue
		}
		v, next := t.do(r)
		if !next {
			return v
		}
	}
	return vContinue
}

// do runs a rule's statements: next is true when evaluation goes on with
// the chain's next rule.
func (t *tracer) do(r Rule) (verdict, bool) {
	for _, st := range r.Do {
		switch st.Kind {
		case StmtJump:
			if v := t.chain(t.s.chains[st.Chain]); v != vContinue {
				return v, false
			}
		case StmtGoto:
			return t.chain(t.s.chains[st.Chain]), false
		case StmtVmap:
			e, ok := t.s.sets[st.Map].elems[elemKey(Elem{Key: t.key(st.Key)})]
			if !ok {
				return vContinue, true
			}
			return t.chain(t.s.chains[e.Goto]), false
		case StmtAccept:
			return vAccept, false
		case StmtDrop:
			return vDrop, false
		case StmtReject:
			return vReject, false
		case StmtReturn:
			return vContinue, false
		case StmtMarkOr:
			t.mark |= st.Mark
		case StmtMarkXor:
			t.mark ^= st.Mark
		case StmtMasquerade:
			t.masq = true
			return vAccept, false
		case StmtDNATRandom, StmtDNATAffinity:
			return t.pick(st)
		case StmtForget:
			// The packet deletes a stale element; the trace leaves the
			// map as it is (the next rule lists every endpoint anyway).
		}
	}
	return vContinue, true
}

// pick runs a DNAT statement: every endpoint numgen may choose, or the
// one the affinity map holds for the client if it is still the target's.
func (t *tracer) pick(st Stmt) (verdict, bool) {
	if st.Kind == StmtDNATRandom {
		for _, e := range t.s.sets[st.Map].elems {
			if e.Key[0].ID == st.ID && e.Key[1].Num < st.N {
				t.addEndpoint(e.To.String())
			}
		}
		return vAccept, false
	}
	e, ok := t.s.sets[st.Affinity].elems[elemKey(Elem{Key: []Value{{ID: st.ID}, {Addr: t.p.Src}}})]
	if !ok {
		return vContinue, true
	}
	live := Elem{Key: []Value{{ID: st.ID}, {Addr: e.To.Addr()}, {Num: uint32(e.To.Port())}}}
	if _, ok := t.s.sets[st.Map].elems[elemKey(live)]; !ok {
		return vContinue, true
	}
	t.addEndpoint(e.To.String())
	return vAccept, false
}

func (t *tracer) addEndpoint(ep string) {
	if !slices.Contains(t.eps, ep) {
		t.eps = append(t.eps, ep)
		slices.Sort(t.eps)
	}
}

func (t *tracer) value(fl Field) Value {
	switch fl {
	case FieldDaddr:
		return Value{Addr: t.p.Dst}
	case FieldSaddr:
		return Value{Addr: t.p.Src}
	case FieldL4Proto:
		switch t.p.Proto {
		case "udp":
			return Value{Num: protoUDP}
		case "sctp":
			return Value{Num: protoSCTP}
		}
		return Value{Num: protoTCP}
	}
	return Value{Num: uint32(t.p.DPort)}
}

func (t *tracer) key(fields []Field) []Value {
	out := make([]Value, len(fields))
	for i, fl := range fields {
		out[i] = t.value(fl)
	}
	return out
}

func (t *tracer) matches(c *fakeChain, r Rule) bool {
	for _, m := range r.Match {
		ok := true
		switch m.Kind {
		case MatchPrefix:
			ok = m.Prefix.Contains(t.value(m.Field).Addr) != m.Neg
		case MatchSet:
			ok = t.inSet(m)
		case MatchLocal:
			ok = slices.Contains(t.local, t.value(m.Field).Addr)
		case MatchNew:
			ok = true
		case MatchEstablished:
			ok = false
		case MatchDNAT:
			ok = t.dnat
		case MatchMark:
			ok = (t.mark&m.Mark == m.Mark) != m.Neg
		case MatchFamily:
			ok = c.family == t.fam
		}
		if !ok {
			return false
		}
	}
	return true
}

func (t *tracer) inSet(m Match) bool {
	st := t.s.sets[m.Set]
	key := t.key(m.Key)
	if !st.Interval {
		_, ok := st.elems[elemKey(Elem{Key: key})]
		return ok
	}
	for _, e := range st.elems {
		if e.Key[0].Prefix.Contains(key[0].Addr) {
			return true
		}
	}
	return false
}
