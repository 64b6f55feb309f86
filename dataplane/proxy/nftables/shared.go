package nftables

import (
	"slices"
	"strconv"

	"github.com/podnet/podnet/dataplane/cluster"
)

// shared holds the elements Services put into the family's shared sets,
// with every Service claiming each key: two Services may claim one key (a
// local endpoint address in two Services' hairpin elements, an address
// and port two Services declare), and the kernel holds one element a key.
// The first claimant's element is written; when it leaves, the next one's.
type shared struct {
	m map[string]map[string][]claim // set → element key → claims, in order
}

type claim struct {
	svc  cluster.Key
	elem Elem
}

func newShared() *shared { return &shared{m: make(map[string]map[string][]claim)} }

// elemKey is an element's key as text, for identity.
func elemKey(e Elem) string {
	b := make([]byte, 0, 48)
	for _, v := range e.Key {
		b = v.Addr.AppendTo(b)
		b = append(b, '/')
		if v.Prefix.IsValid() {
			b = v.Prefix.AppendTo(b)
		}
		b = append(b, '/')
		b = strconv.AppendUint(b, uint64(v.Num), 10)
		b = append(b, '/')
		b = strconv.AppendUint(b, v.ID, 16)
		b = append(b, ' ')
	}
	return string(b)
}

func (s *shared) add(k cluster.Key, elems []sharedElem) {
	for _, e := range elems {
		bySet := s.m[e.set]
		if bySet == nil {
			bySet = make(map[string][]claim)
			s.m[e.set] = bySet
		}
		ek := elemKey(e.elem)
		bySet[ek] = append(bySet[ek], claim{k, e.elem})
	}
}

func (s *shared) remove(k cluster.Key, elems []sharedElem) {
	for _, e := range elems {
		bySet := s.m[e.set]
		ek := elemKey(e.elem)
		cs := bySet[ek]
		if i := slices.IndexFunc(cs, func(c claim) bool { return c.svc == k }); i >= 0 {
			cs = slices.Delete(cs, i, i+1)
		}
		if len(cs) == 0 {
			delete(bySet, ek)
		} else {
			bySet[ek] = cs
		}
	}
}

// winner is the element written for key ek of set.
func (s *shared) winner(set, ek string) (Elem, bool) {
	cs := s.m[set][ek]
	if len(cs) == 0 {
		return Elem{}, false
	}
	return cs[0].elem, true
}

// fill puts the written elements into t's sets.
func (s *shared) fill(t *Table) {
	for set, bySet := range s.m {
		st := t.Sets[set]
		for _, cs := range bySet {
			st.Elems = append(st.Elems, cs[0].elem)
		}
	}
}

func sameElem(a, b Elem) bool {
	return elemKey(a) == elemKey(b) && a.Goto == b.Goto && a.To == b.To
}
