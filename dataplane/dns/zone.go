// Package dns is podnet's cluster DNS: an authoritative answerer for the
// cluster zone and the reverse zones (Kubernetes DNS specification 1.1.0, with
// CoreDNS's kubernetes plugin as the reference for every corner the
// specification leaves open), a forwarder with a cache for everything else,
// and the UDP/TCP server in front of both.
//
// Speed comes from never touching cluster objects on the query path: the Zone
// keeps, per lowercased wire-format name, the answer records already encoded
// on the wire with the owner written as a compression pointer to the question.
// Answering is a map lookup and a few appends. Endpoint names and reverse
// records, most of a cluster's names, are kept compact instead and encoded
// when asked, with as few appends (endpoints.go). The index is an immutable
// snapshot behind an atomic pointer; Store events mark Services (and Pods)
// dirty, and a flush recomputes only those and publishes a new snapshot.
package dns

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/runner"
)

// PodMode is how `a-b-c-d.<ns>.pod.<zone>` names are answered.
type PodMode int

const (
	// PodsInsecure answers any well-formed pod name with the address it
	// spells, as kubeadm's CoreDNS configuration does.
	PodsInsecure PodMode = iota
	// PodsVerified answers only when a Pod with that address exists in that
	// namespace.
	PodsVerified
	// PodsDisabled answers NXDOMAIN for every pod name.
	PodsDisabled
)

// ParsePodMode reads the --pods flag value.
func ParsePodMode(s string) (PodMode, error) {
	switch s {
	case "insecure":
		return PodsInsecure, nil
	case "verified":
		return PodsVerified, nil
	case "disabled":
		return PodsDisabled, nil
	}
	return 0, fmt.Errorf("pods mode %q: want insecure, verified or disabled", s)
}

// ZoneOptions configures the cluster zone.
type ZoneOptions struct {
	// Domain is the cluster domain, "cluster.local" by default.
	Domain string
	// TTL of every cluster record and of the SOA minimum; 5 s by default.
	TTL  uint32
	Pods PodMode
	// ShortNames answers "<svc>.<ns>." and "<svc>.<ns>.svc." for Services
	// that exist.
	ShortNames bool
	// DNSService is the Service whose ClusterIPs answer ns.dns.<zone> (and
	// the apex NS glue); kube-system/kube-dns by default.
	DNSService cluster.Key
	// PodIndex keeps which namespace each pod address belongs to, for
	// autopath (Zone.ClientNamespace).
	PodIndex bool
}

func (o *ZoneOptions) setDefaults() {
	if o.Domain == "" {
		o.Domain = "cluster.local"
	}
	if o.TTL == 0 {
		o.TTL = 5
	}
	if o.DNSService == (cluster.Key{}) {
		o.DNSService = cluster.Key{Namespace: "kube-system", Name: "kube-dns"}
	}
}

// snapshot is one immutable version of the index.
type snapshot struct {
	zone       []byte // lowercase wire name
	zoneLabels int
	ttl        uint32
	serial     uint32
	synced     bool
	pods       PodMode
	names      map[string]*node
	eps        map[string]*svcEntry // by Service wire name: its endpoint names
	// ptr holds the reverse records of addresses with one owner, ptrMulti
	// (as rarely needed) those of addresses with more, in answer order.
	ptr        map[netip.Addr]ptrRef
	ptrMulti   map[netip.Addr][]ptrRef
	namespaces map[string]struct{}
	podIPs     map[string]map[netip.Addr]struct{} // verified mode: namespace → pod addresses
	// podNS is the pod index: a pod address → its namespace, "" when pods
	// of several namespaces hold it (host-network pods). nil without
	// ZoneOptions.PodIndex.
	podNS   map[netip.Addr]string
	nsAddrs []netip.Addr // ns.dns.<zone>
}

// Zone answers the cluster zone from an index kept in step with a Store.
type Zone struct {
	opts  ZoneOptions
	store *cluster.Store
	snap  atomic.Pointer[snapshot]

	mu      sync.Mutex // guards pending
	pending pending
	rebuild *runner.Runner // Flush, when asked by onEvent

	flushMu sync.Mutex // serialises flushes; guards b
	b       builder

	// metrics, when set, measures the DNS programming latency of
	// EndpointSlice changes made after start.
	metrics atomic.Pointer[Metrics]
	start   time.Time

	// loaded is closed by the first snapshot that is synced (Loaded).
	loaded     chan struct{}
	loadedOnce sync.Once
}

