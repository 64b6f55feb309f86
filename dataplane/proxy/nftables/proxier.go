package nftables

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
)

// OpKind is one step of a transaction.
type OpKind uint8

const (
	OpAddTable   OpKind = iota + 1 // create the table unless it exists
	OpDelTable                     // delete the table and all in it
	OpAddChain                     // create Chain (without rules) unless it exists
	OpFlushChain                   // delete Chain's rules
	OpDelChain                     // delete the empty, unreferenced Chain
	OpAddRule                      // append Rule to Chain
	OpAddSet                       // create Set (with its elements) unless it exists
	OpFlushSet                     // delete Set's elements
	OpDelSet                       // delete the unreferenced Set
	OpAddElems                     // add Elems to Set
	OpDelElems                     // delete Elems from Set
)

// Op is one step of a transaction on podnet's table. Chain and Set name
// the object (with its declaration for the adds).
type Op struct {
	Kind   OpKind
	Family ipfamily.Family // of the object's addresses
	Chain  *Chain
	Rule   Rule
	Set    *Set
	Elems  []Elem
}

// Kernel is podnet's table in the kernel.
type Kernel interface {
	// Objects lists the chains and sets the table holds, declarations
	// only (no rules, no elements); nothing and no error when the table
	// does not exist.
	Objects() (chains []*Chain, sets []*Set, err error)
	// Apply runs ops as one transaction: all of them or none.
	Apply(ops []Op) error
}

// Owned reports whether the object name belongs to the Service proxy of
// family f.
func Owned(name string, f ipfamily.Family) bool {
	if strings.HasPrefix(name, nodePrefix) {
		return false
	}
	s := Config{Family: f}.sfx()
	return strings.HasSuffix(name, "-"+s) || strings.Contains(name, "-"+s+"-")
}

// Proxier is the nftables proxy.Backend of one address family.
type Proxier struct {
	cfg    Config
	kernel Kernel
	// What the kernel holds after the last successful sync; valid only
	// when synced (else the next sync is full).
	synced    bool
	lastPorts map[cluster.Key][]*proxy.ServicePort
	objs      map[cluster.Key][]*portObjects // by Service, per port
	shared    *shared
	// memo holds each ServicePort's objects while it is in use (a
	// ServicePort is never changed).
	memo map[*proxy.ServicePort]*portObjects
	// Chains and elements of the Services' own objects (count).
	ownChains, ownElems int
	// Stats of the last sync, for tests and status.
	LastOps int
}

var _ proxy.Backend = (*Proxier)(nil)

// NewProxier returns a Proxier of cfg.Family; it does nothing until Sync.
func NewProxier(cfg Config, k Kernel) *Proxier {
	if cfg.Family == 0 {
		cfg.Family = ipfamily.OfPrefix(cfg.ClusterCIDR)
	}
	if cfg.Family == 0 {
		cfg.Family = ipfamily.IPv4
	}
	return &Proxier{cfg: cfg, kernel: k}
}

// Sync implements proxy.Backend: a full sync rewrites every object of the
// family in one transaction; otherwise only the objects and elements of
// the Services that differ from the last sync change, in one transaction.
// After a failure the next sync is full.
//
// changed (the Services that differ from the last successful sync, as
// proxy.Backend says) is what a partial sync looks at; nil: every
// Service is compared with the last sync's.
func (p *Proxier) Sync(ports map[cluster.Key][]*proxy.ServicePort, changed map[cluster.Key]bool, full bool) (proxy.SyncResult, error) {
	var ops []Op
	var err error
	var keys []cluster.Key
	partial := !full && p.synced
	if partial {
		keys = p.changedKeys(ports, changed)
		ops = p.partialOps(ports, keys)
	} else {
		ops, err = p.fullOps(ports)
	}
	if err != nil {
		p.synced = false
		return proxy.SyncResult{}, err
	}
	p.LastOps = len(ops)
	if len(ops) > 0 {
		if err := p.kernel.Apply(ops); err != nil {
			p.synced = false
			return proxy.SyncResult{}, fmt.Errorf("nftables transaction: %w", err)
		}
	}
	p.synced = true
	// The caller updates its map in place between syncs: the last sync's
	// is a copy.
	if !partial {
		p.lastPorts = maps.Clone(ports)
	}
	for _, k := range keys {
		if sps, ok := ports[k]; ok {
			p.lastPorts[k] = sps
		} else {
			delete(p.lastPorts, k)
		}
	}
	return proxy.SyncResult{Rules: p.count()}, nil
}

