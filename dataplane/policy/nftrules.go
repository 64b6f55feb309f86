package policy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/nftmsg"
)

// setContent is one set of a policy instance and what it should hold. Fixed
// sets (ipBlocks) change only with the policy's shape.
type setContent struct {
	set   *nftables.Set
	elems []nftables.SetElement
	fixed bool
}

func setName(id int, d Direction, rule int, what string, f ipfamily.Family) string {
	if rule < 0 {
		return fmt.Sprintf("%s-%s-%s-%s", idName(id), dirNames[d], what, famSuffix(f))
	}
	return fmt.Sprintf("%s-%s-%d-%s-%s", idName(id), dirNames[d], rule, what, famSuffix(f))
}

// instanceSets are the sets of one policy instance: per direction and family
// the selected pods, and per rule the ipBlocks (an interval set) and the
// named ports (address . protocol . port). The rules' peer pods are in
// shared sets (peerSets).
func (t *Table) instanceSets(id int, pp *PolicyProgram) []setContent {
	var out []setContent
	for d, dir := range pp.Dir {
		if !dir.Applies {
			continue
		}
		for _, f := range t.opts.Families {
			out = append(out, setContent{set: t.addrSet(setName(id, Direction(d), -1, "sel", f), f, false), elems: addrElems(f, dir.Selected)})
			for i, r := range dir.Rules {
				if blocks := rangeElems(f, r.Blocks); len(blocks) > 0 {
					out = append(out, setContent{set: t.addrSet(setName(id, Direction(d), i, "blocks", f), f, true), elems: blocks, fixed: true})
				}
				if r.HasNamed {
					out = append(out, setContent{set: t.namedSet(setName(id, Direction(d), i, "named", f), f), elems: namedElems(f, r.Named)})
				}
			}
		}
	}
	return out
}

func (t *Table) addrSet(name string, f ipfamily.Family, interval bool) *nftables.Set {
	return &nftables.Set{Table: t.table, Name: name, KeyType: addrType(f), Interval: interval}
}

func (t *Table) namedSet(name string, f ipfamily.Family) *nftables.Set {
	kt, err := nftables.ConcatSetType(addrType(f), nftables.TypeInetProto, nftables.TypeInetService)
	if err != nil {
		panic(err) // three types always fit
	}
	return &nftables.Set{Table: t.table, Name: name, KeyType: kt, Concatenation: true}
}

