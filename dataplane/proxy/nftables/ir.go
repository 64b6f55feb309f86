package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// The table is described as plain data (Chain, Rule, Set, Elem) before it
// is written: Generate builds it, String renders it as nft(8) would list it
// (golden tests), the Fake and the tracer evaluate it, and the netlink
// Kernel translates it into expressions. The language is only what the
// layout uses.

// Field is a packet field a rule reads.
type Field uint8

const (
	FieldDaddr   Field = iota + 1 // ip/ip6 daddr
	FieldSaddr                    // ip/ip6 saddr
	FieldL4Proto                  // meta l4proto
	FieldDport                    // th dport
)

// Type is the type of a set key or map value field.
type Type uint8

const (
	TypeAddr    Type = iota + 1 // the family's address
	TypeProto                   // inet_proto
	TypePort                    // inet_service
	TypeIndex                   // integer, host byte order (numgen)
	TypeVerdict                 // map value only
	// TypeID is a target's id (64 bits, two nft integers): the key prefix
	// that keeps one target's elements apart from another's in the
	// family's shared endpoint and affinity maps.
	TypeID
)

// MatchKind says what a Match tests.
type MatchKind uint8

const (
	// MatchPrefix: Field (an address) is, or with Neg is not, in Prefix.
	MatchPrefix MatchKind = iota + 1
	// MatchSet: the concatenation of Key is an element of Set.
	MatchSet
	// MatchLocal: fib Field (daddr or saddr) type local.
	MatchLocal
	// MatchNew: ct state new.
	MatchNew
	// MatchEstablished: ct state established,related.
	MatchEstablished
	// MatchDNAT: ct status dnat.
	MatchDNAT
	// MatchMark: meta mark & Mark is Mark (with Neg: is 0).
	MatchMark
	// MatchFamily: meta nfproto is the rule's family.
	MatchFamily
)

// Match is one test of a rule; all of a rule's must hold.
type Match struct {
	Kind   MatchKind
	Field  Field
	Neg    bool
	Prefix netip.Prefix
	Set    string
	Key    []Field
	Mark   uint32
}

// StmtKind says what a Stmt does.
type StmtKind uint8

const (
	StmtJump StmtKind = iota + 1
	StmtGoto
	StmtAccept
	StmtDrop
	StmtReturn
	// StmtReject: reject with an ICMP(v6) port unreachable.
	StmtReject
	// StmtVmap: look Key up in the verdict map Map.
	StmtVmap
	// StmtMarkOr: meta mark |= Mark. StmtMarkXor: meta mark ^= Mark.
	StmtMarkOr
	StmtMarkXor
	// StmtMasquerade (fully random when Random).
	StmtMasquerade
	// StmtDNATRandom: DNAT to the value of Map at (ID . numgen random
	// mod N); with Affinity, (ID . client address) is recorded in that
	// dynamic map with the endpoint chosen, for Timeout.
	StmtDNATRandom
	// StmtDNATAffinity: DNAT to the endpoint Affinity holds for (ID .
	// client address) if (ID . endpoint) is still in the set Map,
	// refreshing its Timeout; no element or an endpoint gone: no match.
	StmtDNATAffinity
	// StmtForget: delete (ID . client address) from Affinity (what
	// StmtDNATAffinity did not take is an endpoint that left).
	StmtForget
)

// Stmt is one statement of a rule.
type Stmt struct {
	Kind     StmtKind
	Chain    string
	Map      string
	Key      []Field
	Mark     uint32
	N        uint32
	Affinity string
	Random   bool
	ID       uint64
	Timeout  time.Duration
}

// Rule is matches, then statements.
type Rule struct {
	Match []Match
	Do    []Stmt
}

// Hook is where a base chain is attached.
type Hook struct {
	Type     string // nat, filter
	Hook     string // prerouting, input, forward, output, postrouting
	Priority int32
}

// Chain is a chain of the table; Hook is nil for a regular chain.
type Chain struct {
	Name  string
	Hook  *Hook
	Rules []Rule
}

// Set is a named set or map of the table.
type Set struct {
	Name string
	Key  []Type
	// Data is the map's value: nil for a set, {TypeVerdict} for a verdict
	// map, {TypeAddr, TypePort} for an endpoint map.
	Data []Type
	// Interval: elements are prefixes.
	Interval bool
	// Timeout > 0: a dynamic set whose elements the rules add, expiring.
	Timeout time.Duration
	Elems   []Elem
}

