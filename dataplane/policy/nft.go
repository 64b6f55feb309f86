package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/nftmsg"
)

// TableName is podnet's policy table, family inet: one table for both
// address families, its own chains hooked on forward. Nothing outside it is
// touched.
const TableName = "podnet-policy"

// Chain priorities on the forward hook: after conntrack (-200) and DNAT
// (-100), so the destination is the endpoint the Service proxy chose.
// Each base chain's accept ends only that chain; a drop in either is final,
// whatever other tables (iptables' FORWARD) decide.
const (
	egressPriority  = -5
	ingressPriority = -4
)

// Options configure the table.
type Options struct {
	// Families the node serves.
	Families []ipfamily.Family
	// LogGroup is the nflog group denied new connections are logged to,
	// LogRate how many a second at most.
	LogGroup uint16
	LogRate  uint64
}

// Table programs a Program into the kernel. The first Apply, and the one
// after any failure, rebuilds the table in one transaction (the old table
// keeps judging until it commits, so a restart opens no window); later ones
// write only the difference: element updates, and a policy's rules only when
// its shape changed. Not safe for concurrent use.
type Table struct {
	conn  *nftables.Conn
	opts  Options
	table *nftables.Table

	applied  map[cluster.Key]*instance
	nextID   int
	peers    map[string]*peerSet // by PeerKey
	nextPeer int
	// nextNamed numbers the rules' named ports in the named sets (from
	// 1, 0 meaning none).
	nextNamed uint32
	// groups are the group chains per direction, by groupKey; addrGroup
	// the group each selected address is sent to.
	groups    [2]map[string]*group
	addrGroup [2]map[netip.Addr]*group
	nextGroup int
}

// instance is one shape of one policy in the kernel: its chains and sets
// carry the id, so a new shape is added beside the old before the old is
// removed.
type instance struct {
	id   int
	prog *PolicyProgram
	// named are each rule's id in the named ports sets, per direction.
	named [2][]uint32
}

// NewTable returns a Table writing through conn.
func NewTable(conn *nftables.Conn, o Options) *Table {
	if o.LogRate == 0 {
		o.LogRate = 10
	}
	return &Table{conn: conn, opts: o, table: &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}}
}

// Apply makes the kernel hold prog.
func (t *Table) Apply(prog *Program) error {
	var err error
	switch {
	case t.applied == nil:
		err = t.full(prog)
	case t.holds(prog):
	default:
		err = t.sync(prog)
	}
	if err != nil {
		t.applied = nil
		return fmt.Errorf("program table %s: %w", TableName, err)
	}
	return nil
}

// holds says whether prog is the applied program, policy for policy (the
// Compiler hands out the same PolicyProgram for a policy no change
// touched): then there is nothing to write.
func (t *Table) holds(prog *Program) bool {
	if len(prog.Policies) != len(t.applied) {
		return false
	}
	for _, pp := range prog.Policies {
		if inst := t.applied[pp.Key]; inst == nil || inst.prog != pp {
			return false
		}
	}
	return true
}

// Remove deletes the table, if there is one.
func (t *Table) Remove() error {
	t.conn.AddTable(t.table)
	t.conn.DelTable(t.table)
	t.applied = nil
	return t.conn.Flush()
}

// full rebuilds the table in one transaction: the old one is deleted and
// a new one written from nothing.
func (t *Table) full(prog *Program) error {
	c := t.conn
	c.AddTable(t.table)
	c.DelTable(t.table)
	c.AddTable(t.table)
	if err := t.skeleton(); err != nil {
		return err
	}
	t.applied = make(map[cluster.Key]*instance)
	t.peers = make(map[string]*peerSet)
	t.nextNamed = 1
	for d := range dirNames {
		t.groups[d] = make(map[string]*group)
		t.addrGroup[d] = make(map[netip.Addr]*group)
	}
	return t.sync(prog)
}

// Directions' names in the table.
var dirNames = [2]string{Ingress: "in", Egress: "eg"}

func (t *Table) chain(name string) *nftables.Chain {
	return &nftables.Chain{Name: name, Table: t.table}
}