type pending struct {
	all        bool
	services   map[cluster.Key]struct{}
	pods       map[cluster.Key]struct{}
	namespaces bool
	// triggers are the trigger times of the EndpointSlice changes, by
	// Service.
	triggers []trigger
}

type trigger struct {
	service cluster.Key
	at      time.Time
}

// NewZone returns a Zone reading store. It subscribes to the store but starts
// nothing; Run keeps the index current (tests may call Flush instead).
func NewZone(store *cluster.Store, opts ZoneOptions) *Zone {
	opts.setDefaults()
	z := &Zone{opts: opts, store: store, start: time.Now(), loaded: make(chan struct{})}
	// A burst of changes (a Deployment rolling) is applied in one Flush
	// per rebuildInterval rather than one per change.
	z.rebuild = runner.New(func() error { z.Flush(); return nil }, runner.Options{MinInterval: rebuildInterval})
	z.pending.all = true
	z.snap.Store(z.emptySnapshot())
	store.Subscribe(z.onEvent)
	return z
}

// Synced reports whether the index holds a complete cluster state: the
// Store has synced and the index has caught up with it.
func (z *Zone) Synced() bool { return z.snap.Load().synced }

// Loaded is closed once Synced holds.
func (z *Zone) Loaded() <-chan struct{} { return z.loaded }

// Options returns the zone's options with defaults filled in.
func (z *Zone) Options() ZoneOptions { return z.opts }

func (z *Zone) emptySnapshot() *snapshot {
	zw := wireName(z.opts.Domain)
	return &snapshot{
		zone:       zw,
		zoneLabels: strings.Count(strings.Trim(z.opts.Domain, "."), ".") + 1,
		ttl:        z.opts.TTL,
		pods:       z.opts.Pods,
		names:      map[string]*node{},
		eps:        map[string]*svcEntry{},
		ptr:        map[netip.Addr]ptrRef{},
		ptrMulti:   map[netip.Addr][]ptrRef{},
		namespaces: map[string]struct{}{},
	}
}

func (z *Zone) onEvent(ev cluster.Event) {
	z.mu.Lock()
	p := &z.pending
	if p.services == nil {
		p.services = map[cluster.Key]struct{}{}
		p.pods = map[cluster.Key]struct{}{}
	}
	switch ev.Kind {
	case cluster.KindService:
		p.services[ev.Key] = struct{}{}
	case cluster.KindEndpointSlice:
		for _, o := range []cluster.Object{ev.Old, ev.New} {
			if s, ok := o.(*cluster.EndpointSlice); ok {
				p.services[s.ServiceKey()] = struct{}{}
			}
		}
		if s, ok := ev.New.(*cluster.EndpointSlice); ok && s.TriggerTime.After(z.start) {
			p.triggers = append(p.triggers, trigger{s.ServiceKey(), s.TriggerTime})
		}
	case cluster.KindNamespace:
		p.namespaces = true
	case cluster.KindPod:
		p.pods[ev.Key] = struct{}{}
		for _, o := range []cluster.Object{ev.Old, ev.New} {
			if pod, ok := o.(*cluster.Pod); ok && pod.Subdomain != "" {
				p.services[cluster.Key{Namespace: pod.Namespace, Name: pod.Subdomain}] = struct{}{}
			}
		}
	}
	z.mu.Unlock()
	z.rebuild.Trigger()
}

// rebuildInterval is the least time between two Flushes by Run.
const rebuildInterval = 5 * time.Millisecond

// Run applies store changes to the index until ctx ends, at most one Flush
// per rebuildInterval: changes arriving meanwhile are applied together.
// Nothing is built before the store has synced: every answer is SERVFAIL
// until then whatever the index holds, and flushing while the first state
// streams in only made garbage (a copy of the whole index every few
// milliseconds; at 10,000 Services × 10 endpoints, ~80 MB of heap left
// fragmented after the load).
func (z *Zone) Run(ctx context.Context) {
	select {
	case <-z.store.Synced():
	case <-ctx.Done():
		return
	}
	z.rebuild.Trigger()
	z.rebuild.Run(ctx)
}

