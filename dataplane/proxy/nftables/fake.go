package nftables

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"syscall"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// Fake is a Kernel in memory that refuses what the kernel refuses: an
// object used before it exists or deleted while referenced, a rule
// looking up a set of the wrong type, an element twice with different
// values or overlapping another interval, a chain deleted with rules. A
// transaction that fails changes nothing.
type Fake struct {
	mu    sync.Mutex
	state *fakeState
	// FailNext, when set, fails the next Apply with it.
	FailNext error
	// Applied counts the transactions committed; Ops the steps of the last.
	Applied, Ops int
	// Last is the last transaction committed.
	Last []Op
}

type fakeState struct {
	exists bool
	chains map[string]*fakeChain
	sets   map[string]*fakeSet
}

type fakeChain struct {
	Chain
	family ipfamily.Family
}

type fakeSet struct {
	Set
	family ipfamily.Family
	elems  map[string]Elem
}

// NewFake returns a Fake without the table.
func NewFake() *Fake {
	return &Fake{state: &fakeState{chains: map[string]*fakeChain{}, sets: map[string]*fakeSet{}}}
}

func (s *fakeState) clone() *fakeState {
	out := &fakeState{exists: s.exists, chains: make(map[string]*fakeChain, len(s.chains)), sets: make(map[string]*fakeSet, len(s.sets))}
	for n, c := range s.chains {
		cc := *c
		cc.Rules = slices.Clone(c.Rules)
		out.chains[n] = &cc
	}
	for n, st := range s.sets {
		cs := *st
		cs.elems = maps.Clone(st.elems)
		out.sets[n] = &cs
	}
	return out
}

// Objects implements Kernel.
func (f *Fake) Objects() ([]*Chain, []*Set, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var chains []*Chain
	var sets []*Set
	for _, n := range sortedKeys(f.state.chains) {
		c := f.state.chains[n].Chain
		c.Rules = nil
		chains = append(chains, &c)
	}
	for _, n := range sortedKeys(f.state.sets) {
		s := f.state.sets[n].Spec()
		sets = append(sets, &s)
	}
	return chains, sets, nil
}

// Apply implements Kernel.
func (f *Fake) Apply(ops []Op) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.FailNext; err != nil {
		f.FailNext = nil
		return err
	}
	next := f.state.clone()
	for i, op := range ops {
		if err := next.apply(op); err != nil {
			return fmt.Errorf("step %d (%s): %w", i, opName(op), err)
		}
	}
	f.state = next
	f.Applied++
	f.Ops = len(ops)
	f.Last = ops
	return nil
}

func opName(op Op) string {
	switch {
	case op.Chain != nil:
		return fmt.Sprintf("op %d chain %s", op.Kind, op.Chain.Name)
	case op.Set != nil:
		return fmt.Sprintf("op %d set %s", op.Kind, op.Set.Name)
	}
	return fmt.Sprintf("op %d", op.Kind)
}

func (s *fakeState) apply(op Op) error {
	if op.Kind == OpAddTable {
		s.exists = true
		return nil
	}
	if !s.exists {
		return fmt.Errorf("table %s: %w", TableName, syscall.ENOENT)
	}
	switch op.Kind {
	case OpDelTable:
		*s = fakeState{chains: map[string]*fakeChain{}, sets: map[string]*fakeSet{}}
	case OpAddChain, OpFlushChain, OpDelChain, OpAddRule:
		return s.applyChain(op)
	default:
		return s.applySet(op)
	}
	return nil
}

