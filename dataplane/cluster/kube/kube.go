// Package kube is the Kubernetes API source of cluster state: client-go
// shared informers whose objects are reduced to the compact cluster structs
// as they arrive (an informer transform), so the informer caches hold only
// what podnet uses, and every change is written into a cluster.Store.
//
// When the API server goes away the informers keep their last state and
// retry with backoff; the Store is never cleared, so proxyd keeps its rules
// and dnsd keeps answering. Staleness is reported through Err.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
)

// DefaultKinds are the kinds both daemons need; Pods only when asked for.
var DefaultKinds = []cluster.Kind{cluster.KindNode, cluster.KindService, cluster.KindEndpointSlice, cluster.KindNamespace}

// Options configures a Source.
type Options struct {
	// Config is the API server to read; Run builds the client from it,
	// watching every request it makes: a failed one marks the state stale
	// at once, the next answer clears that. Alternatively Client (tests
	// with a fake clientset), whose staleness is seen only through watch
	// errors.
	Config *rest.Config
	Client kubernetes.Interface
	Store  *cluster.Store
	Logger *slog.Logger
	// Kinds to watch; DefaultKinds when empty.
	Kinds []cluster.Kind
	// Resync replays the informer caches into the handlers; 0 disables it.
	Resync time.Duration
}

// Source feeds a Store from the API server.
type Source struct {
	o Options

	mu        sync.Mutex
	watchErr  error
	errSince  time.Time
	lastEvent time.Time
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
	return &Source{o: o}
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

// Run starts the informers, marks the Store synced once every cache has
// listed, and keeps it current until ctx ends.
func (s *Source) Run(ctx context.Context) error {
	if s.o.Client == nil && s.o.Config != nil {
		cfg := rest.CopyConfig(s.o.Config)
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return observer{rt: rt, s: s} })
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("kube source: %w", err)
		}
		s.o.Client = client
	}
	if s.o.Client == nil || s.o.Store == nil {
		return errors.New("kube source: Config or Client, and Store are required")
	}
	factory := informers.NewSharedInformerFactory(s.o.Client, s.o.Resync)
	var synced []cache.InformerSynced
	for _, kind := range s.o.Kinds {
		inf, err := s.informer(factory, kind)
		if err != nil {
			return err
		}
		if err := inf.SetTransform(s.transform(kind)); err != nil {
			return fmt.Errorf("set %s transform: %w", kind, err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(s.watchError(kind)); err != nil {
			return fmt.Errorf("set %s watch error handler: %w", kind, err)
		}
		reg, err := inf.AddEventHandler(s.handler(kind))
		if err != nil {
			return fmt.Errorf("add %s handler: %w", kind, err)
		}
		// The registration, not the informer: synced once our handler has
		// seen the initial list, not merely once the cache holds it.
		synced = append(synced, reg.HasSynced)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return ctx.Err()
	}
	s.o.Logger.Info("cluster state synced from the API server", "kinds", fmt.Sprint(s.o.Kinds))
	s.o.Store.MarkSynced()
	// A watch error is cleared by the next event, but a quiet cluster may send
	// none after the API server returns: probe it while stale.
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if s.Err() == nil {
				continue
			}
			if _, err := s.o.Client.Discovery().ServerVersion(); err == nil {
				s.seen()
			}
		}
	}
}

func (s *Source) informer(f informers.SharedInformerFactory, kind cluster.Kind) (cache.SharedIndexInformer, error) {
	switch kind {
	case cluster.KindNode:
		return f.Core().V1().Nodes().Informer(), nil
	case cluster.KindService:
		return f.Core().V1().Services().Informer(), nil
	case cluster.KindEndpointSlice:
		return f.Discovery().V1().EndpointSlices().Informer(), nil
	case cluster.KindNamespace:
		return f.Core().V1().Namespaces().Informer(), nil
	case cluster.KindPod:
		return f.Core().V1().Pods().Informer(), nil
	}
	return nil, fmt.Errorf("kube source: unknown kind %v", kind)
}

// reduced is what the informer caches hold in place of an API object: the
// compact struct, plus just enough metadata for the informer's key and index
// functions. obj is nil when the object could not be reduced (a malformed
// address, say): the Store then drops the key rather than keep a version that
// no longer exists.
type reduced struct {
	metav1.ObjectMeta
	obj cluster.Object
}

// transform reduces an API object to its compact struct before the informer
// stores it, so the cache never holds the full object.
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

func (s *Source) handler(kind cluster.Kind) cache.ResourceEventHandler {
	apply := func(obj any) {
		s.seen()
		r, ok := obj.(*reduced)
		switch {
		case !ok:
		case r.obj == nil:
			s.o.Store.Delete(kind, r.key())
		default:
			s.o.Store.Upsert(r.obj)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { apply(obj) },
		UpdateFunc: func(_, obj any) { apply(obj) },
		DeleteFunc: func(obj any) {
			s.seen()
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if r, ok := obj.(*reduced); ok {
				s.o.Store.Delete(kind, r.key())
			}
		},
	}
}

func (s *Source) watchError(kind cluster.Kind) cache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, r *cache.Reflector, err error) {
		s.stale(fmt.Errorf("watch %s: %w", kind, err))
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}
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
	}
}

// observer sees every request the Source's client makes. The informers
// retry a refused watch on their own, without telling the watch error
// handler, so this is where an outage shows first.
//
// A watch that cannot reach the API server is retried here, every
// watchRetry, instead of failing: the informers would back off
// exponentially (up to 30 s, doubled by jitter), and changes made right
// after the API server returns would wait that long. A watch is a GET
// without a body, safe to send again.
type observer struct {
	rt http.RoundTripper
	s  *Source
}

// watchRetry is how often a watch is re-sent while the API server is away.
const watchRetry = 500 * time.Millisecond

func (o observer) RoundTrip(req *http.Request) (*http.Response, error) {
	for {
		resp, err := o.rt.RoundTrip(req)
		switch {
		case err != nil:
			if req.Context().Err() != nil {
				return nil, err
			}
			o.s.stale(fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err))
			if req.URL.Query().Get("watch") != "true" || req.Body != nil {
				return nil, err
			}
			select {
			case <-time.After(watchRetry):
				continue
			case <-req.Context().Done():
				return nil, err
			}
		case resp.StatusCode >= 500:
			o.s.stale(fmt.Errorf("%s %s: %s", req.Method, req.URL.Path, resp.Status))
		default:
			o.s.seen()
		}
		return resp, err
	}
}

// seen records that the API server delivered something, which ends a stale
// period.
func (s *Source) seen() {
	s.mu.Lock()
	was := s.watchErr
	s.lastEvent = time.Now()
	s.watchErr = nil
	s.mu.Unlock()
	if was != nil {
		s.o.Logger.Info("API server reachable again")
	}
}
