// Package kube is the Kubernetes API source of cluster state: one client-go
// reflector per kind, whose objects are reduced to the compact cluster
// structs as they arrive and written straight into a cluster.Store. No
// informer cache sits between: the Store is the only copy, and each kind
// keeps just the keys it holds, to find what a relist no longer has.
//
// Reflectors rather than shared informers because only a reflector takes a
// backoff (ReflectorOptions.Backoff; the informer factory has no way to
// pass one): client-go's own retry, capped low so the daemons pick up
// changes promptly once an API server outage ends (PromptBackoff).
//
// When the API server goes away the reflectors retry and the Store is
// never cleared, so proxyd keeps its rules and dnsd keeps answering.
// Staleness is reported through Err: every list and watch call's outcome
// is recorded.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
	"github.com/podnet/podnet/dataplane/runner"
)

// DefaultKinds are the kinds both daemons need; Pods only when asked for.
var DefaultKinds = []cluster.Kind{cluster.KindNode, cluster.KindService, cluster.KindEndpointSlice, cluster.KindNamespace}

// Options configures a Source.
type Options struct {
	// Config is the API server to read; Run builds the client from it.
	// Alternatively Client (tests with a fake clientset).
	Config *rest.Config
	Client kubernetes.Interface
	Store  *cluster.Store
	Logger *slog.Logger
	// Kinds to watch; DefaultKinds when empty.
	Kinds []cluster.Kind
	// Backoff of the reflectors' retries; nil: PromptBackoff.
	Backoff *wait.Backoff
	// Clock times the probes of the API server while the state is stale;
	// nil: the system's. Tests drive a runner.FakeClock.
	Clock runner.Clock
}

// Source feeds a Store from the API server.
type Source struct {
	o Options
	// probe asks the API server whether it is back, while the state is
	// stale (stale triggers it).
	probe *runner.Runner

	mu       sync.Mutex
	watchErr error
	errSince time.Time
}

// ClientConfig returns the REST config of kubeconfig, or the in-cluster
// config when kubeconfig is empty.
func ClientConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (use --kubeconfig outside a pod): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}

// New returns a Source; nothing runs until Run.
func New(o Options) *Source {
	if len(o.Kinds) == 0 {
		o.Kinds = DefaultKinds
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Source{o: o}
	// A probe every probeInterval from the first failure on, until one
	// gets through or a list or watch does.
	s.probe = runner.New(s.probeOnce, runner.Options{Delay: probeInterval, RetryInterval: probeInterval, Clock: o.Clock})
	return s
}

// probeInterval is how often the API server is probed while the state is
// stale.
const probeInterval = 2 * time.Second

// probeOnce asks the API server for its version while the state is stale;
// an answer ends the stale period. The error makes the runner try again.
func (s *Source) probeOnce() error {
	if s.Err() == nil || s.o.Client == nil {
		return nil
	}
	if _, err := s.o.Client.Discovery().ServerVersion(); err != nil {
		return err
	}
	s.seen()
	return nil
}

// Err reports why the state may be stale: the last watch error, for as long
// as no list or watch has succeeded since. nil when the watches are healthy.
func (s *Source) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watchErr == nil {
		return nil
	}
	return fmt.Errorf("cluster state stale since %s: %w", s.errSince.Format(time.RFC3339), s.watchErr)
}

// Run starts one reflector per kind, marks the Store synced once every kind
// has listed, and keeps it current until ctx ends.
func (s *Source) Run(ctx context.Context) error {
	if s.o.Client == nil && s.o.Config != nil {
		client, err := kubernetes.NewForConfig(s.o.Config)
		if err != nil {
			return fmt.Errorf("kube source: %w", err)
		}
		s.o.Client = client
	}
	if s.o.Client == nil || s.o.Store == nil {
		return errors.New("kube source: Config or Client, and Store are required")
	}
	backoff := PromptBackoff
	if s.o.Backoff != nil {
		backoff = *s.o.Backoff
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var synced []<-chan struct{}
	for _, kind := range s.o.Kinds {
		lw, example, err := s.listWatch(kind)
		if err != nil {
			return err
		}
		ks := &kindStore{s: s, kind: kind, keys: map[cluster.Key]struct{}{}, synced: make(chan struct{})}
		r := cache.NewReflectorWithOptions(lw, example, ks, cache.ReflectorOptions{
			Name:            "podnet " + kind.String(),
			TypeDescription: kind.String(),
			Backoff:         &backoff,
		})
		wg.Go(func() { r.RunWithContext(ctx) })
		synced = append(synced, ks.synced)
	}
	for _, ch := range synced {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil
		}
	}
	s.o.Logger.Info("cluster state synced from the API server", "kinds", fmt.Sprint(s.o.Kinds))
	s.o.Store.MarkSynced()
	// A watch error is cleared by the next event, but a quiet cluster may send
	// none after the API server returns: probe it while stale.
	s.probe.Run(ctx)
	return nil
}

