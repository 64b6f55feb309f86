package proxy

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/health"
)

// fakeConntrack records the filters it was asked to delete.
type fakeConntrack struct{ deleted []ConntrackFilter }

func (f *fakeConntrack) Delete(cs []ConntrackFilter) error {
	f.deleted = append(f.deleted, cs...)
	return nil
}

// udpObjs is a UDP Service with one endpoint per given address.
func udpObjs(eps ...string) []cluster.Object {
	s := &cluster.Service{Namespace: "ns", Name: "dns", Type: cluster.ServiceTypeClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports:      []cluster.ServicePort{{Name: "dns", Protocol: cluster.UDP, Port: 53}}}
	es := &cluster.EndpointSlice{Namespace: "ns", Name: "dns-x", ServiceName: "dns", AddressType: "IPv4",
		Ports: []cluster.EndpointPort{{Name: "dns", Protocol: cluster.UDP, Port: 53}}}
	for _, a := range eps {
		es.Endpoints = append(es.Endpoints, cluster.Endpoint{Addresses: []netip.Addr{netip.MustParseAddr(a)}, Ready: true, Serving: true})
	}
	return []cluster.Object{s, es}
}

// TestSyncOnce drives the syncer one sync at a time on a fake clock: the
// first sync is full, a change is a partial sync of that Service only,
// nothing changed is no sync, a failure makes the next sync full and its
// conntrack cleanup is done once a sync succeeds, and a SyncPeriod after
// the last full sync the next one is full again.
func TestSyncOnce(t *testing.T) {
	st := cluster.NewStore()
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, append(svcObjs(0), udpObjs("10.244.1.2")...))
	st.MarkSynced()
	b := &fakeBackend{sig: make(chan struct{}, 1)}
	ct := &fakeConntrack{}
	hc := health.NewChecker()
	s := newSyncer(Options{Store: st, NodeName: "n1", Backend: b, Conntrack: ct, Health: hc, SyncPeriod: time.Minute})
	clock := time.Unix(1000, 0)
	s.now = func() time.Time { return clock }
	s.start = clock

	step := func(what string, want *call, wantErr bool) {
		t.Helper()
		n := len(b.calls)
		err := s.syncOnce()
		if (err != nil) != wantErr {
			t.Fatalf("%s: err = %v, want error %v", what, err, wantErr)
		}
		switch {
		case want == nil && len(b.calls) != n:
			t.Fatalf("%s: backend synced %+v, want no sync", what, b.calls[n:])
		case want != nil && (len(b.calls) != n+1 || b.calls[n] != *want):
			t.Fatalf("%s: backend calls %+v, want one %+v", what, b.calls[n:], *want)
		}
	}

	step("first", &call{full: true, changed: 2, ports: 2}, false)
	step("nothing changed", nil, false)

	for _, o := range svcObjs(1) {
		st.Upsert(o)
	}
	step("one new Service", &call{full: false, changed: 1, ports: 3}, false)

	// The UDP Service moves to another endpoint, but the sync fails: the
	// old endpoint's entries stay until a sync succeeds.
	ct.deleted = nil
	b.fail = 1
	st.Upsert(udpObjs("10.244.1.3")[1])
	step("failing", &call{full: false, changed: 1, ports: 3}, true)
	if len(ct.deleted) != 0 {
		t.Errorf("conntrack entries deleted after a failed sync: %+v", ct.deleted)
	}
	step("after the failure", &call{full: true, changed: 0, ports: 3}, false)
	want := ConntrackFilter{Protocol: cluster.UDP, OrigDst: netip.MustParseAddr("10.96.0.10"), OrigDstPort: 53, ReplySrc: netip.MustParseAddr("10.244.1.2"), ReplySrcPort: 53}
	if len(ct.deleted) != 1 || ct.deleted[0] != want {
		t.Errorf("conntrack deletions %+v, want %+v", ct.deleted, want)
	}
	if err := hc.Err(); err != nil {
		t.Errorf("health after a successful sync: %v", err)
	}

	clock = clock.Add(59 * time.Second)
	step("before SyncPeriod", nil, false)
	clock = clock.Add(time.Second)
	step("at SyncPeriod", &call{full: true, changed: 0, ports: 3}, false)
}

