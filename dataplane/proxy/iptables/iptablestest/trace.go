package iptablestest

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Packet is the first packet of a connection, as the node sees it.
type Packet struct {
	Src, Dst netip.Addr
	Proto    string // tcp, udp, sctp
	DPort    uint16
	// FromHost is true for a packet the node itself sends (nat OUTPUT),
	// false for one arriving from a pod or the network (nat PREROUTING).
	FromHost bool
}

// Trace is where a first packet ends up.
type Trace struct {
	// Endpoints are the DNAT destinations the packet may be sent to
	// (several when the choice is random); empty when not DNATed.
	Endpoints []string
	// Masquerade tells, per endpoint ("" when not DNATed), whether the
	// packet leaves with the node's address as source.
	Masquerade map[string]bool
	// Verdict is ACCEPT, REJECT or DROP (from the filter table).
	Verdict string
	// Rules counts the rules evaluated in the nat hook, the cost of the
	// first packet.
	Rules int
}

// Trace walks the first packet of a connection through the nat and filter
// tables the way the kernel would, given the node's local addresses.
// Statistic matches are taken both ways, so every endpoint the packet could
// reach is listed; recent --rcheck never matches (no affinity state).
func (f *Fake) Trace(p Packet, local []netip.Addr) Trace {
	f.mu.Lock()
	defer f.mu.Unlock()
	tr := &tracer{f: f, p: p, local: local}
	hook := "PREROUTING"
	if p.FromHost {
		hook = "OUTPUT"
	}
	res := Trace{Masquerade: make(map[string]bool), Verdict: "ACCEPT"}
	tr.walk("nat", hook, func(r rule) bool {
		res.Rules = tr.count
		if r.target == "DNAT" {
			to := r.opt("--to-destination")
			if !slices.Contains(res.Endpoints, to) {
				res.Endpoints = append(res.Endpoints, to)
			}
			return !r.has("statistic")
		}
		return false
	})
	res.Rules = tr.count
	mark := tr.mark
	// Filter: a DNATed or non-local packet is forwarded.
	fhook := "INPUT"
	switch {
	case p.FromHost:
		fhook = "OUTPUT"
	case len(res.Endpoints) > 0 || !slices.Contains(local, p.Dst):
		fhook = "FORWARD"
	}
	tr.walk("filter", fhook, func(r rule) bool {
		switch r.target {
		case "ACCEPT", "DROP", "REJECT":
			res.Verdict = r.target
			return true
		}
		return false
	})
	if res.Verdict != "ACCEPT" {
		return res
	}
	dests := res.Endpoints
	if len(dests) == 0 {
		dests = []string{""}
	}
	for _, d := range dests {
		pt := *tr
		pt.mark = mark
		pt.dnat = d != ""
		if d != "" {
			ap, err := netip.ParseAddrPort(d)
			if err == nil {
				pt.p.Dst = ap.Addr()
			}
		}
		masq := false
		pt.walk("nat", "POSTROUTING", func(r rule) bool {
			if r.target == "MASQUERADE" {
				masq = true
				return true
			}
			return false
		})
		res.Masquerade[d] = masq
	}
	return res
}

type tracer struct {
	f     *Fake
	p     Packet
	local []netip.Addr
	mark  uint32
	count int
	dnat  bool // the packet was DNATed (conntrack state DNAT)
}

type rule struct {
	args   []string
	target string
}

func (r rule) has(module string) bool {
	for i, a := range r.args {
		if a == "-m" && i+1 < len(r.args) && r.args[i+1] == module {
			return true
		}
	}
	return false
}

func (r rule) opt(name string) string { return value(r.args, name) }

// walk evaluates chain; final is called for rules with a non-chain target
// (after MARK is applied) and returns true to stop everything.
func (t *tracer) walk(table, chain string, final func(rule) bool) (stop bool) {
	for _, raw := range t.f.tables[table].chains[chain] {
		t.count++
		r := rule{args: fields(raw)}
		r.target = target(r.args)
		if !t.matches(r) {
			continue
		}
		switch r.target {
		case "":
			continue
		case "RETURN":
			return false
		case "MARK":
			t.applyMark(r)
			continue
		}
		if _, ok := t.f.tables[table].chains[r.target]; ok {
			if t.walk(table, r.target, final) {
				return true
			}
			if slices.Contains(r.args, "-g") {
				return false
			}
			continue
		}
		if final(r) {
			return true
		}
	}
	return false
}

func (t *tracer) applyMark(r rule) {
	num := func(s string) uint32 {
		v, _ := strconv.ParseUint(s, 0, 32)
		return uint32(v)
	}
	switch {
	case r.opt("--or-mark") != "":
		t.mark |= num(r.opt("--or-mark"))
	case r.opt("--and-mark") != "":
		t.mark &= num(r.opt("--and-mark"))
	case r.opt("--xor-mark") != "":
		t.mark ^= num(r.opt("--xor-mark"))
	case r.opt("--set-xmark") != "":
		v, m, _ := strings.Cut(r.opt("--set-xmark"), "/")
		t.mark = t.mark&^num(m) ^ num(v)
	}
}

func (t *tracer) matches(r rule) bool {
	a := r.args
	for i := 0; i < len(a); i++ {
		neg := false
		if a[i] == "!" {
			neg = true
			i++
		}
		var ok bool
		switch a[i] {
		case "-s", "-d":
			pfx := parsePrefix(a[i+1])
			addr := t.p.Src
			if a[i] == "-d" {
				addr = t.p.Dst
			}
			ok = pfx.Contains(addr)
			i++
		case "-p":
			ok = a[i+1] == t.p.Proto
			i++
		case "--dport":
			ok = a[i+1] == strconv.Itoa(int(t.p.DPort))
			i++
		case "--dst-type", "--src-type":
			addr := t.p.Src
			if a[i] == "--dst-type" {
				addr = t.p.Dst
			}
			ok = a[i+1] == "LOCAL" && slices.Contains(t.local, addr)
			i++
		case "--mark":
			v, m, found := strings.Cut(a[i+1], "/")
			mask := uint64(0xffffffff)
			if found {
				mask, _ = strconv.ParseUint(m, 0, 32)
			}
			want, _ := strconv.ParseUint(v, 0, 32)
			ok = uint64(t.mark)&mask == want
			i++
		case "--rcheck":
			ok = false
		case "--ctstate":
			states := strings.Split(a[i+1], ",")
			ok = slices.Contains(states, "NEW") || t.dnat && slices.Contains(states, "DNAT")
			i++
		case "-j", "-g":
			return true
		default:
			continue
		}
		if ok == neg {
			return false
		}
	}
	return true
}

func parsePrefix(s string) netip.Prefix {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			panic(fmt.Sprintf("bad address %q in rule", s))
		}
		return netip.PrefixFrom(a, a.BitLen())
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		panic(fmt.Sprintf("bad address %q in rule", s))
	}
	return p
}

// fields splits a rule, keeping double-quoted strings whole.
func fields(s string) []string {
	var out []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		if s[0] == '"' {
			end := strings.IndexByte(s[1:], '"')
			if end < 0 {
				end = len(s) - 1
			}
			out = append(out, s[1:end+1])
			s = s[min(end+2, len(s)):]
			continue
		}
		w, rest, _ := strings.Cut(s, " ")
		out = append(out, w)
		s = rest
	}
	return out
}