// PromptBackoff is how the reflectors retry a refused watch or a failed
// list: client-go's backoff with a low cap. client-go's default (800 ms
// doubling to 30 s, plus up to as much again as jitter, reset after two
// quiet minutes) would leave a change made just after a one-minute API
// server outage unseen for up to a minute; capped at 800 ms, a change is
// picked up within 1.2 s, and the jitter still spreads a cluster's nodes
// over the retry interval.
var PromptBackoff = wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.5, Cap: 800 * time.Millisecond, Steps: 4}

// listWatch returns the list and watch calls of kind, recording each
// outcome (a failure marks the state stale, a success ends that), and an
// example object of the kind.
func (s *Source) listWatch(kind cluster.Kind) (cache.ListerWatcher, runtime.Object, error) {
	var (
		list    func(context.Context, metav1.ListOptions) (runtime.Object, error)
		watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)
		example runtime.Object
	)
	c := s.o.Client
	switch kind {
	case cluster.KindNode:
		list, watchFn, example = listOf(c.CoreV1().Nodes().List), c.CoreV1().Nodes().Watch, &corev1.Node{}
	case cluster.KindService:
		list, watchFn, example = listOf(c.CoreV1().Services("").List), c.CoreV1().Services("").Watch, &corev1.Service{}
	case cluster.KindEndpointSlice:
		list, watchFn, example = listOf(c.DiscoveryV1().EndpointSlices("").List), c.DiscoveryV1().EndpointSlices("").Watch, &discoveryv1.EndpointSlice{}
	case cluster.KindNamespace:
		list, watchFn, example = listOf(c.CoreV1().Namespaces().List), c.CoreV1().Namespaces().Watch, &corev1.Namespace{}
	case cluster.KindPod:
		list, watchFn, example = listOf(c.CoreV1().Pods("").List), c.CoreV1().Pods("").Watch, &corev1.Pod{}
	case cluster.KindNetworkPolicy:
		np := c.NetworkingV1().NetworkPolicies("")
		list, watchFn, example = listOf(np.List), np.Watch, &networkingv1.NetworkPolicy{}
	default:
		return nil, nil, fmt.Errorf("kube source: unknown kind %v", kind)
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			obj, err := list(ctx, o)
			s.outcome("list", kind, err)
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := watchFn(ctx, o)
			s.outcome("watch", kind, err)
			return w, err
		},
	}
	return cache.ToListWatcherWithWatchListSemantics(lw, c), example, nil
}

// listOf makes a typed List call a ListWatch's.
func listOf[L runtime.Object](list func(context.Context, metav1.ListOptions) (L, error)) func(context.Context, metav1.ListOptions) (runtime.Object, error) {
	return func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return list(ctx, o) }
}

// outcome records how a list or watch call went.
func (s *Source) outcome(verb string, kind cluster.Kind, err error) {
	switch {
	case err == nil:
		s.seen()
	case errors.Is(err, context.Canceled):
	default:
		s.stale(fmt.Errorf("%s %s: %w", verb, kind, err))
	}
}

// reduced is an API object as the reflectors keep it: the compact struct,
// plus just enough metadata for their key functions and resource versions.
// obj is nil when the object could not be reduced (a malformed
// address, say): the Store then drops the key rather than keep a version that
// no longer exists.
type reduced struct {
	metav1.ObjectMeta
	obj cluster.Object
}

// transform reduces an API object to its compact struct as soon as it
// arrives, so no store ever holds the full object.
func (s *Source) transform(kind cluster.Kind) cache.TransformFunc {
	return func(obj any) (any, error) {
		var (
			out cluster.Object
			err error
		)
		switch o := obj.(type) {
		case *corev1.Node:
			out, err = convert.FromV1Node(o)
		case *corev1.Service:
			out, err = convert.FromV1Service(o)
		case *discoveryv1.EndpointSlice:
			out, err = convert.FromV1EndpointSlice(o)
		case *corev1.Namespace:
			out, err = convert.FromV1Namespace(o)
		case *corev1.Pod:
			out, err = convert.FromV1Pod(o)
		case *networkingv1.NetworkPolicy:
			out, err = convert.FromV1NetworkPolicy(o)
		default:
			// Tombstones and already-reduced objects pass through.
			return obj, nil
		}
		m, merr := meta.Accessor(obj)
		if merr != nil {
			return nil, fmt.Errorf("reduce %s: %w", kind, merr)
		}
		r := &reduced{ObjectMeta: metav1.ObjectMeta{
			Namespace:       m.GetNamespace(),
			Name:            m.GetName(),
			ResourceVersion: m.GetResourceVersion(),
		}}
		if err != nil {
			s.o.Logger.Warn("ignoring invalid object", "kind", kind.String(), "object", r.key().String(), "err", err)
			return r, nil
		}
		r.obj = out
		return r, nil
	}
}