// TestSyncerHealth: without a successful sync for two SyncPeriods the
// proxy is unhealthy, naming the last error.
func TestSyncerHealth(t *testing.T) {
	st := cluster.NewStore()
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, svcObjs(0))
	st.MarkSynced()
	b := &fakeBackend{sig: make(chan struct{}, 1), fail: 100}
	hc := health.NewChecker()
	s := newSyncer(Options{Store: st, Backend: b, Health: hc, SyncPeriod: time.Minute})
	clock := time.Unix(1000, 0)
	s.now = func() time.Time { return clock }
	s.start = clock
	if s.syncOnce() == nil {
		t.Fatal("sync with a failing backend succeeded")
	}
	if err := hc.Err(); err != nil {
		t.Errorf("unhealthy right after the first failure: %v", err)
	}
	clock = clock.Add(2*time.Minute + time.Second)
	if s.syncOnce() == nil {
		t.Fatal("sync with a failing backend succeeded")
	}
	if err := hc.Err(); err == nil {
		t.Error("healthy after two SyncPeriods of failures")
	}
	b.fail = 0
	if err := s.syncOnce(); err != nil {
		t.Fatal(err)
	}
	if err := hc.Err(); err != nil {
		t.Errorf("unhealthy after a successful sync: %v", err)
	}
}

// TestStartupGarbageFreedOnce: the start-up garbage is returned to the OS
// after the first successful full sync, not after a failed one, and not
// again.
func TestStartupGarbageFreedOnce(t *testing.T) {
	st := cluster.NewStore()
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, svcObjs(0))
	st.MarkSynced()
	b := &fakeBackend{sig: make(chan struct{}, 1), fail: 1}
	s := newSyncer(Options{Store: st, Backend: b, SyncPeriod: time.Minute})
	clock := time.Unix(1000, 0)
	s.now = func() time.Time { return clock }
	freed := 0
	s.freeMemory = func() { freed++ }
	for i, want := range []int{0, 1, 1} { // failed, first full, next full
		_ = s.syncOnce()
		if freed != want {
			t.Fatalf("after sync %d: memory freed %d times, want %d", i, freed, want)
		}
		clock = clock.Add(time.Minute)
	}
	if len(b.calls) != 3 || !b.calls[2].full {
		t.Fatalf("backend calls %+v, want three, the last full", b.calls)
	}
}

// TestPeriodicFullSyncBuildsNothing: a full sync that is due only because
// SyncPeriod passed reprograms the backend from the state as it is. It
// builds no ServicePort again: at 10,000 Services that was about 12 MB of
// garbage every period, which raised proxyd's RSS with each one.
func TestPeriodicFullSyncBuildsNothing(t *testing.T) {
	const services = 200
	st := cluster.NewStore()
	var objs []cluster.Object
	for i := range services {
		objs = append(objs, svcObjs(i)...)
	}
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, objs)
	st.MarkSynced()
	b := &fakeBackend{sig: make(chan struct{}, 1)}
	s := newSyncer(Options{Store: st, NodeName: "n1", Backend: b, Conntrack: &fakeConntrack{}, Health: health.NewChecker(), SyncPeriod: time.Minute})
	clock := time.Unix(1000, 0)
	s.now = func() time.Time { return clock }
	s.start = clock
	if err := s.syncOnce(); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(5, func() {
		clock = clock.Add(time.Minute)
		if err := s.syncOnce(); err != nil {
			t.Fatal(err)
		}
	})
	if last := b.calls[len(b.calls)-1]; !last.full || last.ports != services {
		t.Fatalf("periodic sync: %+v, want a full sync of %d ports", last, services)
	}
	// Building one Service's ports takes several allocations; the sync
	// itself a handful whatever the number of Services.
	if allocs > services/2 {
		t.Errorf("a periodic full sync of %d Services allocated %.0f times: it built the state again", services, allocs)
	}
}