// changedKeys are the Services whose ports differ from the last sync's:
// among changed, or among all when changed is nil.
func (p *Proxier) changedKeys(ports map[cluster.Key][]*proxy.ServicePort, changed map[cluster.Key]bool) []cluster.Key {
	var keys []cluster.Key
	if changed != nil {
		for k := range changed {
			if !slices.Equal(p.lastPorts[k], ports[k]) {
				keys = append(keys, k)
			}
		}
		return keys
	}
	for k, sps := range ports {
		if !slices.Equal(p.lastPorts[k], sps) {
			keys = append(keys, k)
		}
	}
	for k := range p.lastPorts {
		if _, ok := ports[k]; !ok {
			keys = append(keys, k)
		}
	}
	return keys
}

// objCount is the chains and elements of a Service's own objects.
func objCount(objs []*portObjects) (chains, elems int) {
	for _, o := range objs {
		chains += len(o.chains)
		for _, s := range o.sets {
			elems += len(s.Elems)
		}
	}
	return chains, elems
}

// count is what the table holds, by kind.
func (p *Proxier) count() map[string]int {
	elems := p.ownElems
	for _, bySet := range p.shared.m {
		elems += len(bySet)
	}
	return map[string]int{"nftables-chains": p.ownChains, "nftables-elements": elems}
}

func (p *Proxier) portObjects(sp *proxy.ServicePort, memo map[*proxy.ServicePort]*portObjects) *portObjects {
	if o := p.memo[sp]; o != nil {
		memo[sp] = o
		return o
	}
	o := p.cfg.port(sp)
	memo[sp] = o
	return o
}

// wanted builds the family's whole table for ports, with what each
// Service contributes.
func (p *Proxier) wanted(ports map[cluster.Key][]*proxy.ServicePort) (*Table, map[*proxy.ServicePort]*portObjects, map[cluster.Key][]*portObjects, *shared) {
	want := p.cfg.Static()
	memo := make(map[*proxy.ServicePort]*portObjects)
	objs := make(map[cluster.Key][]*portObjects, len(ports))
	sh := newShared()
	for _, k := range sortedServiceKeys(ports) {
		for _, sp := range ports[k] {
			o := p.portObjects(sp, memo)
			objs[k] = append(objs[k], o)
			for _, ch := range o.chains {
				want.Chains[ch.Name] = ch
			}
			for _, s := range o.sets {
				want.Sets[s.Name] = s
			}
			sh.add(k, o.shared)
		}
	}
	for set, bySet := range sh.m {
		for ek := range bySet {
			e, _ := sh.winner(set, ek)
			s := want.Sets[set]
			s.Elems = append(s.Elems, e)
		}
	}
	return want, memo, objs, sh
}