// Flush applies every pending store change to the index now.
func (z *Zone) Flush() {
	z.flushMu.Lock()
	defer z.flushMu.Unlock()
	z.mu.Lock()
	p := z.pending
	z.pending = pending{}
	z.mu.Unlock()

	old := z.snap.Load()
	synced := false
	select {
	case <-z.store.Synced():
		synced = true
	default:
	}
	if !p.all && len(p.services) == 0 && len(p.pods) == 0 && !p.namespaces && synced == old.synced {
		return
	}
	s := *old
	s.synced = synced
	changed := z.b.apply(z, &s, p)
	if changed {
		s.serial = uint32(time.Now().Unix())
	}
	z.snap.Store(&s)
	if synced {
		z.loadedOnce.Do(func() { close(z.loaded) })
	}
	if m := z.metrics.Load(); m != nil {
		// As CoreDNS: only changes of a Service the index knows, of the
		// kinds whose slices the endpoint slice controller writes.
		now := time.Now()
		for _, t := range p.triggers {
			if svc := z.store.Service(t.service); svc != nil && svc.Type != cluster.ServiceTypeExternalName {
				m.programmed(svc.Headless, now.Sub(t.at))
			}
		}
	}
}

// builder holds what the index needs to undo a Service's or Pod's previous
// contribution. Only Flush touches it.
type builder struct {
	svcs       map[cluster.Key]*svcEntry
	nsRefs     map[string]int // namespace → Services and Pods in it
	nsObjects  map[string]bool
	podIPs     map[cluster.Key][]netip.Addr
	podHosts   map[cluster.Key][2]string    // hostname, subdomain
	ipPods     map[netip.Addr][]cluster.Key // the pod index: the Pods holding each address
	dnsService []netip.Addr
	scratch    recScratch
}

// apply recomputes the dirty parts of s (a copy of the previous snapshot
// whose maps are still shared) and reports whether any record changed.
// Pods go first: their hostnames feed the Services' endpoint names.
func (b *builder) apply(z *Zone, s *snapshot, p pending) bool {
	full := p.all || b.svcs == nil
	if full {
		b.reset(z, s, &p)
	} else {
		s.names = maps.Clone(s.names)
	}
	if !full && len(p.services) > 0 {
		s.eps = maps.Clone(s.eps)
		s.ptr = maps.Clone(s.ptr)
		s.ptrMulti = maps.Clone(s.ptrMulti)
	}
	if len(p.pods) > 0 && s.pods == PodsVerified {
		s.podIPs = maps.Clone(s.podIPs)
	}
	if len(p.pods) > 0 && s.podNS != nil {
		s.podNS = maps.Clone(s.podNS)
	}
	for key := range p.pods {
		b.removePod(s, key)
		if pod, _ := z.store.Get(cluster.KindPod, key).(*cluster.Pod); pod != nil {
			b.addPod(s, key, pod)
		}
	}
	if full {
		b.addAll(z, s)
	}
	for key := range p.services {
		b.removeService(z, s, key)
		if svc := z.store.Service(key); svc != nil {
			b.addService(z, s, key, svc, b.records(z, s, svc))
		}
	}
	if p.namespaces {
		b.nsObjects = map[string]bool{}
		for _, ns := range z.store.Namespaces() {
			b.nsObjects[strings.ToLower(ns.Name)] = true
		}
	}
	b.setNamespaces(s)
	if !slices.Equal(s.nsAddrs, b.dnsService) {
		s.nsAddrs = b.dnsService
		a, aaaa := addressSets(s.nsAddrs, s.ttl)
		s.names[string(joinWire(wireName("ns.dns"), s.zone))] = packNode(a, aaaa, rrset{}, rrset{}, "")
	}
	return full || len(p.pods) > 0 || len(p.services) > 0 || p.namespaces
}

// reset empties the builder and s for a rebuild of everything the store
// holds, and marks its Pods and Namespaces pending; addAll adds the
// Services.
func (b *builder) reset(z *Zone, s *snapshot, p *pending) {
	*b = builder{
		svcs: map[cluster.Key]*svcEntry{}, nsRefs: map[string]int{}, nsObjects: map[string]bool{},
		podIPs: map[cluster.Key][]netip.Addr{}, podHosts: map[cluster.Key][2]string{},
		ipPods: map[netip.Addr][]cluster.Key{},
	}
	s.namespaces = map[string]struct{}{}
	s.podIPs = map[string]map[netip.Addr]struct{}{}
	s.podNS = nil
	if z.opts.PodIndex {
		s.podNS = map[netip.Addr]string{}
	}
	p.services = nil
	p.pods = map[cluster.Key]struct{}{}
	for _, pod := range z.store.Pods() {
		p.pods[pod.Key()] = struct{}{}
	}
	p.namespaces = true
}