// Spec is the set without its elements.
func (s *Set) Spec() Set {
	c := *s
	c.Elems = nil
	return c
}

// SameSpec reports whether two sets are declared alike.
func SameSpec(a, b *Set) bool {
	return slices.Equal(a.Key, b.Key) && slices.Equal(a.Data, b.Data) && a.Interval == b.Interval && a.Timeout == b.Timeout
}

// Value is one field of an element.
type Value struct {
	Addr   netip.Addr
	Prefix netip.Prefix // interval sets
	Num    uint32       // proto, port, index
	ID     uint64
}

// Elem is an element of a set, or a key and its value in a map.
type Elem struct {
	Key []Value
	// Verdict of a verdict map: "goto CHAIN".
	Goto string
	// To of an endpoint map.
	To netip.AddrPort
}

// Table is the table's contents: chains and sets by name. Only the chains
// and sets of one family (Family) belong to a Proxier.
type Table struct {
	Family ipfamily.Family
	Chains map[string]*Chain
	Sets   map[string]*Set
}

// TableName is podnet's table: family inet, one for both address
// families.
const TableName = "podnet"

func fieldName(f ipfamily.Family, fl Field) string {
	ip := "ip"
	if f == ipfamily.IPv6 {
		ip = "ip6"
	}
	switch fl {
	case FieldDaddr:
		return ip + " daddr"
	case FieldSaddr:
		return ip + " saddr"
	case FieldL4Proto:
		return "meta l4proto"
	case FieldDport:
		return "th dport"
	}
	return "?"
}

func keyString(f ipfamily.Family, key []Field) string {
	out := make([]string, len(key))
	for i, k := range key {
		out[i] = fieldName(f, k)
	}
	return strings.Join(out, " . ")
}

func typeName(f ipfamily.Family, t Type) string {
	switch t {
	case TypeAddr:
		if f == ipfamily.IPv6 {
			return "ipv6_addr"
		}
		return "ipv4_addr"
	case TypeProto:
		return "inet_proto"
	case TypePort:
		return "inet_service"
	case TypeIndex:
		return "integer"
	case TypeVerdict:
		return "verdict"
	case TypeID:
		return "integer . integer"
	}
	return "?"
}

func idString(id uint64) string { return fmt.Sprintf("%#016x", id) }

func (m Match) render(f ipfamily.Family) string {
	switch m.Kind {
	case MatchPrefix:
		op := ""
		if m.Neg {
			op = "!= "
		}
		p := m.Prefix.Masked().String()
		if m.Prefix.IsSingleIP() {
			p = m.Prefix.Addr().String()
		}
		return fmt.Sprintf("%s %s%s", fieldName(f, m.Field), op, p)
	case MatchSet:
		return fmt.Sprintf("%s @%s", keyString(f, m.Key), m.Set)
	case MatchLocal:
		return fmt.Sprintf("fib %s type local", strings.TrimPrefix(strings.TrimPrefix(fieldName(f, m.Field), "ip6 "), "ip "))
	case MatchNew:
		return "ct state new"
	case MatchEstablished:
		return "ct state established,related"
	case MatchDNAT:
		return "ct status dnat"
	case MatchMark:
		if m.Neg {
			return fmt.Sprintf("meta mark & %#x == 0", m.Mark)
		}
		return fmt.Sprintf("meta mark & %#x == %#x", m.Mark, m.Mark)
	case MatchFamily:
		if f == ipfamily.IPv6 {
			return "meta nfproto ipv6"
		}
		return "meta nfproto ipv4"
	}
	return "?"
}

