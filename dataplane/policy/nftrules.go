package policy

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/nftmsg"
)

// The table's sets are few and shared, whatever the number of policies: the
// kernel finds a set by name with a linear search (nft_set_lookup_global),
// once per rule that looks it up and per element batch, so a set per rule,
// policy and family made the 1,000-policy node's table write quadratic
// (4.5 s of CPU for 32,196 elements, nearly all of it in that search).
// Per family there is one set of peers, keyed (peer set id . address), one
// of named ports, keyed (rule id . address . protocol . port), and the
// verdict maps from a selected pod's address to its group's chain; only
// ipBlocks (interval sets, fixed with their policy's shape) have a set per
// rule.

// Shared sets' names.
func peersSet(f ipfamily.Family) string { return "peers-" + famSuffix(f) }
func namedSet(f ipfamily.Family) string { return "named-" + famSuffix(f) }

func blocksSetName(id int, d Direction, rule int, f ipfamily.Family) string {
	return fmt.Sprintf("%s-%s-%d-blocks-%s", idName(id), dirNames[d], rule, famSuffix(f))
}

func (t *Table) addrSet(name string, f ipfamily.Family, interval bool) *nftables.Set {
	return &nftables.Set{Table: t.table, Name: name, KeyType: addrType(f), Interval: interval}
}

// idSet is a set keyed by a 32-bit id followed by types.
func (t *Table) idSet(name string, types ...nftables.SetDatatype) *nftables.Set {
	kt, err := nftables.ConcatSetType(append([]nftables.SetDatatype{nftables.TypeMark}, types...)...)
	if err != nil {
		panic(err) // at most four types always fit
	}
	return &nftables.Set{Table: t.table, Name: name, KeyType: kt, Concatenation: true}
}

func (t *Table) peersSet(f ipfamily.Family) *nftables.Set {
	return t.idSet(peersSet(f), addrType(f))
}

