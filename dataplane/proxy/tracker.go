package proxy

import (
	"net/netip"
	"reflect"
	"slices"
	"sync"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

// Tracker records which Services changed since the last sync. Its handler
// only marks keys and signals; the sync loop does the work.
type Tracker struct {
	nodeName string
	signal   chan struct{}

	mu    sync.Mutex
	dirty map[cluster.Key]bool
	all   bool
}

// NewTracker subscribes to store. Everything starts dirty.
func NewTracker(store *cluster.Store, nodeName string) *Tracker {
	t := &Tracker{nodeName: nodeName, signal: make(chan struct{}, 1), dirty: make(map[cluster.Key]bool), all: true}
	store.Subscribe(t.handle)
	return t
}

func (t *Tracker) handle(ev cluster.Event) {
	t.mu.Lock()
	switch ev.Kind {
	case cluster.KindService:
		t.dirty[ev.Key] = true
	case cluster.KindEndpointSlice:
		for _, o := range []cluster.Object{ev.Old, ev.New} {
			if es, ok := o.(*cluster.EndpointSlice); ok {
				t.dirty[es.ServiceKey()] = true
			}
		}
	case cluster.KindNode:
		// This node's zone decides topology for every Service.
		if ev.Key.Name == t.nodeName {
			t.all = true
		}
	default:
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	select {
	case t.signal <- struct{}{}:
	default:
	}
}

// Mark records keys as changed, as an event of theirs would.
func (t *Tracker) Mark(keys []cluster.Key) {
	t.mu.Lock()
	for _, k := range keys {
		t.dirty[k] = true
	}
	t.mu.Unlock()
	select {
	case t.signal <- struct{}{}:
	default:
	}
}

// Changed is signalled after a change is recorded.
func (t *Tracker) Changed() <-chan struct{} { return t.signal }

// Take returns and clears the recorded changes.
func (t *Tracker) Take() (dirty map[cluster.Key]bool, all bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	dirty, all = t.dirty, t.all
	t.dirty, t.all = make(map[cluster.Key]bool), false
	return dirty, all
}

// State is the current set of ServicePorts, rebuilt incrementally: a
// Service's ports of every family the State serves, family by family in
// the order given.
type State struct {
	Ports    map[cluster.Key][]*ServicePort
	node     NodeInfo
	families []ipfamily.Family
	// probe, when set, tells which probed local endpoints refused
	// (localProber); probes are the targets per Service, probesChanged
	// whether they changed since the last Probes.
	probe         *localProber
	probes        map[cluster.Key][]netip.AddrPort
	probesChanged bool
}

// NewState returns an empty State building ServicePorts of families.
func NewState(families ...ipfamily.Family) *State {
	return &State{Ports: make(map[cluster.Key][]*ServicePort), families: families}
}

// Update rebuilds the Services in dirty (every Service when all) from store
// and returns the keys whose ports really changed. A port built again
// equal to the one it had stays that one (the same pointer), so a Backend
// can tell by identity which of a changed Service's ports changed: one
// family's, when an EndpointSlice of that address type changed.
func (s *State) Update(store *cluster.Store, nodeName string, dirty map[cluster.Key]bool, all bool) map[cluster.Key]bool {
	node := NodeInfo{Name: nodeName}
	if n := store.Node(nodeName); n != nil {
		node.Zone, node.PodCIDRs = n.Zone, n.PodCIDRs
	}
	if !reflect.DeepEqual(node, s.node) {
		all = true
		s.node = node
	}
	if all {
		dirty = make(map[cluster.Key]bool)
		for k := range s.Ports {
			dirty[k] = true
		}
		for _, svc := range store.Services() {
			dirty[svc.Key()] = true
		}
	}
	changed := make(map[cluster.Key]bool)
	for key := range dirty {
		svc, eps := store.Service(key), store.EndpointSlicesFor(key)
		var ports []*ServicePort
		var probes []netip.AddrPort
		for _, f := range s.families {
			built := BuildServicePorts(svc, eps, node, f)
			if s.probe != nil && svc != nil && svc.TrafficDistribution == "PreferSameNode" {
				probes = append(probes, probeLocal(built, svc.TrafficDistribution, node, s.probe.Refused)...)
			}
			ports = append(ports, built...)
		}
		s.setProbes(key, probes)
		old, had := s.Ports[key]
		if len(ports) == 0 {
			if had {
				delete(s.Ports, key)
				changed[key] = true
			}
			continue
		}
		if had {
			ports = keepUnchanged(old, ports)
			if slices.Equal(old, ports) {
				continue
			}
		}
		s.Ports[key] = ports
		changed[key] = true
	}
	return changed
}

// keepUnchanged returns built with each port equal to one of old (the same
// port of the same family) replaced by that one.
func keepUnchanged(old, built []*ServicePort) []*ServicePort {
	for i, sp := range built {
		for _, o := range old {
			if o.Name == sp.Name && o.ClusterIP == sp.ClusterIP && reflect.DeepEqual(o, sp) {
				built[i] = o
				break
			}
		}
	}
	return built
}