// TestStatusIsWhatTheKernelHolds: the status lists what the last
// successful sync programmed, updated one changed Service at a time: a
// Service deleted while a sync fails is still listed, and gone once a sync
// succeeds; an endpoint's node comes from its EndpointSlice.
func TestStatusIsWhatTheKernelHolds(t *testing.T) {
	st := cluster.NewStore()
	objs := append(svcObjs(0), svcObjs(1)...)
	objs[1].(*cluster.EndpointSlice).Endpoints[0].NodeName = "n2"
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, objs)
	st.MarkSynced()
	b := &fakeBackend{sig: make(chan struct{}, 1)}
	s := newSyncer(Options{Store: st, NodeName: "n1", Backend: b, SyncPeriod: time.Minute})
	names := func() (out []string) {
		for _, ss := range s.status.status(s.o.Metrics).Services {
			out = append(out, ss.Name)
		}
		return out
	}
	if err := s.syncOnce(); err != nil {
		t.Fatal(err)
	}
	got := s.status.status(s.o.Metrics).Services
	if len(got) != 2 || got[0].Name != "s0" || got[0].Ports[0].Endpoints[0].Node != "n2" {
		t.Fatalf("status after the first sync: %+v, want s0 (endpoint on n2) and s1", got)
	}
	b.fail = 1
	st.Delete(cluster.KindService, cluster.Key{Namespace: "ns", Name: "s1"})
	if s.syncOnce() == nil {
		t.Fatal("sync with a failing backend succeeded")
	}
	if n := names(); len(n) != 2 {
		t.Errorf("status after a failed sync lists %v, want s0 and s1 as still programmed", n)
	}
	if err := s.syncOnce(); err != nil {
		t.Fatal(err)
	}
	if n := names(); len(n) != 1 || n[0] != "s0" {
		t.Errorf("status after the deletion was programmed lists %v, want s0", n)
	}
}

// TestSyncOnceDeletesTerminatingLater: an endpoint the rules sent to that
// turns terminating and not serving within one sync has its UDP entries
// deleted only at a sync staleGrace later (a run of nothing changed
// included); one that turns not ready without terminating, at once.
func TestSyncOnceDeletesTerminatingLater(t *testing.T) {
	st := cluster.NewStore()
	objs := udpObjs("10.244.1.2", "10.244.1.3")
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, objs)
	st.MarkSynced()
	ct := &fakeConntrack{}
	s := newSyncer(Options{Store: st, NodeName: "n1", Backend: &fakeBackend{sig: make(chan struct{}, 1)}, Conntrack: ct, Health: health.NewChecker(), SyncPeriod: time.Minute})
	clock := time.Unix(1000, 0)
	s.now = func() time.Time { return clock }
	sync := func() {
		t.Helper()
		if err := s.syncOnce(); err != nil {
			t.Fatal(err)
		}
	}
	sync()
	es := *objs[1].(*cluster.EndpointSlice)
	es.Endpoints = slices.Clone(es.Endpoints)
	es.Endpoints[0].Ready, es.Endpoints[0].Serving, es.Endpoints[0].Terminating = false, false, true
	st.Upsert(&es)
	ct.deleted = nil
	sync()
	if len(ct.deleted) != 0 {
		t.Fatalf("deleted at once: %+v, want after %v", ct.deleted, staleGrace)
	}
	clock = clock.Add(staleGrace - time.Millisecond)
	sync()
	if len(ct.deleted) != 0 {
		t.Fatalf("deleted before %v: %+v", staleGrace, ct.deleted)
	}
	clock = clock.Add(time.Millisecond)
	sync()
	want := ConntrackFilter{Protocol: cluster.UDP, OrigDst: netip.MustParseAddr("10.96.0.10"), OrigDstPort: 53, ReplySrc: netip.MustParseAddr("10.244.1.2"), ReplySrcPort: 53}
	if len(ct.deleted) != 1 || ct.deleted[0] != want {
		t.Fatalf("after %v: deleted %+v, want %+v", staleGrace, ct.deleted, want)
	}
	sync()
	if len(ct.deleted) != 1 {
		t.Errorf("deleted again: %+v", ct.deleted[1:])
	}

	ct.deleted = nil
	es2 := es
	es2.Endpoints = slices.Clone(es.Endpoints)
	es2.Endpoints[1].Ready, es2.Endpoints[1].Serving = false, false
	st.Upsert(&es2)
	sync()
	if want.ReplySrc = netip.MustParseAddr("10.244.1.3"); len(ct.deleted) != 1 || ct.deleted[0] != want {
		t.Errorf("an endpoint not ready (not terminating): deleted %+v, want %+v at once", ct.deleted, want)
	}
}