// fullOps rebuilds the family's objects: every chain of the family is
// flushed and refilled, every set refilled (affinity maps keep their
// clients), and what is no longer wanted deleted, all in one transaction.
func (p *Proxier) fullOps(ports map[cluster.Key][]*proxy.ServicePort) ([]Op, error) {
	chains, sets, err := p.kernel.Objects()
	if err != nil {
		return nil, fmt.Errorf("list table %s: %w", TableName, err)
	}
	f := p.cfg.Family
	want, memo, objs, sh := p.wanted(ports)
	ops := []Op{{Kind: OpAddTable}}
	var dels []Op
	have := make(map[string]bool)
	for _, c := range chains {
		if !Owned(c.Name, f) {
			continue
		}
		have["chain "+c.Name] = true
		ops = append(ops, Op{Kind: OpFlushChain, Family: f, Chain: c})
		if _, ok := want.Chains[c.Name]; !ok {
			dels = append(dels, Op{Kind: OpDelChain, Family: f, Chain: c})
		}
	}
	keep := make(map[string]bool) // dynamic sets kept as they are
	for _, s := range sets {
		if !Owned(s.Name, f) {
			continue
		}
		w, ok := want.Sets[s.Name]
		switch {
		case ok && SameSpec(s, w) && w.Timeout > 0:
			keep[s.Name] = true
		case ok && SameSpec(s, w):
			have["set "+s.Name] = true
			ops = append(ops, Op{Kind: OpFlushSet, Family: f, Set: s})
		default:
			ops = append(ops, Op{Kind: OpDelSet, Family: f, Set: s})
		}
	}
	ops = append(ops, fillOps(f, want, have, keep)...)
	p.memo, p.objs, p.shared = memo, objs, sh
	p.ownChains, p.ownElems = 0, 0
	for _, o := range objs {
		c, e := objCount(o)
		p.ownChains += c
		p.ownElems += e
	}
	return append(ops, dels...), nil
}

// fillOps creates what want holds and have lacks, and fills it: chains,
// sets, rules, then elements. Elements go last because the kernel checks
// a map's elements when a rule of a chain first looks it up, every one
// of them, and checks an element added later against each chain looking
// the map up: the latter is a short loop, the former a walk of the map.
func fillOps(f ipfamily.Family, want *Table, have, keep map[string]bool) []Op {
	var ops, elems []Op
	for _, name := range sortedKeys(want.Chains) {
		if !have["chain "+name] {
			ops = append(ops, Op{Kind: OpAddChain, Family: f, Chain: want.Chains[name]})
		}
	}
	for _, name := range sortedKeys(want.Sets) {
		s := want.Sets[name]
		if keep[name] {
			continue
		}
		if !have["set "+name] {
			spec := s.Spec()
			ops = append(ops, Op{Kind: OpAddSet, Family: f, Set: &spec})
		}
		if len(s.Elems) > 0 {
			elems = append(elems, Op{Kind: OpAddElems, Family: f, Set: s, Elems: s.Elems})
		}
	}
	for _, name := range sortedKeys(want.Chains) {
		for _, r := range want.Chains[name].Rules {
			ops = append(ops, Op{Kind: OpAddRule, Family: f, Chain: want.Chains[name], Rule: r})
		}
	}
	return append(ops, elems...)
}

// change is what the partial sync writes, collected per kind so the
// transaction can order them: references go before what they reference
// is deleted, and after what they reference is created.
type change struct {
	f                      ipfamily.Family
	delShared, addShared   []Op
	newChains, flushChains []*Chain
	delChains              []*Chain
	delSets, addSets       []*Set
	delElems, addElems     []Op
	rewriteChains          []*Chain
	touched                map[[2]string]bool // shared (set, element key) claims changed
	oldWinners             map[[2]string]*Elem
	sharedByName           map[string]*Set
}

// partialOps writes what differs for the Services whose ServicePorts
// changed since the last sync.
func (p *Proxier) partialOps(ports map[cluster.Key][]*proxy.ServicePort, keys []cluster.Key) []Op {
	if len(keys) == 0 {
		return nil
	}
	c := &change{f: p.cfg.Family, touched: make(map[[2]string]bool), oldWinners: make(map[[2]string]*Elem),
		sharedByName: p.cfg.Static().Sets}
	memo := p.memo
	for _, k := range keys {
		old := p.objs[k]
		var nw []*portObjects
		for _, sp := range ports[k] {
			nw = append(nw, p.portObjects(sp, memo))
		}
		p.diffService(c, k, old, nw)
		oc, oe := objCount(old)
		nc, ne := objCount(nw)
		p.ownChains += nc - oc
		p.ownElems += ne - oe
		for _, sp := range p.lastPorts[k] {
			if !slices.Contains(ports[k], sp) {
				delete(memo, sp)
			}
		}
		if len(nw) == 0 {
			delete(p.objs, k)
		} else {
			p.objs[k] = nw
		}
	}
	p.memo = memo
	p.settleShared(c)
	return c.ops()
}