func (t *Table) namedSet(f ipfamily.Family) *nftables.Set {
	return t.idSet(namedSet(f), addrType(f), nftables.TypeInetProto, nftables.TypeInetService)
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

// idElems are (id . address) elements for the addresses of family f.
func idElems(f ipfamily.Family, id uint32, as []netip.Addr) []nftables.SetElement {
	var out []nftables.SetElement
	for _, a := range as {
		if f.Has(a) {
			out = append(out, nftables.SetElement{Key: append(binary.BigEndian.AppendUint32(nil, id), a.AsSlice()...)})
		}
	}
	return out
}

func namedElems(f ipfamily.Family, id uint32, ns []NamedTarget) []nftables.SetElement {
	var out []nftables.SetElement
	for _, n := range ns {
		if !f.Has(n.Addr) {
			continue
		}
		key := append(binary.BigEndian.AppendUint32(nil, id), n.Addr.AsSlice()...)
		key = append(key, protoNumber(n.Protocol), 0, 0, 0)
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

// addInstance adds a policy under a new id: its chain per direction, its
// rules' named ports and ipBlocks. The groups (regroup) lead there.
func (t *Table) addInstance(pp *PolicyProgram) error {
	inst := &instance{id: t.nextID, prog: pp}
	t.nextID++
	if err := t.holdPeers(pp); err != nil {
		return err
	}
	allowed, _ := CounterNames(pp.Key)
	for d, dir := range pp.Dir {
		if !dir.Applies || len(dir.Rules) == 0 {
			continue
		}
		chain := t.conn.AddChain(t.chain(inst.chainName(Direction(d))))
		inst.named[d] = make([]uint32, len(dir.Rules))
		for i, r := range dir.Rules {
			if r.HasNamed {
				inst.named[d][i] = t.nextNamed
				t.nextNamed++
			}
			for _, f := range t.opts.Families {
				if err := t.addRuleSets(inst, Direction(d), i, r, f); err != nil {
					return err
				}
				for _, m := range t.ruleMatches(inst, Direction(d), i, r, f) {
					t.conn.AddRule(&nftables.Rule{Table: t.table, Chain: chain,
						Exprs: concat(m, counterRef(allowed), []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})})
				}
			}
		}
	}
	t.applied[pp.Key] = inst
	return nil
}

// addRuleSets writes rule i's named ports into the shared set and adds its
// ipBlocks' set.
func (t *Table) addRuleSets(inst *instance, d Direction, i int, r RuleProgram, f ipfamily.Family) error {
	if r.HasNamed {
		if err := nftmsg.AddElements(t.conn, t.namedSet(f), namedElems(f, inst.named[d][i], r.Named)); err != nil {
			return fmt.Errorf("add elements to set %s: %w", namedSet(f), err)
		}
	}
	blocks := rangeElems(f, r.Blocks)
	if len(blocks) == 0 {
		return nil
	}
	set := t.addrSet(blocksSetName(inst.id, d, i, f), f, true)
	// The elements go in messages of their own: AddSet would put them
	// all in one attribute, which wraps past 64 KiB.
	if err := t.conn.AddSet(set, nil); err != nil {
		return fmt.Errorf("add set %s: %w", set.Name, err)
	}
	if err := nftmsg.AddElements(t.conn, set, blocks); err != nil {
		return fmt.Errorf("add elements to set %s: %w", set.Name, err)
	}
	return nil
}

func (inst *instance) chainName(d Direction) string { return idName(inst.id) + "-" + dirNames[d] }

// ruleMatches are the nftables matches of one policy rule for family f: one
// per (kind of peer × ports entry), a product of a few, never of pods.
func (t *Table) ruleMatches(inst *instance, d Direction, i int, r RuleProgram, f ipfamily.Family) [][]expr.Any {
	peerIsSrc := d == Ingress
	var peers, ports [][]expr.Any
	if r.AnyPeer {
		peers = append(peers, nfproto(f))
	}
	if r.HasPodPeers {
		peers = append(peers, matchID(f, peerIsSrc, uint32(t.peers[r.PeerKey].id), peersSet(f)))
	}
	if len(rangeElems(f, r.Blocks)) > 0 {
		peers = append(peers, matchAddr(f, peerIsSrc, blocksSetName(inst.id, d, i, f)))
	}
	if r.AnyPort {
		ports = append(ports, nil)
	}
	for _, p := range r.Ports {
		ports = append(ports, matchPort(p))
	}
	if r.HasNamed {
		ports = append(ports, matchNamed(f, inst.named[d][i]))
	}
	var out [][]expr.Any
	for _, pe := range peers {
		for _, po := range ports {
			out = append(out, concat(pe, po))
		}
	}
	return out
}

// removeInstance deletes a policy instance no group leads to any more: its
// chains, its named ports' elements, its ipBlocks' sets.
func (t *Table) removeInstance(inst *instance) error {
	for d, dir := range inst.prog.Dir {
		if !dir.Applies || len(dir.Rules) == 0 {
			continue
		}
		t.conn.FlushChain(t.chain(inst.chainName(Direction(d))))
		t.conn.DelChain(t.chain(inst.chainName(Direction(d))))
		for i, r := range dir.Rules {
			for _, f := range t.opts.Families {
				if r.HasNamed {
					if err := nftmsg.DeleteElements(t.conn, t.namedSet(f), namedElems(f, inst.named[d][i], r.Named)); err != nil {
						return err
					}
				}
				if len(rangeElems(f, r.Blocks)) > 0 {
					t.conn.DelSet(t.addrSet(blocksSetName(inst.id, Direction(d), i, f), f, true))
				}
			}
		}
	}
	t.releasePeers(inst.prog)
	return nil
}

// peerSet is one PeerKey's pods, shared by every rule with that key: in the
// benchmark's world 900 ingress rules take the web tier of one of 10 teams,
// 250 pods each, and written once per rule they were 450,000 of the table's
// 527,196 elements.
type peerSet struct {
	id    int
	refs  int // rules holding it
	addrs []netip.Addr
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
				if err := nftmsg.AddElements(t.conn, t.peersSet(f), idElems(f, uint32(ps.id), r.Pods)); err != nil {
					return fmt.Errorf("add elements to set %s: %w", peersSet(f), err)
				}
			}
		}
	}
	return nil
}