// rangeElems are an interval set's elements: a start, and an end flagged
// IntervalEnd one past the range (none when the range reaches the family's
// last address).
func rangeElems(f ipfamily.Family, rs []AddrRange) []nftables.SetElement {
	var out []nftables.SetElement
	for _, r := range rs {
		if !f.Has(r.From) {
			continue
		}
		out = append(out, nftables.SetElement{Key: r.From.AsSlice()})
		if end := r.To.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

func namedElems(f ipfamily.Family, ns []NamedTarget) []nftables.SetElement {
	var out []nftables.SetElement
	for _, n := range ns {
		if !f.Has(n.Addr) {
			continue
		}
		key := append(n.Addr.AsSlice(), protoNumber(n.Protocol), 0, 0, 0)
		key = binary.BigEndian.AppendUint16(key, n.Port)
		out = append(out, nftables.SetElement{Key: append(key, 0, 0)})
	}
	return out
}

func protoNumber(p cluster.Protocol) byte {
	switch p {
	case cluster.UDP:
		return 17
	case cluster.SCTP:
		return 132
	}
	return 6
}

// addInstance adds a policy under a new id: its sets, its chain per
// direction and the jump and deny-counter rules that lead there.
func (t *Table) addInstance(pp *PolicyProgram) error {
	id := t.nextID
	t.nextID++
	if err := t.holdPeers(pp); err != nil {
		return err
	}
	for _, sc := range t.instanceSets(id, pp) {
		// The elements go in messages of their own: AddSet would put
		// them all in one attribute, which wraps past 64 KiB.
		if err := t.conn.AddSet(sc.set, nil); err != nil {
			return fmt.Errorf("add set %s: %w", sc.set.Name, err)
		}
		if err := nftmsg.AddElements(t.conn, sc.set, sc.elems); err != nil {
			return fmt.Errorf("add elements to set %s: %w", sc.set.Name, err)
		}
	}
	allowed, dropped := CounterNames(pp.Key)
	tag := []byte(idName(id))
	for d, dir := range pp.Dir {
		if !dir.Applies {
			continue
		}
		dn := dirNames[d]
		chain := t.conn.AddChain(t.chain(idName(id) + "-" + dn))
		egress := Direction(d) == Egress
		for _, f := range t.opts.Families {
			sel := t.addrSet(setName(id, Direction(d), -1, "sel", f), f, false)
			t.conn.AddRule(&nftables.Rule{Table: t.table, Chain: t.chain(dn + "-allow"), UserData: tag,
				Exprs: concat(matchAddr(f, egress, sel), jump(chain.Name))})
			t.conn.AddRule(&nftables.Rule{Table: t.table, Chain: t.chain(dn + "-deny"), UserData: tag,
				Exprs: concat(matchAddr(f, egress, sel), counterRef(dropped))})
			for i, r := range dir.Rules {
				for _, m := range t.ruleMatches(id, Direction(d), i, r, f) {
					t.conn.AddRule(&nftables.Rule{Table: t.table, Chain: chain,
						Exprs: concat(m, counterRef(allowed), []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})})
				}
			}
		}
	}
	t.applied[pp.Key] = &instance{id: id, prog: pp}
	return nil
}

// ruleMatches are the nftables matches of one policy rule for family f: one
// per (kind of peer × ports entry), a product of a few, never of pods.
func (t *Table) ruleMatches(id int, d Direction, i int, r RuleProgram, f ipfamily.Family) [][]expr.Any {
	peerIsSrc := d == Ingress
	var peers, ports [][]expr.Any
	if r.AnyPeer {
		peers = append(peers, nfproto(f))
	}
	if r.HasPodPeers {
		peers = append(peers, matchAddr(f, peerIsSrc, t.addrSet(peerSetName(t.peers[r.PeerKey].id, f), f, false)))
	}
	if len(rangeElems(f, r.Blocks)) > 0 {
		peers = append(peers, matchAddr(f, peerIsSrc, t.addrSet(setName(id, d, i, "blocks", f), f, true)))
	}
	if r.AnyPort {
		ports = append(ports, nil)
	}
	for _, p := range r.Ports {
		ports = append(ports, matchPort(p))
	}
	if r.HasNamed {
		ports = append(ports, matchNamed(f, t.namedSet(setName(id, d, i, "named", f), f)))
	}
	var out [][]expr.Any
	for _, pe := range peers {
		for _, po := range ports {
			out = append(out, concat(pe, po))
		}
	}
	return out
}

// removeInstance deletes a policy instance: the rules leading to it (found
// by their tag), its chains, then its sets.
func (t *Table) removeInstance(inst *instance) error {
	tag := []byte(idName(inst.id))
	for d, dir := range inst.prog.Dir {
		if !dir.Applies {
			continue
		}
		for _, c := range []string{"-allow", "-deny"} {
			rules, err := t.conn.GetRules(t.table, t.chain(dirNames[d]+c))
			if err != nil {
				return fmt.Errorf("list rules of %s: %w", dirNames[d]+c, err)
			}
			for _, r := range rules {
				if bytes.Equal(r.UserData, tag) {
					if err := t.conn.DelRule(r); err != nil {
						return err
					}
				}
			}
		}
		t.conn.FlushChain(t.chain(idName(inst.id) + "-" + dirNames[d]))
		t.conn.DelChain(t.chain(idName(inst.id) + "-" + dirNames[d]))
	}
	for _, sc := range t.instanceSets(inst.id, inst.prog) {
		t.conn.DelSet(sc.set)
	}
	t.releasePeers(inst.prog)
	return nil
}

// peerSet is a set of pod peers' addresses (both families) shared by every
// rule with one PeerKey: in the benchmark's world 900 ingress rules take the
// web tier of one of 10 teams, 250 pods each, and written once per rule they
// were 450,000 of the table's 527,196 elements.
type peerSet struct {
	id    int
	refs  int // rules holding it
	addrs []netip.Addr
}

func peerSetName(id int, f ipfamily.Family) string {
	return fmt.Sprintf("peers%d-%s", id, famSuffix(f))
}

// holdPeers makes the peer sets of pp's rules exist, adding those that do
// not with the rules' addresses.
func (t *Table) holdPeers(pp *PolicyProgram) error {
	for _, dir := range pp.Dir {
		for _, r := range dir.Rules {
			if !dir.Applies || !r.HasPodPeers {
				continue
			}
			if ps := t.peers[r.PeerKey]; ps != nil {
				ps.refs++
				continue
			}
			ps := &peerSet{id: t.nextPeer, refs: 1, addrs: r.Pods}
			t.nextPeer++
			t.peers[r.PeerKey] = ps
			for _, f := range t.opts.Families {
				set := t.addrSet(peerSetName(ps.id, f), f, false)
				if err := t.conn.AddSet(set, nil); err != nil {
					return fmt.Errorf("add set %s: %w", set.Name, err)
				}
				if err := nftmsg.AddElements(t.conn, set, addrElems(f, r.Pods)); err != nil {
					return fmt.Errorf("add elements to set %s: %w", set.Name, err)
				}
			}
		}
	}
	return nil
}

// releasePeers lets go of pp's peer sets, deleting those no rule holds any
// more (after the rules that referred to them, in the same transaction).
func (t *Table) releasePeers(pp *PolicyProgram) {
	for _, dir := range pp.Dir {
		for _, r := range dir.Rules {
			if !dir.Applies || !r.HasPodPeers {
				continue
			}
			ps := t.peers[r.PeerKey]
			if ps.refs--; ps.refs > 0 {
				continue
			}
			for _, f := range t.opts.Families {
				t.conn.DelSet(t.addrSet(peerSetName(ps.id, f), f, false))
			}
			delete(t.peers, r.PeerKey)
		}
	}
}

// updatePeers writes the element differences of the peer sets prog's rules
// hold, once per set.
func (t *Table) updatePeers(prog *Program) error {
	done := make(map[string]bool)
	for _, pp := range prog.Policies {
		for _, dir := range pp.Dir {
			for _, r := range dir.Rules {
				ps := t.peers[r.PeerKey]
				if !dir.Applies || !r.HasPodPeers || ps == nil || done[r.PeerKey] {
					continue
				}
				done[r.PeerKey] = true
				if slices.Equal(ps.addrs, r.Pods) {
					continue
				}
				for _, f := range t.opts.Families {
					if err := t.writeDiff(t.addrSet(peerSetName(ps.id, f), f, false), addrElems(f, ps.addrs), addrElems(f, r.Pods)); err != nil {
						return err
					}
				}
				ps.addrs = r.Pods
			}
		}
	}
	return nil
}

// incremental writes the difference between what was applied and prog.
func (t *Table) incremental(prog *Program) error {
	old := &Program{}
	for _, inst := range t.applied {
		old.Policies = append(old.Policies, inst.prog)
	}
	if err := t.updatePeers(prog); err != nil {
		return err
	}
	seen := make(map[cluster.Key]bool)
	for _, pp := range prog.Policies {
		seen[pp.Key] = true
		inst := t.applied[pp.Key]
		switch {
		case inst != nil && inst.prog == pp:
			// The Compiler hands out the same, unchanged, program
			// for a policy a change did not touch.
		case inst == nil:
			t.addCounters(pp.Key)
			if err := t.addInstance(pp); err != nil {
				return err
			}
		case inst.prog.shape() != pp.shape():
			if err := t.addInstance(pp); err != nil {
				return err
			}
			if err := t.removeInstance(inst); err != nil {
				return err
			}
		default:
			if err := t.updateElements(inst, pp); err != nil {
				return err
			}
		}
	}
	for k, inst := range t.applied {
		if !seen[k] {
			if err := t.removeInstance(inst); err != nil {
				return err
			}
			t.delCounters(k)
			delete(t.applied, k)
		}
	}
	if err := t.setIsolated(old, prog); err != nil {
		return err
	}
	return t.conn.Flush()
}

// updateElements writes the element differences of a policy whose shape
// did not change: pods appearing, leaving or relabelled.
func (t *Table) updateElements(inst *instance, pp *PolicyProgram) error {
	was, is := t.instanceSets(inst.id, inst.prog), t.instanceSets(inst.id, pp)
	for i := range is {
		if is[i].fixed {
			continue
		}
		if err := t.writeDiff(is[i].set, was[i].elems, is[i].elems); err != nil {
			return err
		}
	}
	inst.prog = pp
	return nil
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

func counterRef(name string) []expr.Any {
	return []expr.Any{&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: name}}
}

func ctEstablished() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
}