func (s Stmt) render(f ipfamily.Family) string {
	ip := "ip"
	if f == ipfamily.IPv6 {
		ip = "ip6"
	}
	switch s.Kind {
	case StmtJump:
		return "jump " + s.Chain
	case StmtGoto:
		return "goto " + s.Chain
	case StmtAccept:
		return "accept"
	case StmtDrop:
		return "drop"
	case StmtReturn:
		return "return"
	case StmtReject:
		return "reject"
	case StmtVmap:
		return fmt.Sprintf("%s vmap @%s", keyString(f, s.Key), s.Map)
	case StmtMarkOr:
		return fmt.Sprintf("meta mark set meta mark | %#x", s.Mark)
	case StmtMarkXor:
		return fmt.Sprintf("meta mark set meta mark ^ %#x", s.Mark)
	case StmtMasquerade:
		if s.Random {
			return "masquerade fully-random"
		}
		return "masquerade"
	case StmtDNATRandom:
		out := fmt.Sprintf("dnat %s addr . port to %s . numgen random mod %d map @%s", ip, idString(s.ID), s.N, s.Map)
		if s.Affinity != "" {
			out += fmt.Sprintf(" (update @%s { %s . %s saddr timeout %s : the endpoint })", s.Affinity, idString(s.ID), ip, s.Timeout)
		}
		return out
	case StmtDNATAffinity:
		return fmt.Sprintf("dnat %s addr . port to %s . %s saddr map @%s (if %s . the endpoint is in @%s; update @%s { %s . %s saddr timeout %s })",
			ip, idString(s.ID), ip, s.Affinity, idString(s.ID), s.Map, s.Affinity, idString(s.ID), ip, s.Timeout)
	case StmtForget:
		return fmt.Sprintf("delete @%s { %s . %s saddr }", s.Affinity, idString(s.ID), ip)
	}
	return "?"
}

func (r Rule) render(f ipfamily.Family) string {
	parts := make([]string, 0, len(r.Match)+len(r.Do))
	for _, m := range r.Match {
		parts = append(parts, m.render(f))
	}
	for _, s := range r.Do {
		parts = append(parts, s.render(f))
	}
	return strings.Join(parts, " ")
}

func (v Value) render(t Type) string {
	switch t {
	case TypeID:
		return idString(v.ID)
	case TypeAddr:
		if v.Prefix.IsValid() {
			return v.Prefix.Masked().String()
		}
		return v.Addr.String()
	case TypeProto:
		switch v.Num {
		case protoTCP:
			return "tcp"
		case protoUDP:
			return "udp"
		case protoSCTP:
			return "sctp"
		}
	}
	return fmt.Sprint(v.Num)
}

func (e Elem) render(s *Set) string {
	parts := make([]string, len(e.Key))
	for i, v := range e.Key {
		parts[i] = v.render(s.Key[i])
	}
	out := strings.Join(parts, " . ")
	switch {
	case e.Goto != "":
		out += " : goto " + e.Goto
	case e.To.IsValid():
		out += fmt.Sprintf(" : %s . %d", e.To.Addr(), e.To.Port())
	}
	return out
}

// String renders the table the way nft list table prints it (the
// statements netlink holds that nft has no words for in parentheses),
// chains and sets sorted by name, elements sorted.
func (t *Table) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s { # %v\n", TableName, t.Family)
	for _, name := range sortedKeys(t.Sets) {
		s := t.Sets[name]
		kind := "set"
		if s.Data != nil {
			kind = "map"
		}
		fmt.Fprintf(&b, "\t%s %s {\n\t\ttype ", kind, name)
		for i, k := range s.Key {
			if i > 0 {
				b.WriteString(" . ")
			}
			b.WriteString(typeName(t.Family, k))
		}
		if s.Data != nil {
			b.WriteString(" : ")
			for i, d := range s.Data {
				if i > 0 {
					b.WriteString(" . ")
				}
				b.WriteString(typeName(t.Family, d))
			}
		}
		b.WriteString("\n")
		if s.Interval {
			b.WriteString("\t\tflags interval\n")
		}
		if s.Timeout > 0 {
			fmt.Fprintf(&b, "\t\tflags dynamic,timeout\n\t\ttimeout %s\n", s.Timeout)
		}
		if len(s.Elems) > 0 {
			el := make([]string, len(s.Elems))
			for i, e := range s.Elems {
				el[i] = e.render(s)
			}
			slices.Sort(el)
			fmt.Fprintf(&b, "\t\telements = { %s }\n", strings.Join(el, ",\n\t\t\t     "))
		}
		b.WriteString("\t}\n")
	}
	for _, name := range sortedKeys(t.Chains) {
		c := t.Chains[name]
		fmt.Fprintf(&b, "\tchain %s {\n", name)
		if c.Hook != nil {
			fmt.Fprintf(&b, "\t\ttype %s hook %s priority %d; policy accept;\n", c.Hook.Type, c.Hook.Hook, c.Hook.Priority)
		}
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "\t\t%s\n", r.render(t.Family))
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