func (s *fakeState) applyChain(op Op) error {
	name := op.Chain.Name
	c, ok := s.chains[name]
	if !ok && op.Kind != OpAddChain {
		return fmt.Errorf("chain %s: %w", name, syscall.ENOENT)
	}
	switch op.Kind {
	case OpAddChain:
		if ok {
			if (c.Hook == nil) != (op.Chain.Hook == nil) || c.Hook != nil && *c.Hook != *op.Chain.Hook {
				return fmt.Errorf("chain %s declared differently: %w", name, syscall.EEXIST)
			}
			return nil
		}
		s.chains[name] = &fakeChain{Chain: Chain{Name: name, Hook: op.Chain.Hook}, family: op.Family}
	case OpFlushChain:
		c.Rules = nil
	case OpDelChain:
		if len(c.Rules) > 0 {
			return fmt.Errorf("chain %s has rules: %w", name, syscall.EBUSY)
		}
		if by := s.chainUser(name); by != "" {
			return fmt.Errorf("chain %s is used by %s: %w", name, by, syscall.EBUSY)
		}
		delete(s.chains, name)
	case OpAddRule:
		if err := s.checkRule(c, op.Rule); err != nil {
			return fmt.Errorf("rule %q in %s: %w", op.Rule.render(c.family), name, err)
		}
		c.Rules = append(c.Rules, op.Rule)
	}
	return nil
}

// chainUser names what refers to chain: a rule or a map element.
func (s *fakeState) chainUser(chain string) string {
	for _, c := range s.chains {
		for _, r := range c.Rules {
			for _, st := range r.Do {
				if (st.Kind == StmtJump || st.Kind == StmtGoto) && st.Chain == chain {
					return "a rule of " + c.Name
				}
			}
		}
	}
	for _, st := range s.sets {
		for _, e := range st.elems {
			if e.Goto == chain {
				return "an element of " + st.Name
			}
		}
	}
	return ""
}

// setUser names the rule looking up set.
func (s *fakeState) setUser(set string) string {
	for _, c := range s.chains {
		for _, r := range c.Rules {
			for _, m := range r.Match {
				if m.Kind == MatchSet && m.Set == set {
					return "a rule of " + c.Name
				}
			}
			for _, st := range r.Do {
				if st.Map == set || st.Affinity == set {
					return "a rule of " + c.Name
				}
			}
		}
	}
	return ""
}

var errType = errors.New("type mismatch")

func fieldType(fl Field) Type {
	switch fl {
	case FieldDaddr, FieldSaddr:
		return TypeAddr
	case FieldL4Proto:
		return TypeProto
	}
	return TypePort
}

func (s *fakeState) lookup(name string, key []Type, data []Type, dynamic bool) error {
	st, ok := s.sets[name]
	if !ok {
		return fmt.Errorf("set %s: %w", name, syscall.ENOENT)
	}
	if !slices.Equal(st.Key, key) || !slices.Equal(st.Data, data) || (st.Timeout > 0) != dynamic {
		return fmt.Errorf("set %s is %v : %v, looked up as %v : %v: %w", name, st.Key, st.Data, key, data, errType)
	}
	return nil
}

