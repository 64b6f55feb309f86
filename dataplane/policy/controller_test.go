package policy

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/podnet/podnet/dataplane/cluster"
)

type fakeApplier struct {
	applied chan *Program
	counts  map[cluster.Key]Counts
}

func (f *fakeApplier) Apply(p *Program) error { f.applied <- p; return nil }
func (f *fakeApplier) Counters() (map[cluster.Key]Counts, error) {
	return f.counts, nil
}

// TestControllerFollowsTheStore: nothing is programmed before the Store is
// synced; then each change of a Pod, Namespace or NetworkPolicy brings a
// program compiled from the Store for this node's pods.
func TestControllerFollowsTheStore(t *testing.T) {
	pods, nss := fixture()
	store := cluster.NewStore()
	for _, p := range pods {
		store.Upsert(p)
	}
	for _, n := range nss {
		store.Upsert(n)
	}
	f := &fakeApplier{applied: make(chan *Program, 10)}
	c := NewController(ControllerOptions{NodeName: "node1", Store: store, Table: f})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	select {
	case p := <-f.applied:
		t.Fatalf("programmed %+v before the Store was synced", p)
	default:
	}
	store.MarkSynced()
	if p := next(t, f); len(p.Policies) != 0 {
		t.Fatalf("first program %+v, want no policies", p)
	}
	for _, np := range mustPolicies(t, `
metadata: {namespace: a, name: web-in}
spec: {podSelector: {matchLabels: {app: web}}, ingress: [{from: [{podSelector: {matchLabels: {app: db}}}]}]}`) {
		store.Upsert(np)
	}
	p := next(t, f)
	if len(p.Policies) != 1 || len(p.Policies[0].Dir[Ingress].Selected) != 2 || len(p.Policies[0].Dir[Ingress].Rules[0].Pods) != 2 {
		t.Fatalf("program %+v, want web-in selecting web's two addresses with db's two as peers", p.Policies)
	}
	db := *pods[1]
	db.Labels = map[string]string{"app": "other"}
	store.Upsert(&db)
	if p := next(t, f); len(p.Policies[0].Dir[Ingress].Rules[0].Pods) != 0 {
		t.Errorf("after db's relabel the peers are %v, want none", p.Policies[0].Dir[Ingress].Rules[0].Pods)
	}
	// The sync records its success after Apply returns.
	for deadline := time.Now().Add(10 * time.Second); c.Synced() < 3 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	st := c.Status()
	if st.Syncs != 3 || len(st.Pods) != 1 || st.Pods[0].Pod != "a/web" || st.Pods[0].Ingress[0].Policy != "a/web-in" {
		t.Errorf("status %+v, want 3 syncs and a/web selected by a/web-in", st)
	}

	f.counts = map[cluster.Key]Counts{{Namespace: "a", Name: "web-in"}: {Allowed: 3, Dropped: 5}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	got, err := testutil.GatherAndCount(reg, "podnet_network_policy_connections_total")
	if err != nil || got != 2 {
		t.Errorf("gathered %d series, %v; want allowed and dropped", got, err)
	}
}

func next(t *testing.T, f *fakeApplier) *Program {
	t.Helper()
	select {
	case p := <-f.applied:
		slices.SortFunc(p.Policies, func(a, b *PolicyProgram) int { return compareKeys(a.Key, b.Key) })
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("no program applied within 10 s")
		return nil
	}
}

func compareKeys(a, b cluster.Key) int {
	if a.String() < b.String() {
		return -1
	}
	if a.String() > b.String() {
		return 1
	}
	return 0
}

// TestControllerBatchEqualsFullCompile: the benchmark's world written into
// a synced Store at once, policies before pods (far more changes than a
// sync takes in one by one), ends in the program a whole compile of the
// Store gives, and the status shows node1's 100 pods selected.
func TestControllerBatchEqualsFullCompile(t *testing.T) {
	pods, nss, pols := benchWorld(t)
	store := cluster.NewStore()
	store.MarkSynced()
	f := &fakeApplier{applied: make(chan *Program, 1000)}
	// As proxyd's --min-sync-period folds a burst of changes.
	c := NewController(ControllerOptions{NodeName: "node1", Store: store, Table: f, MinInterval: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if p := next(t, f); len(p.Policies) != 0 {
		t.Fatalf("first program %+v, want no policies", p)
	}
	for _, n := range nss {
		store.Upsert(n)
	}
	for _, np := range pols {
		store.Upsert(np)
	}
	for _, p := range pods {
		store.Upsert(p)
	}
	want := dump(NewModel(store.Pods(), store.Namespaces(), store.NetworkPolicies()).Compile(onNode("node1")))
	var got string
	for deadline := time.Now().Add(time.Minute); got != want; {
		select {
		case p := <-f.applied:
			got = dump(p)
		case <-time.After(time.Until(deadline)):
			t.Fatalf("no program equal to a whole compile within a minute; the last:\n%s", got)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); len(c.Status().Pods) != 100 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if n := len(c.Status().Pods); n != 100 {
		t.Errorf("status shows %d pods of node1 selected, want 100", n)
	}
}

// TestControllerErrDoesNotWaitForACompile: /healthz asks Err, and a sync
// holds the controller's lock while it compiles (seconds at scale; in a
// lab at load ~40, long enough that proxyd's /healthz stopped answering).
// With that lock held, Err and Synced still answer.
func TestControllerErrDoesNotWaitForACompile(t *testing.T) {
	c := NewController(ControllerOptions{NodeName: "node1", Store: cluster.NewStore(), Table: &fakeApplier{}})
	c.mu.Lock()
	defer c.mu.Unlock()
	done := make(chan struct{})
	go func() {
		c.Err()
		c.Synced()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Err and Synced wait for the lock a compile holds")
	}
}

// failingApplier fails while fail is set, and counts its calls.
type failingApplier struct {
	fakeApplier
	fail  bool
	calls int
}

func (f *failingApplier) Apply(p *Program) error {
	f.calls++
	if f.fail {
		return errors.New("injected")
	}
	return nil
}

// TestControllerIdleSyncsWriteNothing: a sync that finds no change since a
// successful one (the periodic ones) counts as a sync but compiles and
// applies nothing; a change is applied; after a failed Apply the next sync
// applies again even with no change.
func TestControllerIdleSyncsWriteNothing(t *testing.T) {
	pods, nss := fixture()
	store := cluster.NewStore()
	for _, o := range []cluster.Object{pods[0], pods[1], nss[0]} {
		store.Upsert(o)
	}
	for _, np := range mustPolicies(t, `
metadata: {namespace: a, name: web-in}
spec: {podSelector: {matchLabels: {app: web}}, ingress: [{from: [{podSelector: {matchLabels: {app: db}}}]}]}`) {
		store.Upsert(np)
	}
	f := &failingApplier{}
	c := NewController(ControllerOptions{NodeName: "node1", Store: store, Table: f})
	step := func(name string, wantErr bool, wantCalls int, wantSyncs uint64) {
		t.Helper()
		if err := c.sync(); (err != nil) != wantErr {
			t.Errorf("%s: sync error %v, want an error: %v", name, err, wantErr)
		}
		if f.calls != wantCalls || c.Synced() != wantSyncs {
			t.Errorf("%s: %d applies and %d syncs, want %d and %d", name, f.calls, c.Synced(), wantCalls, wantSyncs)
		}
	}
	step("first sync", false, 1, 1)
	step("idle sync", false, 1, 2)
	step("another idle sync", false, 1, 3)
	db := *pods[1]
	db.Labels = map[string]string{"app": "other"}
	store.Upsert(&db)
	f.fail = true
	step("a change, Apply failing", true, 2, 3)
	step("no change after the failure", true, 3, 3)
	f.fail = false
	step("no change, Apply working again", false, 4, 4)
	step("idle again", false, 4, 5)
}
