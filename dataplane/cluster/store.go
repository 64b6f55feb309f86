package cluster

import (
	"reflect"
	"slices"
	"strings"
	"sync"
)

// Event tells a subscriber that one object changed. Old is nil for an add,
// New is nil for a delete.
type Event struct {
	Kind Kind
	Key  Key
	Old  Object
	New  Object
}

// Handler receives events. It is called synchronously, in order, after the
// Store has been updated, with no Store lock held; it must not block (mark
// something dirty and signal a goroutine instead).
type Handler func(Event)

// Store holds the current cluster state. Sources write whole object sets
// (Replace) or single objects (Upsert, Delete); the Store diffs them against
// what it holds and emits one Event per real change. Safe for concurrent use.
type Store struct {
	mu      sync.RWMutex
	objects [numKinds]map[Key]Object
	// slices are a Service's EndpointSlices by name (all in its
	// namespace), a sorted slice rather than a map: most Services have
	// one, and a map each was 4.5 MiB at 10,000 Services.
	slices   map[Key][]*EndpointSlice
	handlers []Handler
	synced   chan struct{}
	once     sync.Once
	gen      uint64

	emitMu sync.Mutex // serializes delivery so handlers see events in order
}

// NewStore returns an empty, unsynced Store.
func NewStore() *Store {
	s := &Store{
		slices: make(map[Key][]*EndpointSlice),
		synced: make(chan struct{}),
	}
	for i := range s.objects {
		s.objects[i] = make(map[Key]Object)
	}
	return s
}

// Subscribe registers h for every later change.
func (s *Store) Subscribe(h Handler) {
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handlers = append(s.handlers, h)
}

// MarkSynced records that the source has delivered a complete state once.
func (s *Store) MarkSynced() { s.once.Do(func() { close(s.synced) }) }

// Synced is closed once the source has delivered a complete state.
func (s *Store) Synced() <-chan struct{} { return s.synced }

// Generation increases with every change; 0 means nothing was ever stored.
func (s *Store) Generation() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.gen
}

// Upsert adds or replaces one object.
func (s *Store) Upsert(obj Object) {
	s.apply(func() []Event {
		if ev, ok := s.set(obj.Kind(), obj.Key(), obj); ok {
			return []Event{ev}
		}
		return nil
	})
}

// Delete removes one object; deleting what is not there is a no-op.
func (s *Store) Delete(kind Kind, key Key) {
	s.apply(func() []Event {
		if ev, ok := s.set(kind, key, nil); ok {
			return []Event{ev}
		}
		return nil
	})
}

// Replace makes objs the complete set of objects of every kind in kinds:
// objects not in objs are deleted, others added or updated. Unchanged objects
// produce no event.
func (s *Store) Replace(kinds []Kind, objs []Object) {
	s.apply(func() []Event {
		want := make([]map[Key]Object, numKinds)
		for _, k := range kinds {
			want[k] = make(map[Key]Object)
		}
		for _, o := range objs {
			if want[o.Kind()] != nil {
				want[o.Kind()][o.Key()] = o
			}
		}
		var events []Event
		for _, k := range kinds {
			for key := range s.objects[k] {
				if _, ok := want[k][key]; !ok {
					if ev, ok := s.set(k, key, nil); ok {
						events = append(events, ev)
					}
				}
			}
			keys := make([]Key, 0, len(want[k]))
			for key := range want[k] {
				keys = append(keys, key)
			}
			slices.SortFunc(keys, compareKeys)
			for _, key := range keys {
				if ev, ok := s.set(k, key, want[k][key]); ok {
					events = append(events, ev)
				}
			}
		}
		return events
	})
}

// Ref names one object of the Store.
type Ref struct {
	Kind Kind
	Key  Key
}

// Apply makes the Store hold, for each ref in changes, its object, or none
// for a nil one, as one change; objects not named are left alone. Events
// come kind by kind, deletions first, then by key, as Replace gives them.
// A source that knows what changed uses it instead of Replace: the cost is
// that of the changes, not of every object held.
func (s *Store) Apply(changes map[Ref]Object) {
	refs := make([]Ref, 0, len(changes))
	for r := range changes {
		refs = append(refs, r)
	}
	slices.SortFunc(refs, func(a, b Ref) int {
		if a.Kind != b.Kind {
			return int(a.Kind) - int(b.Kind)
		}
		if da, db := changes[a] == nil, changes[b] == nil; da != db {
			if da {
				return -1
			}
			return 1
		}
		return compareKeys(a.Key, b.Key)
	})
	s.apply(func() []Event {
		var events []Event
		for _, r := range refs {
			if ev, ok := s.set(r.Kind, r.Key, changes[r]); ok {
				events = append(events, ev)
			}
		}
		return events
	})
}

