package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/health"
)

type call struct {
	full    bool
	changed int
	ports   int
}

type fakeBackend struct {
	mu    sync.Mutex
	calls []call
	fail  int // fail this many next calls
	sig   chan struct{}
}

func (b *fakeBackend) Sync(ports map[cluster.Key][]*ServicePort, changed map[cluster.Key]bool, full bool) (SyncResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, call{full, len(changed), len(ports)})
	defer func() {
		select {
		case b.sig <- struct{}{}:
		default:
		}
	}()
	if b.fail > 0 {
		b.fail--
		return SyncResult{}, errors.New("boom")
	}
	return SyncResult{Rules: map[string]int{"nat": 1}}, nil
}

func (b *fakeBackend) wait(t *testing.T, n int) []call {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		b.mu.Lock()
		if len(b.calls) >= n {
			c := append([]call(nil), b.calls...)
			b.mu.Unlock()
			return c
		}
		b.mu.Unlock()
		select {
		case <-b.sig:
		case <-deadline:
			t.Fatalf("waited for %d syncs", n)
		}
	}
}

func svcObjs(i int) []cluster.Object {
	s := &cluster.Service{Namespace: "ns", Name: fmt.Sprintf("s%d", i), Type: cluster.ServiceTypeClusterIP,
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)})},
		Ports:      []cluster.ServicePort{{Name: "p", Protocol: cluster.TCP, Port: 80}}}
	es := &cluster.EndpointSlice{Namespace: "ns", Name: s.Name + "-x", ServiceName: s.Name, AddressType: "IPv4",
		Ports:     []cluster.EndpointPort{{Name: "p", Protocol: cluster.TCP, Port: 8080}},
		Endpoints: []cluster.Endpoint{{Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 1, byte(i + 2)})}, Ready: true, Serving: true}}}
	return []cluster.Object{s, es}
}

func TestRunBatchesAndRecoversWithFullSync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := cluster.NewStore()
		var objs []cluster.Object
		for i := range 3 {
			objs = append(objs, svcObjs(i)...)
		}
		st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, objs)
		st.MarkSynced()
		b := &fakeBackend{sig: make(chan struct{}, 1)}
		hc := health.NewChecker()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() {
			done <- Run(ctx, Options{Store: st, NodeName: "n1", Backend: b, SyncPeriod: time.Hour, MinSyncPeriod: 200 * time.Millisecond, Health: hc})
		}()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}()
		c := b.wait(t, 1)
		if !c[0].full || c[0].ports != 3 {
			t.Fatalf("first sync %+v, want full with 3 Services", c[0])
		}
		// Three changes in quick succession land in one partial sync.
		for i := 3; i < 6; i++ {
			for _, o := range svcObjs(i) {
				st.Upsert(o)
			}
		}
		c = b.wait(t, 2)
		after(300 * time.Millisecond)
		b.mu.Lock()
		n := len(b.calls)
		b.mu.Unlock()
		if c[1].full || c[1].changed != 3 || n != 2 {
			t.Errorf("syncs after three changes: %+v (total %d), want one partial sync of 3 Services", c[1:], n)
		}
		// A failed sync is retried as a full one.
		b.mu.Lock()
		b.fail = 1
		b.mu.Unlock()
		st.Delete(cluster.KindService, cluster.Key{Namespace: "ns", Name: "s0"})
		c = b.wait(t, 4)
		if !c[3].full || c[3].ports != 5 {
			t.Errorf("sync after a failure: %+v, want full with 5 Services", c[3])
		}
		if err := hc.Err(); err != nil {
			t.Errorf("healthy proxy reports %v", err)
		}
	})
}

// TestRunHealthTurnsBadWithoutSuccessfulSync: the proxy's health turns
// bad the moment two SyncPeriods have passed without a successful sync,
// not at the next poll, and good again with the next success.
func TestRunHealthTurnsBadWithoutSuccessfulSync(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := cluster.NewStore()
		st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, svcObjs(0))
		st.MarkSynced()
		b := &fakeBackend{sig: make(chan struct{}, 1), fail: 1 << 30}
		hc := health.NewChecker()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go Run(ctx, Options{Store: st, Backend: b, SyncPeriod: 500 * time.Millisecond, MinSyncPeriod: 50 * time.Millisecond, Health: hc})
		b.wait(t, 1)
		if err := hc.Err(); err != nil {
			t.Fatalf("unhealthy right after start: %v", err)
		}
		after(900 * time.Millisecond)
		if err := hc.Err(); err != nil {
			t.Fatalf("unhealthy 0.9 s after start, within 2 sync periods: %v", err)
		}
		after(200 * time.Millisecond)
		if err := hc.Err(); err == nil || !strings.Contains(err.Error(), "boom") {
			t.Fatalf("health 1.1 s after start without a successful sync: %v, want bad, naming the failure", err)
		}
		b.mu.Lock()
		b.fail = 0
		b.mu.Unlock()
		after(100 * time.Millisecond) // the next retry, MinSyncPeriod on
		if err := hc.Err(); err != nil {
			t.Errorf("still unhealthy after a successful sync: %v", err)
		}
	})
}

// TestRunUnhealthyWhileStateNeverSyncs: a cluster state that never comes
// makes the proxy unhealthy after two SyncPeriods, saying so, and nothing
// is synced meanwhile.
func TestRunUnhealthyWhileStateNeverSyncs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := cluster.NewStore() // never marked synced
		hc := health.NewChecker()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		b := &fakeBackend{sig: make(chan struct{}, 1)}
		go Run(ctx, Options{Store: st, Backend: b, SyncPeriod: 500 * time.Millisecond, Health: hc})
		after(900 * time.Millisecond)
		if err := hc.Err(); err != nil {
			t.Fatalf("unhealthy within 2 sync periods: %v", err)
		}
		after(200 * time.Millisecond)
		if err := hc.Err(); err == nil || !strings.Contains(err.Error(), "cluster state not synced yet") {
			t.Fatalf("health after 2 sync periods without cluster state: %v, want bad, saying why", err)
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.calls) != 0 {
			t.Errorf("synced %d times before the state was complete", len(b.calls))
		}
	})
}

func TestRunProgressUnhealthyOnlyWhileChangesWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := cluster.NewStore()
		st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, svcObjs(0))
		st.MarkSynced()
		b := &fakeBackend{sig: make(chan struct{}, 1)}
		p := health.NewProgress(300*time.Millisecond, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		go Run(ctx, Options{Store: st, Backend: b, SyncPeriod: time.Hour, MinSyncPeriod: 20 * time.Millisecond, Progress: p})
		b.wait(t, 1)
		after(500 * time.Millisecond)
		if s := p.State(); !s.Healthy {
			t.Fatalf("idle after a successful sync: %+v, want healthy", s)
		}
		// A change that cannot be programmed makes it unhealthy in time.
		b.mu.Lock()
		b.fail = 1 << 30
		b.mu.Unlock()
		for _, o := range svcObjs(1) {
			st.Upsert(o)
		}
		waitFor(t, func() bool { return !p.State().Healthy }, "unhealthy while a change waits")
		b.mu.Lock()
		b.fail = 0
		b.mu.Unlock()
		waitFor(t, func() bool { return p.State().Healthy }, "healthy once the change is programmed")
	})
}

// after lets d pass on the bubble's clock and Run do whatever it does by
// then: the tests run in a synctest bubble, whose time moves only when
// every goroutine of the test waits, so "no sync in 300 ms" holds at any
// load of the machine.
func after(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5 s for: %s", what)
		}
	}
}
