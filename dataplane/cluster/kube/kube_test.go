package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/runner"
)

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	// Generous: the conditions come true in milliseconds, but CI shares two
	// cores with the e2e lab, and a failed run only waits this long once.
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func startSource(t *testing.T, objs ...any) (*fake.Clientset, *cluster.Store) {
	t.Helper()
	var rt []any
	rt = append(rt, objs...)
	client := fake.NewClientset()
	for _, o := range rt {
		var err error
		switch o := o.(type) {
		case *corev1.Service:
			_, err = client.CoreV1().Services(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{})
		case *corev1.Node:
			_, err = client.CoreV1().Nodes().Create(context.Background(), o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	store := cluster.NewStore()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- New(Options{Client: client, Store: store, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}).Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-store.Synced():
	case <-time.After(5 * time.Second):
		t.Fatal("store never synced")
	}
	return client, store
}

func TestSourceFeedsStore(t *testing.T) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{cluster.LabelZone: "z1"}},
		Spec:       corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "192.168.10.11"},
		}},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{
			ClusterIP: "10.96.0.20", ClusterIPs: []string{"10.96.0.20"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	client, store := startSource(t, node, svc)

	// Listed before Run: present as soon as the store is synced.
	n := store.Node("n1")
	if n == nil {
		t.Fatal("node n1 missing after sync")
	}
	if got, _ := n.PodCIDR(ipfamily.IPv4); got != netip.MustParsePrefix("10.244.1.0/24") || n.Zone != "z1" {
		t.Fatalf("node reduced wrongly: %+v", n)
	}
	s := store.Service(cluster.Key{Namespace: "default", Name: "web"})
	if s == nil || len(s.ClusterIPs) != 1 || s.ClusterIPs[0] != netip.MustParseAddr("10.96.0.20") {
		t.Fatalf("service reduced wrongly: %+v", s)
	}

	// Created, updated and deleted through the API afterwards.
	ctx := context.Background()
	ready := true
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-abc", Labels: map[string]string{cluster.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "endpoint slice in store", func() bool {
		return len(store.EndpointSlicesFor(cluster.Key{Namespace: "default", Name: "web"})) == 1
	})

	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP})
	if _, err := client.CoreV1().Services("default").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "service update", func() bool {
		s := store.Service(cluster.Key{Namespace: "default", Name: "web"})
		return s != nil && len(s.Ports) == 2 && s.Ports[1].Protocol == cluster.UDP
	})

	if err := client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "service delete", func() bool {
		return store.Service(cluster.Key{Namespace: "default", Name: "web"}) == nil
	})
}

func TestInvalidObjectIsDroppedNotFatal(t *testing.T) {
	good := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "good"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.96.0.30"},
	}
	client, store := startSource(t, good)
	ctx := context.Background()

	bad := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bad"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.96.0.31"},
	}
	if _, err := client.CoreV1().Services("default").Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "bad service first version", func() bool {
		return store.Service(cluster.Key{Namespace: "default", Name: "bad"}) != nil
	})
	// An update to an address that can't be parsed removes the object
	// rather than keeping a version that no longer exists.
	bad.Spec.ClusterIP = "not-an-ip"
	bad.Spec.ClusterIPs = []string{"not-an-ip"}
	if _, err := client.CoreV1().Services("default").Update(ctx, bad, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "bad service dropped", func() bool {
		return store.Service(cluster.Key{Namespace: "default", Name: "bad"}) == nil
	})
	if store.Service(cluster.Key{Namespace: "default", Name: "good"}) == nil {
		t.Fatal("a bad object took a good one with it")
	}
}

func TestWatchFailureKeepsStateAndReportsStaleness(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kept"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.96.0.40"},
	}
	client := fake.NewClientset(svc)
	var down atomic.Bool
	down.Store(true)
	client.PrependWatchReactor("*", func(k8stesting.Action) (bool, watch.Interface, error) {
		if down.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	store := cluster.NewStore()
	src := New(Options{Client: client, Store: store})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go src.Run(ctx)

	// Read the error once: a relist that gets through clears it again.
	var err error
	eventually(t, "staleness reported", func() bool { err = src.Err(); return err != nil })
	if !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("staleness error does not say why: %v", err)
	}
	if store.Service(cluster.Key{Namespace: "default", Name: "kept"}) == nil {
		t.Fatal("listed state was not kept while watches fail")
	}
	down.Store(false)
	eventually(t, "staleness cleared", func() bool { return src.Err() == nil })
}