func compareKeys(a, b Key) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// apply runs change under the write lock, then delivers its events in order.
func (s *Store) apply(change func() []Event) {
	s.emitMu.Lock()
	defer s.emitMu.Unlock()
	s.mu.Lock()
	events := change()
	if len(events) > 0 {
		s.gen++
	}
	handlers := s.handlers
	s.mu.Unlock()
	for _, ev := range events {
		for _, h := range handlers {
			h(ev)
		}
	}
}

// set stores (or, with obj nil, removes) one object and reports the event,
// if anything changed. Callers hold s.mu.
func (s *Store) set(kind Kind, key Key, obj Object) (Event, bool) {
	old, had := s.objects[kind][key]
	if obj == nil {
		if !had {
			return Event{}, false
		}
		delete(s.objects[kind], key)
	} else {
		if had && reflect.DeepEqual(old, obj) {
			return Event{}, false
		}
		s.objects[kind][key] = obj
	}
	if kind == KindEndpointSlice {
		if had {
			s.unindexSlice(old.(*EndpointSlice))
		}
		if obj != nil {
			s.indexSlice(obj.(*EndpointSlice))
		}
	}
	ev := Event{Kind: kind, Key: key, New: obj}
	if had {
		ev.Old = old
	}
	return ev, true
}

// Get returns one object, or nil.
func (s *Store) Get(kind Kind, key Key) Object {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.objects[kind][key]
}

// List returns every object of a kind, in no particular order.
func (s *Store) List(kind Kind) []Object {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Object, 0, len(s.objects[kind]))
	for _, o := range s.objects[kind] {
		out = append(out, o)
	}
	return out
}

// Node returns the named Node, or nil.
func (s *Store) Node(name string) *Node {
	o, _ := s.Get(KindNode, Key{Name: name}).(*Node)
	return o
}

// Nodes returns every Node.
func (s *Store) Nodes() []*Node { return listAs[*Node](s, KindNode) }

// Service returns one Service, or nil.
func (s *Store) Service(key Key) *Service {
	o, _ := s.Get(KindService, key).(*Service)
	return o
}

// Services returns every Service.
func (s *Store) Services() []*Service { return listAs[*Service](s, KindService) }

// Namespaces returns every Namespace.
func (s *Store) Namespaces() []*Namespace { return listAs[*Namespace](s, KindNamespace) }

func bySliceName(a *EndpointSlice, name string) int { return strings.Compare(a.Name, name) }

// indexSlice adds e to its Service's slices.
func (s *Store) indexSlice(e *EndpointSlice) {
	svc := e.ServiceKey()
	l := s.slices[svc]
	i, _ := slices.BinarySearchFunc(l, e.Name, bySliceName)
	s.slices[svc] = slices.Insert(l, i, e)
}

// unindexSlice removes e from its Service's slices.
func (s *Store) unindexSlice(e *EndpointSlice) {
	svc := e.ServiceKey()
	l := s.slices[svc]
	if i, ok := slices.BinarySearchFunc(l, e.Name, bySliceName); ok {
		l = slices.Delete(l, i, i+1)
	}
	if len(l) == 0 {
		delete(s.slices, svc)
		return
	}
	s.slices[svc] = l
}

// Pods returns every Pod.
func (s *Store) Pods() []*Pod { return listAs[*Pod](s, KindPod) }

// NetworkPolicies returns every NetworkPolicy.
func (s *Store) NetworkPolicies() []*NetworkPolicy {
	return listAs[*NetworkPolicy](s, KindNetworkPolicy)
}

// EndpointSlicesFor returns the slices labelled with the Service's name.
func (s *Store) EndpointSlicesFor(svc Key) []*EndpointSlice {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.slices[svc])
}

func listAs[T Object](s *Store, kind Kind) []T {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]T, 0, len(s.objects[kind]))
	for _, o := range s.objects[kind] {
		out = append(out, o.(T))
	}
	return out
}