func (s *fakeState) checkRule(c *fakeChain, r Rule) error {
	for _, m := range r.Match {
		if m.Kind != MatchSet {
			continue
		}
		key := make([]Type, len(m.Key))
		for i, fl := range m.Key {
			key[i] = fieldType(fl)
		}
		if err := s.lookup(m.Set, key, nil, false); err != nil {
			return err
		}
	}
	for _, st := range r.Do {
		var err error
		switch st.Kind {
		case StmtJump, StmtGoto:
			if _, ok := s.chains[st.Chain]; !ok {
				err = fmt.Errorf("chain %s: %w", st.Chain, syscall.ENOENT)
			}
		case StmtVmap:
			key := make([]Type, len(st.Key))
			for i, fl := range st.Key {
				key[i] = fieldType(fl)
			}
			err = s.lookup(st.Map, key, []Type{TypeVerdict}, false)
		case StmtDNATRandom:
			err = s.lookup(st.Map, []Type{TypeID, TypeIndex}, []Type{TypeAddr, TypePort}, false)
			if err == nil && st.Affinity != "" {
				err = s.lookup(st.Affinity, []Type{TypeID, TypeAddr}, []Type{TypeAddr, TypePort}, true)
			}
		case StmtDNATAffinity:
			err = s.lookup(st.Affinity, []Type{TypeID, TypeAddr}, []Type{TypeAddr, TypePort}, true)
			if err == nil {
				err = s.lookup(st.Map, []Type{TypeID, TypeAddr, TypePort}, nil, false)
			}
		case StmtForget:
			err = s.lookup(st.Affinity, []Type{TypeID, TypeAddr}, []Type{TypeAddr, TypePort}, true)
		case StmtMasquerade:
			if c.Hook != nil && c.Hook.Hook != "postrouting" {
				err = fmt.Errorf("masquerade outside postrouting: %w", syscall.EOPNOTSUPP)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *fakeState) applySet(op Op) error {
	name := op.Set.Name
	st, ok := s.sets[name]
	if !ok && op.Kind != OpAddSet {
		return fmt.Errorf("set %s: %w", name, syscall.ENOENT)
	}
	switch op.Kind {
	case OpAddSet:
		if ok && !SameSpec(&st.Set, op.Set) {
			return fmt.Errorf("set %s declared differently: %w", name, syscall.EEXIST)
		}
		if !ok {
			st = &fakeSet{Set: op.Set.Spec(), family: op.Family, elems: map[string]Elem{}}
			s.sets[name] = st
		}
		return s.addElems(st, op.Set.Elems)
	case OpFlushSet:
		st.elems = map[string]Elem{}
	case OpDelSet:
		if by := s.setUser(name); by != "" {
			return fmt.Errorf("set %s is used by %s: %w", name, by, syscall.EBUSY)
		}
		delete(s.sets, name)
	case OpAddElems:
		return s.addElems(st, op.Elems)
	case OpDelElems:
		for _, e := range op.Elems {
			k := elemKey(e)
			if _, ok := st.elems[k]; !ok {
				return fmt.Errorf("element %s of %s: %w", e.render(&st.Set), name, syscall.ENOENT)
			}
			delete(st.elems, k)
		}
	}
	return nil
}

func (s *fakeState) addElems(st *fakeSet, elems []Elem) error {
	for _, e := range elems {
		if len(e.Key) != len(st.Key) {
			return fmt.Errorf("element %s of %s: key of %d fields, want %d: %w", e.render(&st.Set), st.Name, len(e.Key), len(st.Key), syscall.EINVAL)
		}
		if (e.Goto != "") != slices.Equal(st.Data, []Type{TypeVerdict}) || e.To.IsValid() != (len(st.Data) == 2) {
			return fmt.Errorf("element %s of %s: value does not fit: %w", e.render(&st.Set), st.Name, syscall.EINVAL)
		}
		if e.Goto != "" {
			if _, ok := s.chains[e.Goto]; !ok {
				return fmt.Errorf("element %s of %s: chain %s: %w", e.render(&st.Set), st.Name, e.Goto, syscall.ENOENT)
			}
		}
		k := elemKey(e)
		if old, ok := st.elems[k]; ok && !sameElem(old, e) {
			return fmt.Errorf("element %s of %s exists with another value: %w", e.render(&st.Set), st.Name, syscall.EEXIST)
		}
		if st.Interval {
			for ok, o := range st.elems {
				if ok != k && o.Key[0].Prefix.Overlaps(e.Key[0].Prefix) {
					return fmt.Errorf("element %s of %s overlaps %s: %w", e.render(&st.Set), st.Name, o.render(&st.Set), syscall.EEXIST)
				}
			}
		}
		st.elems[k] = e
	}
	return nil
}

// Table returns the objects of family f the Fake holds, as a Table.
func (f *Fake) Table(fam ipfamily.Family) *Table {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &Table{Family: fam, Chains: map[string]*Chain{}, Sets: map[string]*Set{}}
	for n, c := range f.state.chains {
		if c.family == fam {
			cc := c.Chain
			t.Chains[n] = &cc
		}
	}
	for n, s := range f.state.sets {
		if s.family == fam {
			cs := s.Spec()
			for _, e := range s.elems {
				cs.Elems = append(cs.Elems, e)
			}
			t.Sets[n] = &cs
		}
	}
	return t
}

// Exists reports whether the table exists.
func (f *Fake) Exists() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.exists
}

// AddAffinity puts a client into a dynamic affinity map, as a packet
// would.
func (f *Fake) AddAffinity(set string, e Elem) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st := f.state.sets[set]; st != nil {
		st.elems[elemKey(e)] = e
	}
}