// diffService records the difference between one Service's objects before
// and after.
func (p *Proxier) diffService(c *change, k cluster.Key, old, nw []*portObjects) {
	oldChains, oldSets := p.collect(c, k, old, p.shared.remove)
	newChains, newSets := p.collect(c, k, nw, p.shared.add)
	gone := c.diffSets(oldSets, newSets)
	for name, ch := range oldChains {
		if _, ok := newChains[name]; !ok {
			c.flushChains = append(c.flushChains, ch)
			c.delChains = append(c.delChains, ch)
		}
	}
	for name, ch := range newChains {
		oc, ok := oldChains[name]
		switch {
		case !ok:
			c.newChains = append(c.newChains, ch)
			c.rewriteChains = append(c.rewriteChains, ch)
		case !sameRules(oc.Rules, ch.Rules) || usesAny(ch, gone):
			// A chain whose rules look up a set deleted or declared anew
			// is rewritten too, so the set is unreferenced when it goes.
			c.flushChains = append(c.flushChains, ch)
			c.rewriteChains = append(c.rewriteChains, ch)
		}
	}
}

// collect indexes a Service's objects by name and moves its shared
// elements in or out (update) after noting the elements written before.
func (p *Proxier) collect(c *change, k cluster.Key, objs []*portObjects, update func(cluster.Key, []sharedElem)) (map[string]*Chain, map[string]*Set) {
	chains, sets := map[string]*Chain{}, map[string]*Set{}
	for _, o := range objs {
		for _, ch := range o.chains {
			chains[ch.Name] = ch
		}
		for _, s := range o.sets {
			sets[s.Name] = s
		}
		for _, e := range o.shared {
			c.noteShared(p.shared, e)
		}
		update(k, o.shared)
	}
	return chains, sets
}

// diffSets records the changes of a Service's own sets and returns the
// names of those deleted or declared anew.
func (c *change) diffSets(oldSets, newSets map[string]*Set) map[string]bool {
	gone := make(map[string]bool)
	for name, s := range oldSets {
		if _, ok := newSets[name]; !ok {
			c.delSets = append(c.delSets, s)
			gone[name] = true
		}
	}
	for name, s := range newSets {
		os, ok := oldSets[name]
		switch {
		case !ok:
			c.addSets = append(c.addSets, s)
		case !SameSpec(os, s):
			c.delSets = append(c.delSets, os)
			c.addSets = append(c.addSets, s)
			gone[name] = true
		default:
			c.diffElems(os, s)
		}
	}
	return gone
}

func usesAny(ch *Chain, sets map[string]bool) bool {
	for _, r := range ch.Rules {
		for _, m := range r.Match {
			if sets[m.Set] {
				return true
			}
		}
		for _, s := range r.Do {
			if sets[s.Map] || sets[s.Affinity] {
				return true
			}
		}
	}
	return false
}

// noteShared remembers the element written for e's key before the change.
func (c *change) noteShared(sh *shared, e sharedElem) {
	k := [2]string{e.set, elemKey(e.elem)}
	if c.touched[k] {
		return
	}
	c.touched[k] = true
	if w, ok := sh.winner(e.set, k[1]); ok {
		c.oldWinners[k] = &w
	}
}