func (r *reduced) key() cluster.Key { return cluster.Key{Namespace: r.Namespace, Name: r.Name} }

// kindStore is where one kind's reflector puts what it lists and watches:
// each object reduced and written into the cluster.Store at once. It keeps
// only the keys it holds, to find what a relist no longer has.
type kindStore struct {
	s    *Source
	kind cluster.Kind

	mu     sync.Mutex
	keys   map[cluster.Key]struct{}
	synced chan struct{} // closed by the first Replace
}

var _ cache.TransformingStore = (*kindStore)(nil)

// Transformer lets the reflector reduce objects in the stores it keeps
// itself (a streamed initial list), not only in this one.
func (k *kindStore) Transformer() cache.TransformFunc { return k.s.transform(k.kind) }

func (k *kindStore) Add(obj any) error    { return k.write(obj, false) }
func (k *kindStore) Update(obj any) error { return k.write(obj, false) }

func (k *kindStore) Delete(obj any) error {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	return k.write(obj, true)
}

// write reduces obj and puts it into the Store, or drops its key when
// deleted.
func (k *kindStore) write(obj any, deleted bool) error {
	r, err := k.reduce(obj)
	if err != nil {
		return err
	}
	k.s.seen()
	k.mu.Lock()
	defer k.mu.Unlock()
	if deleted {
		k.drop(r.key())
	} else {
		k.apply(r)
	}
	return nil
}

// apply writes r into the Store: an object that could not be reduced
// drops its key rather than keep a version that no longer exists.
func (k *kindStore) apply(r *reduced) {
	if r.obj == nil {
		k.drop(r.key())
		return
	}
	k.keys[r.key()] = struct{}{}
	k.s.o.Store.Upsert(r.obj)
}

// drop removes key from the Store.
func (k *kindStore) drop(key cluster.Key) {
	delete(k.keys, key)
	k.s.o.Store.Delete(k.kind, key)
}

// Replace takes a full list: everything in it is written, and what the
// Store holds of this kind that the list lacks is deleted.
func (k *kindStore) Replace(list []any, _ string) error {
	rs := make([]*reduced, 0, len(list))
	for _, obj := range list {
		r, err := k.reduce(obj)
		if err != nil {
			return err
		}
		rs = append(rs, r)
	}
	k.s.seen()
	k.mu.Lock()
	defer k.mu.Unlock()
	gone := k.keys
	k.keys = make(map[cluster.Key]struct{}, len(rs))
	for _, r := range rs {
		delete(gone, r.key())
		k.apply(r)
	}
	for key := range gone {
		k.s.o.Store.Delete(k.kind, key)
	}
	select {
	case <-k.synced:
	default:
		close(k.synced)
	}
	return nil
}

// Resync writes nothing: the Store already holds every object.
func (k *kindStore) Resync() error { return nil }

func (k *kindStore) reduce(obj any) (*reduced, error) {
	out, err := k.s.transform(k.kind)(obj)
	if err != nil {
		return nil, err
	}
	r, ok := out.(*reduced)
	if !ok {
		return nil, fmt.Errorf("kube source: %s: unexpected %T", k.kind, out)
	}
	return r, nil
}

// stale records why the state may be out of date; the first error of a
// stale period is logged.
func (s *Source) stale(err error) {
	s.mu.Lock()
	first := s.watchErr == nil
	if first {
		s.errSince = time.Now()
	}
	s.watchErr = err
	s.mu.Unlock()
	if first {
		s.o.Logger.Warn("API server unreachable; serving the last known state", "err", err)
		s.probe.Trigger()
	}
}

// seen records that the API server delivered something, which ends a stale
// period.
func (s *Source) seen() {
	s.mu.Lock()
	was := s.watchErr
	s.watchErr = nil
	s.mu.Unlock()
	if was != nil {
		s.o.Logger.Info("API server reachable again")
	}
}
