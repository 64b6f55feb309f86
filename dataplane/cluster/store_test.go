package cluster

import (
	"net/netip"
	"slices"
	"testing"
)

type recorder struct{ events []string }

func (r *recorder) handle(ev Event) {
	op := "update"
	switch {
	case ev.Old == nil:
		op = "add"
	case ev.New == nil:
		op = "delete"
	}
	r.events = append(r.events, op+" "+ev.Kind.String()+" "+ev.Key.String())
}

func (r *recorder) take() []string {
	out := r.events
	r.events = nil
	return out
}

func svc(name, ip string) *Service {
	return &Service{Namespace: "default", Name: name, ClusterIPs: []netip.Addr{netip.MustParseAddr(ip)}}
}

func TestStoreReplaceEmitsOnlyRealChanges(t *testing.T) {
	s := NewStore()
	var r recorder
	s.Subscribe(r.handle)
	kinds := []Kind{KindService}

	s.Replace(kinds, []Object{svc("a", "10.96.0.1"), svc("b", "10.96.0.2")})
	if got, want := r.take(), []string{"add Service default/a", "add Service default/b"}; !slices.Equal(got, want) {
		t.Fatalf("first replace: got %v, want %v", got, want)
	}
	gen := s.Generation()

	// The same content in new objects is no change at all.
	s.Replace(kinds, []Object{svc("b", "10.96.0.2"), svc("a", "10.96.0.1")})
	if got := r.take(); len(got) != 0 {
		t.Fatalf("identical replace emitted %v", got)
	}
	if s.Generation() != gen {
		t.Fatal("identical replace bumped the generation")
	}

	s.Replace(kinds, []Object{svc("a", "10.96.0.9"), svc("c", "10.96.0.3")})
	if got, want := r.take(), []string{"delete Service default/b", "update Service default/a", "add Service default/c"}; !slices.Equal(got, want) {
		t.Fatalf("second replace: got %v, want %v", got, want)
	}
	if s.Generation() <= gen {
		t.Fatal("a change did not bump the generation")
	}
	if got := s.Service(Key{Namespace: "default", Name: "a"}).ClusterIPs[0]; got != netip.MustParseAddr("10.96.0.9") {
		t.Fatalf("service a not updated: %v", got)
	}
}

func TestStoreReplaceLeavesOtherKindsAlone(t *testing.T) {
	s := NewStore()
	s.Upsert(&Node{Name: "n1"})
	s.Replace([]Kind{KindService}, []Object{svc("a", "10.96.0.1")})
	if s.Node("n1") == nil {
		t.Fatal("replacing Services removed a Node")
	}
	s.Delete(KindNode, Key{Name: "n1"})
	s.Delete(KindNode, Key{Name: "n1"}) // twice is fine
	if len(s.Nodes()) != 0 {
		t.Fatal("node not deleted")
	}
}

func TestStoreIndexesSlicesByService(t *testing.T) {
	s := NewStore()
	web := Key{Namespace: "default", Name: "web"}
	api := Key{Namespace: "default", Name: "api"}
	s.Upsert(&EndpointSlice{Namespace: "default", Name: "web-2", ServiceName: "web"})
	s.Upsert(&EndpointSlice{Namespace: "default", Name: "web-1", ServiceName: "web"})
	names := func(k Key) []string {
		var out []string
		for _, e := range s.EndpointSlicesFor(k) {
			out = append(out, e.Name)
		}
		return out
	}
	if got := names(web); !slices.Equal(got, []string{"web-1", "web-2"}) {
		t.Fatalf("slices of web: %v", got)
	}
	// A slice relabelled to another Service moves with its label.
	s.Upsert(&EndpointSlice{Namespace: "default", Name: "web-2", ServiceName: "api"})
	if got := names(web); !slices.Equal(got, []string{"web-1"}) {
		t.Fatalf("slices of web after relabel: %v", got)
	}
	if got := names(api); !slices.Equal(got, []string{"web-2"}) {
		t.Fatalf("slices of api after relabel: %v", got)
	}
	// A changed slice replaces its old self.
	s.Upsert(&EndpointSlice{Namespace: "default", Name: "web-1", ServiceName: "web", AddressType: "IPv4"})
	if got := s.EndpointSlicesFor(web); len(got) != 1 || got[0].AddressType != "IPv4" {
		t.Fatalf("slices of web after an update: %+v", got)
	}
	s.Delete(KindEndpointSlice, Key{Namespace: "default", Name: "web-1"})
	if got := names(web); len(got) != 0 {
		t.Fatalf("deleted slice still indexed: %v", got)
	}
}

func TestStoreSynced(t *testing.T) {
	s := NewStore()
	select {
	case <-s.Synced():
		t.Fatal("new store claims to be synced")
	default:
	}
	s.MarkSynced()
	s.MarkSynced() // idempotent
	select {
	case <-s.Synced():
	default:
		t.Fatal("store not synced after MarkSynced")
	}
}

// TestStoreApply: only the named objects change, with the events Replace
// would give (kind by kind, deletions first, then by key), and nothing for
// an object that is the same or a deletion of what is not there.
func TestStoreApply(t *testing.T) {
	s := NewStore()
	s.Replace([]Kind{KindService, KindNamespace}, []Object{svc("a", "10.96.0.1"), svc("b", "10.96.0.2"), &Namespace{Name: "default"}})
	var r recorder
	s.Subscribe(r.handle)
	gen := s.Generation()
	ref := func(name string) Ref { return Ref{KindService, Key{Namespace: "default", Name: name}} }
	s.Apply(map[Ref]Object{ref("a"): svc("a", "10.96.0.1"), ref("zz"): nil})
	if got := r.take(); len(got) != 0 || s.Generation() != gen {
		t.Fatalf("Apply of nothing new emitted %v (generation %d, was %d)", got, s.Generation(), gen)
	}
	s.Apply(map[Ref]Object{
		ref("c"): svc("c", "10.96.0.3"), ref("b"): nil, ref("a"): svc("a", "10.96.0.9"),
		{KindNode, Key{Name: "n1"}}: &Node{Name: "n1"},
	})
	want := []string{"add Node n1", "delete Service default/b", "update Service default/a", "add Service default/c"}
	if got := r.take(); !slices.Equal(got, want) {
		t.Fatalf("Apply emitted %v, want %v", got, want)
	}
	if s.Generation() != gen+1 {
		t.Errorf("generation %d after one Apply, want %d", s.Generation(), gen+1)
	}
	if len(s.Namespaces()) != 1 || len(s.Services()) != 2 || len(s.EndpointSlicesFor(Key{Namespace: "default", Name: "a"})) != 0 {
		t.Errorf("objects not named were touched: %d namespaces, %d services", len(s.Namespaces()), len(s.Services()))
	}
}