// releasePeers lets go of pp's peer sets, deleting the elements of those no
// rule holds any more.
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
				_ = nftmsg.DeleteElements(t.conn, t.peersSet(f), idElems(f, uint32(ps.id), ps.addrs))
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
					id := uint32(ps.id)
					if err := t.writeDiff(t.peersSet(f), idElems(f, id, ps.addrs), idElems(f, id, r.Pods)); err != nil {
						return err
					}
				}
				ps.addrs = r.Pods
			}
		}
	}
	return nil
}

// sync writes the difference between what was applied and prog, in the
// order the kernel accepts in one transaction: peers, then new policy
// chains, then the groups and verdict maps that lead to them, then what
// nothing leads to any more.
func (t *Table) sync(prog *Program) error {
	if err := t.updatePeers(prog); err != nil {
		return err
	}
	var gone []*instance
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
			gone = append(gone, inst)
			if err := t.addInstance(pp); err != nil {
				return err
			}
		default:
			if err := t.updateElements(inst, pp); err != nil {
				return err
			}
		}
	}
	var dropped []cluster.Key
	for k, inst := range t.applied {
		if !seen[k] {
			gone = append(gone, inst)
			dropped = append(dropped, k)
			delete(t.applied, k)
		}
	}
	if err := t.regroup(prog); err != nil {
		return err
	}
	for _, inst := range gone {
		if err := t.removeInstance(inst); err != nil {
			return err
		}
	}
	for _, k := range dropped {
		t.delCounters(k)
	}
	return t.conn.Flush()
}

// updateElements writes the named ports' differences of a policy whose
// shape did not change (its selection is regroup's, its peers
// updatePeers').
func (t *Table) updateElements(inst *instance, pp *PolicyProgram) error {
	for d, dir := range pp.Dir {
		for i, r := range dir.Rules {
			if !dir.Applies || !r.HasNamed {
				continue
			}
			was := inst.prog.Dir[d].Rules[i].Named
			for _, f := range t.opts.Families {
				id := inst.named[d][i]
				if err := t.writeDiff(t.namedSet(f), namedElems(f, id, was), namedElems(f, id, r.Named)); err != nil {
					return err
				}
			}
		}
	}
	inst.prog = pp
	return nil
}

// group is the chain a selected pod's address jumps to, through the
// direction's verdict map: one jump per policy selecting the pod (that has
// rules in the direction), then one rule counting each one's dropped
// counter and jumping to the drop. Pods selected by the same
// policies share it. A first packet meets the rules of its own group and
// policies, however many policies the node has; before the verdict maps,
// it walked one rule per policy and family (first packet 1.86-2.10 times
// slower with the 1,000 policies, BENCHMARKS.md).
type group struct {
	id       int
	policies []*instance
}

func (g *group) chainName(d Direction) string { return "g" + strconv.Itoa(g.id) + "-" + dirNames[d] }

func groupKey(insts []*instance) string {
	var b strings.Builder
	for _, inst := range insts {
		fmt.Fprintf(&b, "%d,", inst.id)
	}
	return b.String()
}

// regroup makes the verdict maps send each selected address to the group
// of the policies (instances) that select it now, adding the groups that
// are new and deleting those no address uses.
func (t *Table) regroup(prog *Program) error {
	for d := range dirNames {
		want := make(map[netip.Addr][]*instance)
		for _, pp := range prog.Policies {
			if pp.Dir[d].Applies {
				for _, a := range pp.Dir[d].Selected {
					want[a] = append(want[a], t.applied[pp.Key])
				}
			}
		}
		used := make(map[string]bool)
		var del, add []netip.Addr
		for a, insts := range want {
			key := groupKey(insts)
			g := t.groups[d][key]
			if g == nil {
				g = t.addGroup(Direction(d), key, insts)
			}
			used[key] = true
			if old := t.addrGroup[d][a]; old != g {
				if old != nil {
					del = append(del, a)
				}
				add = append(add, a)
				t.addrGroup[d][a] = g
			}
		}
		for a := range t.addrGroup[d] {
			if _, ok := want[a]; !ok {
				del = append(del, a)
				delete(t.addrGroup[d], a)
			}
		}
		if err := t.writeVmap(Direction(d), del, add); err != nil {
			return err
		}
		for key, g := range t.groups[d] {
			if !used[key] {
				t.conn.FlushChain(t.chain(g.chainName(Direction(d))))
				t.conn.DelChain(t.chain(g.chainName(Direction(d))))
				delete(t.groups[d], key)
			}
		}
	}
	return nil
}