// A refused watch is retried by client-go's reflector with the Source's
// backoff: growing from Duration to Cap, not at a fixed interval and not
// with client-go's default (800 ms doubling to 30 s), and the state is
// stale until a watch gets through.
func TestRefusedWatchRetriedWithBackoff(t *testing.T) {
	client := fake.NewClientset(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kept"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.96.0.41"},
	})
	const refusals = 7
	var (
		mu    sync.Mutex
		tries []time.Time
	)
	client.PrependWatchReactor("services", func(k8stesting.Action) (bool, watch.Interface, error) {
		mu.Lock()
		defer mu.Unlock()
		tries = append(tries, time.Now())
		if len(tries) <= refusals {
			return true, nil, fmt.Errorf("dial tcp 192.0.2.1:6443: %w", syscall.ECONNREFUSED)
		}
		return false, nil, nil
	})
	backoff := wait.Backoff{Duration: 20 * time.Millisecond, Factor: 2, Cap: 160 * time.Millisecond, Steps: 10}
	store := cluster.NewStore()
	src := New(Options{Client: client, Store: store, Kinds: []cluster.Kind{cluster.KindService}, Backoff: &backoff})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	eventually(t, "staleness reported", func() bool { return src.Err() != nil })
	eventually(t, "a watch through", func() bool { mu.Lock(); defer mu.Unlock(); return len(tries) > refusals })
	eventually(t, "staleness cleared", func() bool { return src.Err() == nil })
	if store.Service(cluster.Key{Namespace: "default", Name: "kept"}) == nil {
		t.Fatal("listed state lost while watches were refused")
	}
	mu.Lock()
	defer mu.Unlock()
	want := backoff.Duration
	for i := 1; i <= refusals; i++ {
		gap := tries[i].Sub(tries[i-1])
		// Late is possible on a loaded machine, never by a whole second;
		// early is not possible at all.
		if gap < want-5*time.Millisecond || gap > want+time.Second {
			t.Errorf("retry %d after %v, want %v (gaps %v)", i, gap, want, gaps(tries))
		}
		want = min(2*want, backoff.Cap)
	}
}

func gaps(ts []time.Time) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(ts); i++ {
		out = append(out, ts[i].Sub(ts[i-1]).Round(time.Millisecond))
	}
	return out
}

// PromptBackoff never waits longer than 1.2 s between retries, however
// long the outage: a change made as the API server returns is seen within
// that, where client-go's default could wait a minute.
func TestPromptBackoffBound(t *testing.T) {
	delay := PromptBackoff.DelayFunc()
	var longest time.Duration
	for range 200 {
		longest = max(longest, delay())
	}
	if longest > 1200*time.Millisecond || longest < PromptBackoff.Cap {
		t.Errorf("longest of 200 retries %v, want between the cap %v and 1.2 s", longest, PromptBackoff.Cap)
	}
}