// settleShared writes the shared elements whose winner changed: one
// deletion and one addition per set.
func (p *Proxier) settleShared(c *change) {
	del, add := map[string][]Elem{}, map[string][]Elem{}
	for k := range c.touched {
		old := c.oldWinners[k]
		nw, ok := p.shared.winner(k[0], k[1])
		switch {
		case old != nil && ok && sameElem(*old, nw):
		case old != nil && ok:
			del[k[0]] = append(del[k[0]], *old)
			add[k[0]] = append(add[k[0]], nw)
		case old != nil:
			del[k[0]] = append(del[k[0]], *old)
		case ok:
			add[k[0]] = append(add[k[0]], nw)
		}
	}
	for _, set := range sortedKeys(del) {
		c.delShared = append(c.delShared, Op{Kind: OpDelElems, Family: c.f, Set: c.sharedByName[set], Elems: del[set]})
	}
	for _, set := range sortedKeys(add) {
		c.addShared = append(c.addShared, Op{Kind: OpAddElems, Family: c.f, Set: c.sharedByName[set], Elems: add[set]})
	}
}

// diffElems records the element changes of a set kept (a dynamic set's
// elements belong to the kernel).
func (c *change) diffElems(old, nw *Set) {
	if nw.Timeout > 0 {
		return
	}
	had := make(map[string]Elem, len(old.Elems))
	for _, e := range old.Elems {
		had[elemKey(e)] = e
	}
	var del, add []Elem
	for _, e := range nw.Elems {
		o, ok := had[elemKey(e)]
		if ok && sameElem(o, e) {
			delete(had, elemKey(e))
			continue
		}
		if ok {
			del = append(del, o)
			delete(had, elemKey(e))
		}
		add = append(add, e)
	}
	for _, e := range had {
		del = append(del, e)
	}
	if len(del) > 0 {
		c.delElems = append(c.delElems, Op{Kind: OpDelElems, Family: c.f, Set: nw, Elems: del})
	}
	if len(add) > 0 {
		c.addElems = append(c.addElems, Op{Kind: OpAddElems, Family: c.f, Set: nw, Elems: add})
	}
}

func sameRules(a, b []Rule) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !slices.EqualFunc(a[i].Match, b[i].Match, func(x, y Match) bool {
			return x.Kind == y.Kind && x.Field == y.Field && x.Neg == y.Neg && x.Prefix == y.Prefix && x.Set == y.Set && x.Mark == y.Mark && slices.Equal(x.Key, y.Key)
		}) || !slices.EqualFunc(a[i].Do, b[i].Do, func(x, y Stmt) bool {
			return x.Kind == y.Kind && x.Chain == y.Chain && x.Map == y.Map && x.Mark == y.Mark && x.N == y.N && x.Affinity == y.Affinity && x.Random == y.Random &&
				x.ID == y.ID && x.Timeout == y.Timeout && slices.Equal(x.Key, y.Key)
		}) {
			return false
		}
	}
	return true
}

// ops orders the change into one transaction: elements pointing at
// chains go first, new chains are created before anything jumps to them,
// chains are flushed before the sets they look up are deleted, sets are
// created before rules look them up, and chains are deleted last.
func (c *change) ops() []Op {
	var ops []Op
	ops = append(ops, c.delShared...)
	for _, ch := range c.newChains {
		ops = append(ops, Op{Kind: OpAddChain, Family: c.f, Chain: ch})
	}
	for _, ch := range c.flushChains {
		ops = append(ops, Op{Kind: OpFlushChain, Family: c.f, Chain: ch})
	}
	for _, s := range c.delSets {
		ops = append(ops, Op{Kind: OpDelSet, Family: c.f, Set: s})
	}
	for _, s := range c.addSets {
		ops = append(ops, Op{Kind: OpAddSet, Family: c.f, Set: s})
	}
	ops = append(ops, c.delElems...)
	ops = append(ops, c.addElems...)
	for _, ch := range c.rewriteChains {
		for _, r := range ch.Rules {
			ops = append(ops, Op{Kind: OpAddRule, Family: c.f, Chain: ch, Rule: r})
		}
	}
	ops = append(ops, c.addShared...)
	for _, ch := range c.delChains {
		ops = append(ops, Op{Kind: OpDelChain, Family: c.f, Chain: ch})
	}
	return ops
}