func (t *Table) addGroup(d Direction, key string, insts []*instance) *group {
	g := &group{id: t.nextGroup, policies: insts}
	t.nextGroup++
	t.groups[d][key] = g
	chain := t.conn.AddChain(t.chain(g.chainName(d)))
	var last []expr.Any
	for _, inst := range insts {
		// A policy without rules in d (a default deny) allows nothing:
		// no jump, only its counter.
		if len(inst.prog.Dir[d].Rules) > 0 {
			t.conn.AddRule(&nftables.Rule{Table: t.table, Chain: chain, Exprs: jump(inst.chainName(d))})
		}
		_, dropped := CounterNames(inst.prog.Key)
		last = append(last, counterRef(dropped)...)
	}
	t.conn.AddRule(&nftables.Rule{Table: t.table, Chain: chain, Exprs: append(last, jump(dirNames[d]+"-drop")...)})
	return g
}

// writeVmap deletes del's elements from the direction's verdict maps, then
// adds add's, pointing at their groups.
func (t *Table) writeVmap(d Direction, del, add []netip.Addr) error {
	for _, f := range t.opts.Families {
		var dels, adds []nftables.SetElement
		for _, a := range del {
			if f.Has(a) {
				dels = append(dels, nftables.SetElement{Key: a.AsSlice()})
			}
		}
		for _, a := range add {
			if f.Has(a) {
				g := t.addrGroup[d][a]
				adds = append(adds, nftables.SetElement{Key: a.AsSlice(),
					VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: g.chainName(d)}})
			}
		}
		if err := nftmsg.DeleteElements(t.conn, t.vmap(d, f), dels); err != nil {
			return err
		}
		if err := nftmsg.AddElements(t.conn, t.vmap(d, f), adds); err != nil {
			return err
		}
	}
	return nil
}

func vmapName(d Direction, f ipfamily.Family) string { return dirNames[d] + "-pods-" + famSuffix(f) }

func (t *Table) vmap(d Direction, f ipfamily.Family) *nftables.Set {
	return &nftables.Set{Table: t.table, Name: vmapName(d, f), KeyType: addrType(f), IsMap: true, DataType: nftables.TypeVerdict}
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
// address is in the set.
func matchAddr(f ipfamily.Family, src bool, set string) []expr.Any {
	return concat(nfproto(f), []expr.Any{loadAddr(f, src, 1), &expr.Lookup{SourceRegister: 1, SetName: set}})
}

// vmapAddr sends packets of family f on through the verdict map by their
// source (or destination) address.
func vmapAddr(f ipfamily.Family, src bool, vmap string) []expr.Any {
	return concat(nfproto(f), []expr.Any{loadAddr(f, src, 1),
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: vmap}})
}

// The 32-bit registers (NFT_REG32_00 on) that concatenated keys are built
// in, field after field.
const reg32 = 8

// matchID looks (id . source or destination address) up in a shared set.
func matchID(f ipfamily.Family, src bool, id uint32, set string) []expr.Any {
	return concat(nfproto(f), []expr.Any{
		&expr.Immediate{Register: reg32, Data: binary.BigEndian.AppendUint32(nil, id)},
		loadAddr(f, src, reg32+1),
		&expr.Lookup{SourceRegister: reg32, SetName: set},
	})
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

// matchNamed looks (rule id . daddr . l4proto . dport) up in the family's
// named ports set.
func matchNamed(f ipfamily.Family, id uint32) []expr.Any {
	next := uint32(reg32 + 1 + f.Bits()/32)
	return concat(nfproto(f), []expr.Any{
		&expr.Immediate{Register: reg32, Data: binary.BigEndian.AppendUint32(nil, id)},
		loadAddr(f, false, reg32+1),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: next},
		dport(next + 1),
		&expr.Lookup{SourceRegister: reg32, SetName: namedSet(f)},
	})
}