// TestStaleStateProbedUntilTheAPIServerAnswers: in a quiet cluster no
// watch event clears a stale state once the API server is back, so the
// Source probes the server's version every probeInterval while stale, on
// its clock, and only then: nothing is armed while the state is current.
func TestStaleStateProbedUntilTheAPIServerAnswers(t *testing.T) {
	client := fake.NewClientset()
	var down atomic.Bool
	down.Store(true)
	probes := make(chan bool, 16)
	client.PrependReactor("get", "version", func(k8stesting.Action) (bool, runtime.Object, error) {
		wasDown := down.Load()
		probes <- wasDown
		if wasDown {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	// Every watch is the test's: a watch that gets through ends a stale
	// period too (as it should), so the staleness this test sets up must
	// come after the last watch was established.
	type watched struct {
		resource string
		w        *watch.FakeWatcher
	}
	watchers := make(chan watched, 16)
	client.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w := watch.NewFake()
		watchers <- watched{a.GetResource().Resource, w}
		return true, w, nil
	})
	clock := runner.NewFakeClock()
	store := cluster.NewStore()
	src := New(Options{Client: client, Store: store, Clock: clock})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-store.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("store never synced")
	}
	// Two bookmarks through each kind's watch: the second is read only
	// after the first was handled, long after the watch call's outcome was
	// recorded.
	bookmark := map[string]runtime.Object{"nodes": &corev1.Node{}, "services": &corev1.Service{},
		"endpointslices": &discoveryv1.EndpointSlice{}, "namespaces": &corev1.Namespace{}}
	for range bookmark {
		select {
		case w := <-watchers:
			for range 2 {
				w.w.Action(watch.Bookmark, bookmark[w.resource])
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a kind was never watched")
		}
	}
	if n := clock.Advance(10 * probeInterval); n != 0 {
		t.Fatalf("%d timers fired while the state was current, want none armed", n)
	}

	src.stale(errors.New("watch services: connection refused"))
	timeout := time.After(10 * time.Second)
	probe := func() bool {
		t.Helper()
		for len(clock.Pending()) == 0 {
			select {
			case <-clock.Asked():
			case <-timeout:
				t.Fatal("no probe armed while the state is stale")
			}
		}
		clock.Advance(probeInterval)
		select {
		case wasDown := <-probes:
			return wasDown
		case <-timeout:
			t.Fatal("no probe a probeInterval after it was armed")
		}
		return false
	}
	if !probe() {
		t.Fatal("first probe found the API server up")
	}
	if src.Err() == nil {
		t.Fatal("a failed probe cleared the stale state")
	}
	down.Store(false)
	if probe() {
		t.Fatal("second probe found the API server down")
	}
	eventually(t, "staleness cleared by the probe", func() bool { return src.Err() == nil })
	if n := clock.Advance(10 * probeInterval); n != 0 {
		t.Errorf("%d timers fired after the state was current again, want none armed", n)
	}
	if len(probes) != 0 {
		t.Errorf("%d probes after the state was current again", len(probes))
	}
}

// TestNotSyncedUntilEndpointSlicesListed: the store is marked synced (and
// so the Service proxy's first sync may run) only once every kind has
// listed: with the Services listed but the EndpointSlice list failing, then
// held back, the store stays unsynced; a first sync then would program the
// Service without endpoints and reject its connections. Once the list gets
// through, the store is synced with the slice in it.
func TestNotSyncedUntilEndpointSlicesListed(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.96.0.30", ClusterIPs: []string{"10.96.0.30"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-abcde", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.5"}, Conditions: discoveryv1.EndpointConditions{Ready: new(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
	}
	client := fake.NewClientset(svc, slice)
	release := make(chan struct{})
	var lists atomic.Int32
	client.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		if lists.Add(1) == 1 {
			return true, nil, fmt.Errorf("list endpointslices: %w", syscall.ECONNREFUSED)
		}
		<-release
		return false, nil, nil
	})
	servicesListed := make(chan struct{})
	var once sync.Once
	client.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		once.Do(func() { close(servicesListed) })
		return false, nil, nil
	})
	backoff := wait.Backoff{Duration: 10 * time.Millisecond, Factor: 1, Steps: 100}
	store := cluster.NewStore()
	src := New(Options{Client: client, Store: store, Kinds: []cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, Backoff: &backoff})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	<-servicesListed
	eventually(t, "the EndpointSlice list retried after its failure", func() bool { return lists.Load() >= 2 })
	eventually(t, "the Service in the store", func() bool { return store.Service(cluster.Key{Namespace: "default", Name: "web"}) != nil })
	select {
	case <-store.Synced():
		t.Fatal("store synced while the EndpointSlices were not listed yet")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	select {
	case <-store.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("store never synced once the EndpointSlices were listed")
	}
	if got := store.EndpointSlicesFor(cluster.Key{Namespace: "default", Name: "web"}); len(got) != 1 {
		t.Fatalf("slices of default/web at sync: %v", got)
	}
}