func nfproto(f ipfamily.Family) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(f.AF())}},
	}
}

// loadAddr loads the source or destination address into reg.
func loadAddr(f ipfamily.Family, src bool, reg uint32) expr.Any {
	off, n := uint32(16), uint32(4) // IPv4 daddr
	switch {
	case f == ipfamily.IPv6 && src:
		off, n = 8, 16
	case f == ipfamily.IPv6:
		off, n = 24, 16
	case src:
		off = 12
	}
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}
}

// matchAddr matches packets of family f whose source (or destination)
// address is in set.
func matchAddr(f ipfamily.Family, src bool, set *nftables.Set) []expr.Any {
	return concat(nfproto(f), []expr.Any{loadAddr(f, src, 1), &expr.Lookup{SourceRegister: 1, SetName: set.Name}})
}

func matchPort(p PortRange) []expr.Any {
	out := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{protoNumber(p.Protocol)}},
	}
	if p.From == 0 {
		return out
	}
	out = append(out, dport(1))
	if p.From == p.To {
		return append(out, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, p.From)})
	}
	return append(out, &expr.Range{Op: expr.CmpOpEq, Register: 1,
		FromData: binary.BigEndian.AppendUint16(nil, p.From), ToData: binary.BigEndian.AppendUint16(nil, p.To)})
}

// dport loads the transport destination port (offset 2 in TCP, UDP and
// SCTP alike).
func dport(reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

// matchNamed looks (daddr . l4proto . dport) up in a concatenated set; the
// fields sit in consecutive 32-bit registers from NFT_REG32_00 (8).
func matchNamed(f ipfamily.Family, set *nftables.Set) []expr.Any {
	const reg32 = 8
	next := uint32(reg32 + f.Bits()/32)
	return concat(nfproto(f), []expr.Any{
		loadAddr(f, false, reg32),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: next},
		dport(next + 1),
		&expr.Lookup{SourceRegister: reg32, SetName: set.Name},
	})
}