// addAll builds the index of every Service in one pass: their records
// first, then maps of the size they need, so that the index is made
// without the garbage of maps growing (at 10,000 Services × 10 endpoints
// that garbage was left as holes in the heap).
func (b *builder) addAll(z *Zone, s *snapshot) {
	svcs := z.store.Services()
	recs := make([]svcRecords, len(svcs))
	names, eps, ptrs := 0, 0, 0
	for i, svc := range svcs {
		recs[i] = b.records(z, s, svc)
		names += len(recs[i].names) + 2 // and the short names
		if e := recs[i].entry; len(e.eps) > 0 {
			eps++
			ptrs += len(e.eps)
		}
		ptrs += len(recs[i].entry.clusterIPs)
	}
	s.names = make(map[string]*node, names+2*len(b.nsRefs)+16)
	s.eps = make(map[string]*svcEntry, eps)
	s.ptr = make(map[netip.Addr]ptrRef, ptrs)
	s.ptrMulti = map[netip.Addr][]ptrRef{}
	z.addFixedNames(s)
	b.svcs = make(map[cluster.Key]*svcEntry, len(svcs))
	for i, svc := range svcs {
		b.addService(z, s, svc.Key(), svc, recs[i])
	}
}

func (b *builder) records(z *Zone, s *snapshot, svc *cluster.Service) svcRecords {
	return serviceRecords(svc, z.store.EndpointSlicesFor(svc.Key()), b.podHostname, s.zone, s.ttl, &b.scratch)
}

// The remove functions undo everything the add functions record: they are
// the one place that knows what a Pod's or Service's contribution was.

// removePod undoes what addPod recorded for key.
func (b *builder) removePod(s *snapshot, key cluster.Key) {
	if _, had := b.podHosts[key]; had {
		b.nsRefs[key.Namespace]--
	}
	if s.pods == PodsVerified || s.podNS != nil {
		b.setPodIPs(s, key, nil)
	}
	delete(b.podHosts, key)
}

// addPod records a Pod's hostname (for its Service's endpoint names), its
// namespace and, in verified mode, its addresses.
func (b *builder) addPod(s *snapshot, key cluster.Key, pod *cluster.Pod) {
	b.nsRefs[key.Namespace]++
	b.podHosts[key] = [2]string{strings.ToLower(pod.Hostname), strings.ToLower(pod.Subdomain)}
	if s.pods == PodsVerified || s.podNS != nil {
		b.setPodIPs(s, key, pod.IPs)
	}
}

// removeService deletes key's names and reverse-record claims.
func (b *builder) removeService(z *Zone, s *snapshot, key cluster.Key) {
	e := b.svcs[key]
	if e == nil {
		return
	}
	b.nsRefs[key.Namespace]--
	delete(b.svcs, key)
	for _, n := range e.names {
		delete(s.names, n)
	}
	if s.eps[e.name] == e {
		delete(s.eps, e.name)
	}
	for _, ep := range e.eps {
		s.releasePTR(ep.addr, e)
	}
	for _, a := range e.clusterIPs {
		s.releasePTR(a, e)
	}
	if key == z.opts.DNSService {
		b.dnsService = nil
	}
}

// addService puts svc's records into s and records them for
// removeService.
func (b *builder) addService(z *Zone, s *snapshot, key cluster.Key, svc *cluster.Service, recs svcRecords) {
	b.nsRefs[key.Namespace]++
	if key == z.opts.DNSService {
		b.dnsService = slices.Clone(svc.ClusterIPs)
	}
	e := recs.entry
	e.names = make([]string, 0, len(recs.names)+2)
	for _, nn := range recs.names {
		s.names[nn.name] = nn.node
		e.names = append(e.names, nn.name)
	}
	if z.opts.ShortNames && recs.base != nil {
		for _, short := range []string{
			string(wireName(svc.Name + "." + svc.Namespace)),
			string(wireName(svc.Name + "." + svc.Namespace + ".svc")),
		} {
			s.names[short] = recs.base
			e.names = append(e.names, short)
		}
	}
	b.svcs[key] = e
	if len(e.eps) > 0 {
		s.eps[e.name] = e
	}
	for i, ep := range e.eps {
		s.claimPTR(ep.addr, ptrRef{e: e, ep: int32(i)})
	}
	for _, a := range e.clusterIPs {
		s.claimPTR(a, ptrRef{e: e, ep: -1})
	}
}