// skeleton adds the base chains, the drop chains and the shared sets:
//
//	in (forward hook):  ct state established,related accept
//	                    icmpv6 type 133-137 accept
//	                    ip daddr vmap @in-pods-4
//	                    ip6 daddr vmap @in-pods-6
//	in-drop:            limit rate <LogRate>/second log group <LogGroup> prefix "in"
//	                    drop
//	g<n>-in (a group):  jump p<a>-in; jump p<b>-in (each policy selecting its pods, with rules)
//	                    counter name "<a's ns>/<name>/dropped" counter name ... jump in-drop
//	p<a>-in:            per rule: <peer match> <port match> counter name "<ns>/<name>/allowed" accept
//
// and the same with saddr for eg. An address in no verdict map is in no
// policy's selection: not isolated, its packets pass. A policy chain's
// accept ends the base chain; the drop is final.
func (t *Table) skeleton() error {
	for _, f := range t.opts.Families {
		for _, set := range []*nftables.Set{t.peersSet(f), t.namedSet(f)} {
			if err := t.conn.AddSet(set, nil); err != nil {
				return fmt.Errorf("add set %s: %w", set.Name, err)
			}
		}
	}
	for d, name := range dirNames {
		prio := nftables.ChainPriority(ingressPriority)
		if Direction(d) == Egress {
			prio = nftables.ChainPriority(egressPriority)
		}
		accept := nftables.ChainPolicyAccept
		base := t.conn.AddChain(&nftables.Chain{Name: name, Table: t.table, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: &prio, Policy: &accept})
		drop := t.conn.AddChain(t.chain(name + "-drop"))
		t.conn.AddRule(&nftables.Rule{Table: t.table, Chain: base, Exprs: ctEstablished()})
		t.conn.AddRule(&nftables.Rule{Table: t.table, Chain: base, Exprs: neighbourDiscovery()})
		for _, f := range t.opts.Families {
			if err := t.conn.AddSet(t.vmap(Direction(d), f), nil); err != nil {
				return fmt.Errorf("add map %s: %w", vmapName(Direction(d), f), err)
			}
			t.conn.AddRule(&nftables.Rule{Table: t.table, Chain: base, Exprs: vmapAddr(f, Direction(d) == Egress, vmapName(Direction(d), f))})
		}
		t.conn.AddRule(&nftables.Rule{Table: t.table, Chain: drop, Exprs: []expr.Any{
			&expr.Limit{Type: expr.LimitTypePkts, Rate: t.opts.LogRate, Unit: expr.LimitTimeSecond, Burst: uint32(t.opts.LogRate)},
			&expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX, Group: t.opts.LogGroup, Data: []byte(name)},
		}})
		t.conn.AddRule(&nftables.Rule{Table: t.table, Chain: drop, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}})
	}
	return nil
}

// neighbourDiscovery accepts IPv6 neighbour and router discovery (ICMPv6
// types 133-137), which pods on one bridge need to reach each other at
// all: an egress-isolated pod's neighbour solicitation goes to a multicast
// address no rule allows, and an ingress-isolated pod's unreachability
// probes are unicast ICMPv6 no ports entry takes. It is the link's
// business, as ARP is for IPv4 (which never reaches these hooks).
func neighbourDiscovery() []expr.Any {
	return concat(nfproto(ipfamily.IPv6), []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{133}, ToData: []byte{137}},
		&expr.Verdict{Kind: expr.VerdictAccept},
	})
}

func famSuffix(f ipfamily.Family) string {
	if f == ipfamily.IPv6 {
		return "6"
	}
	return "4"
}

// CounterNames are the names of a policy's counters in the table.
func CounterNames(k cluster.Key) (allowed, dropped string) {
	return k.String() + "/allowed", k.String() + "/dropped"
}

func (t *Table) addCounters(k cluster.Key) {
	a, d := CounterNames(k)
	for _, n := range []string{a, d} {
		t.conn.AddObj(&nftables.NamedObj{Table: t.table, Name: n, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
	}
}

func (t *Table) delCounters(k cluster.Key) {
	a, d := CounterNames(k)
	for _, n := range []string{a, d} {
		t.conn.DeleteObject(&nftables.NamedObj{Table: t.table, Name: n, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
	}
}

// writeDiff deletes what is in was and not in is, then adds the rest.
func (t *Table) writeDiff(set *nftables.Set, was, is []nftables.SetElement) error {
	has := func(l []nftables.SetElement) map[string]bool {
		m := make(map[string]bool, len(l))
		for _, e := range l {
			m[string(e.Key)] = true
		}
		return m
	}
	wasSet, isSet := has(was), has(is)
	var del, add []nftables.SetElement
	for _, e := range was {
		if !isSet[string(e.Key)] {
			del = append(del, e)
		}
	}
	for _, e := range is {
		if !wasSet[string(e.Key)] {
			add = append(add, e)
		}
	}
	if err := nftmsg.DeleteElements(t.conn, set, del); err != nil {
		return err
	}
	return nftmsg.AddElements(t.conn, set, add)
}

func addrType(f ipfamily.Family) nftables.SetDatatype {
	if f == ipfamily.IPv6 {
		return nftables.TypeIP6Addr
	}
	return nftables.TypeIPAddr
}

func idName(id int) string { return "p" + strconv.Itoa(id) }

// Counts are a policy's counters: packets of new connections its rules
// allowed, and of new connections dropped while it selected the pod.
type Counts struct{ Allowed, Dropped uint64 }

// Counters reads every policy's counters back from the kernel.
func (t *Table) Counters() (map[cluster.Key]Counts, error) {
	objs, err := t.conn.GetObjects(t.table)
	if err != nil {
		return nil, fmt.Errorf("read counters of %s: %w", TableName, err)
	}
	out := make(map[cluster.Key]Counts)
	for _, o := range objs {
		// A table-wide read gives counters in the library's legacy type.
		c, ok := o.(*nftables.CounterObj)
		if !ok {
			continue
		}
		ns, rest, _ := strings.Cut(c.Name, "/")
		name, which, _ := strings.Cut(rest, "/")
		k := cluster.Key{Namespace: ns, Name: name}
		v := out[k]
		if which == "allowed" {
			v.Allowed = c.Packets
		} else {
			v.Dropped = c.Packets
		}
		out[k] = v
	}
	return out, nil
}

// Cleanup removes the policy table from the current network namespace
// (proxyd --cleanup).
func Cleanup() error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("remove table %s: %w", TableName, err)
	}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("remove table %s: %w", TableName, err)
	}
	for _, t := range tables {
		if t.Name == TableName {
			return NewTable(conn, Options{}).Remove()
		}
	}
	return nil
}