// setNamespaces recomputes which namespaces exist and their svc and pod
// names. Namespace existence follows Namespace objects, and also Services
// and Pods in a namespace: a state directory need not list Namespaces.
func (b *builder) setNamespaces(s *snapshot) {
	nss := map[string]struct{}{}
	for ns := range b.nsObjects {
		nss[ns] = struct{}{}
	}
	for ns, n := range b.nsRefs {
		if n > 0 {
			nss[strings.ToLower(ns)] = struct{}{}
		} else {
			delete(b.nsRefs, ns)
		}
	}
	if maps.Equal(nss, s.namespaces) {
		return
	}
	for ns := range s.namespaces {
		delete(s.names, string(joinWire(wireName(ns+".svc"), s.zone)))
		delete(s.names, string(joinWire(wireName(ns+".pod"), s.zone)))
	}
	for ns := range nss {
		s.names[string(joinWire(wireName(ns+".svc"), s.zone))] = &node{}
		s.names[string(joinWire(wireName(ns+".pod"), s.zone))] = &node{}
	}
	s.namespaces = nss
}

func (b *builder) podHostname(ns, pod, svc string) string {
	h := b.podHosts[cluster.Key{Namespace: ns, Name: pod}]
	if h[0] != "" && h[1] == strings.ToLower(svc) {
		return h[0]
	}
	return ""
}

// setPodIPs records key's addresses (none: it is gone) in the verified
// mode's per-namespace sets and in the pod index.
func (b *builder) setPodIPs(s *snapshot, key cluster.Key, ips []netip.Addr) {
	ns := strings.ToLower(key.Namespace)
	verified := s.pods == PodsVerified
	for _, a := range b.podIPs[key] {
		if m := s.podIPs[ns]; verified && m != nil {
			m = maps.Clone(m)
			delete(m, a)
			if len(m) == 0 {
				delete(s.podIPs, ns)
			} else {
				s.podIPs[ns] = m
			}
		}
		b.indexPod(s, a, key, false)
	}
	delete(b.podIPs, key)
	if len(ips) == 0 {
		return
	}
	b.podIPs[key] = make([]netip.Addr, len(ips))
	for i, a := range ips {
		b.podIPs[key][i] = a.Unmap()
	}
	for _, a := range b.podIPs[key] {
		b.indexPod(s, a, key, true)
	}
	if !verified {
		return
	}
	m := maps.Clone(s.podIPs[ns])
	if m == nil {
		m = map[netip.Addr]struct{}{}
	}
	for _, a := range b.podIPs[key] {
		m[a] = struct{}{}
	}
	s.podIPs[ns] = m
}

// indexPod adds key as a holder of a (or removes it) and sets a's
// namespace in the pod index: the one namespace of its holders, "" for
// several.
func (b *builder) indexPod(s *snapshot, a netip.Addr, key cluster.Key, add bool) {
	if s.podNS == nil {
		return
	}
	keys := slices.DeleteFunc(slices.Clone(b.ipPods[a]), func(k cluster.Key) bool { return k == key })
	if add {
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		delete(b.ipPods, a)
		delete(s.podNS, a)
		return
	}
	b.ipPods[a] = keys
	ns := strings.ToLower(keys[0].Namespace)
	for _, k := range keys[1:] {
		if !strings.EqualFold(k.Namespace, ns) {
			ns = ""
		}
	}
	s.podNS[a] = ns
}

// ClientNamespace is the namespace of the pod holding a, when the pod
// index knows one (ZoneOptions.PodIndex): no pod, or pods of several
// namespaces (host-network pods share their node's address), give false.
func (z *Zone) ClientNamespace(a netip.Addr) (string, bool) {
	ns := z.snap.Load().podNS[a.Unmap()]
	return ns, ns != ""
}

// addFixedNames adds the names that exist whatever the cluster holds: the
// apex, the svc and pod subtrees, dns-version and the ns.dns subtree.
func (z *Zone) addFixedNames(s *snapshot) {
	s.names[string(s.zone)] = &node{}
	for _, sub := range []string{"svc", "pod", "dns"} {
		s.names[string(joinWire(wireName(sub), s.zone))] = &node{}
	}
	s.names[string(joinWire(wireName("ns.dns"), s.zone))] = &node{}
	txt := rrset{an: appendRR(nil, ptrTo(headerLen), typeTXT, 28800, []byte("\x051.1.0")), n: 1}
	s.names[string(joinWire(wireName("dns-version"), s.zone))] = packNode(rrset{}, rrset{}, rrset{}, txt, "")
	s.nsAddrs = nil
}
