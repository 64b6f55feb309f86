package nodenet

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/hostnet"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/dataplane/routing"
)

// TestOwnWritesDoNotTriggerAFullSync runs the node network on a real
// kernel (a namespace of its own, node1 at 192.168.10.11/24 on eth0) with
// the netlink watch on: the first sync's 600 entries, and Nodes added,
// moved and removed afterwards, echo back as netlink events that cause no
// further full sync; a route of the plan deleted by hand causes one, which
// puts the route back.
func TestOwnWritesDoNotTriggerAFullSync(t *testing.T) {
	roottest.Require(t)
	name := fmt.Sprintf("podnet-ag-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	ip := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"-n", name}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ip("link", "add", "eth0", "type", "veth", "peer", "name", "eth0-peer")
	ip("addr", "add", "192.168.10.11/24", "dev", "eth0")
	ip("link", "set", "eth0", "up")
	nsh, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nsh.Close() })
	k, err := routing.NewNetlinkKernel(nsh, ipfamily.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)

	n, store := newTestNodeNet(t, routing.BackendAuto, nil, hostnet.NewFakeIPTables())
	n.fams[0].rec.Kernel = k
	w := &markedWatch{markers: make(chan routing.Event, 16), link: "eth0-peer"}
	n.watch = func(ctx context.Context, onEvent func(routing.Event)) error {
		return routing.Watch(ctx, nsh, routing.DefaultDevice, func(e routing.Event) { w.onEvent(n, e, onEvent) }, nil)
	}
	n.o.MinSyncPeriod = 10 * time.Millisecond
	store.Upsert(testNode("node1", "192.168.10.11", "10.244.1.0/24"))
	// 100 host-gw peers, 100 VXLAN peers.
	for i := range 200 {
		seg := 10 + 10*(i%2)
		store.Upsert(testNode(fmt.Sprintf("peer%03d", i), fmt.Sprintf("192.168.%d.%d", seg, 20+i), fmt.Sprintf("10.244.%d.0/24", 10+i)))
	}
	store.MarkSynced()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 5 s", what)
			}
		}
	}
	routes := func() string { return ip("route", "show", "proto", "98") }
	// The routes are in the kernel before the sync that wrote them has
	// ended and counted itself.
	waitFor("first sync", func() bool { return strings.Count(routes(), "\n") == 200 && n.fullSyncs.Load() >= 1 })
	// Every echo of the first sync, and of each change below, has reached
	// the agent once the markers' events have; the agent asks for a full
	// sync on any event its table does not match.
	settle := func(after string, wantOwn bool) {
		t.Helper()
		own, foreign := w.settle(t, ip)
		if len(foreign) > 0 {
			t.Fatalf("after %s: events the agent takes for foreign ones: %+v", after, foreign)
		}
		if wantOwn && own == 0 {
			t.Fatalf("after %s: no event at all", after)
		}
		if f := n.fullSyncs.Load(); f != 1 {
			t.Fatalf("after %s: %d full syncs, want 1 (the first)", after, f)
		}
	}
	// The watch may have started after the first sync's writes.
	settle("the first sync", false)

	store.Upsert(testNode("peer999", "192.168.20.99", "10.244.250.0/24"))
	waitFor("node added", func() bool { return strings.Contains(routes(), "10.244.250.0/24 via 10.244.250.0 dev podnet.1 onlink") })
	settle("a VXLAN Node added", true)
	store.Upsert(testNode("peer999", "192.168.10.99", "10.244.250.0/24"))
	waitFor("node moved", func() bool { return strings.Contains(routes(), "10.244.250.0/24 via 192.168.10.99 dev eth0") })
	settle("a Node moved to host-gw", true)
	store.Delete(cluster.KindNode, cluster.Key{Name: "peer999"})
	waitFor("node removed", func() bool { return !strings.Contains(routes(), "10.244.250.0/24") })
	settle("a Node removed", true)

	// Someone else deletes a route and a neighbour: a full sync repairs both.
	ip("route", "del", "10.244.10.0/24")
	ip("neigh", "del", "10.244.11.0", "dev", routing.DefaultDevice)
	waitFor("repair", func() bool {
		return n.fullSyncs.Load() >= 2 && strings.Contains(routes(), "10.244.10.0/24 via 192.168.10.20 dev eth0") &&
			strings.Contains(ip("neigh", "show", "dev", routing.DefaultDevice), "10.244.11.0 lladdr")
	})
}

// markedWatch passes the netlink watch's events on to the agent, counting
// those the agent's table matches (own) and the rest (foreign), and keeps
// the events of settle's markers to itself.
type markedWatch struct {
	mu      sync.Mutex
	own     int
	foreign []routing.Event
	markers chan routing.Event
	round   int
	link    string // the spare link's name now
}

// The markers settle writes: a route tagged as podnet's to
// markerNet.round, a neighbour markerNet.round on the VXLAN device, and
// the spare link renamed markerLink+round.
const (
	markerNet  = "198.51.100."
	markerLink = "marker"
)

func (w *markedWatch) onEvent(n *Network, e routing.Event, agent func(routing.Event)) {
	switch {
	case e.Kind == routing.EventRoute && strings.HasPrefix(e.Route.Dst.String(), markerNet),
		e.Kind == routing.EventNeigh && strings.HasPrefix(e.Neigh.IP.String(), markerNet),
		e.Kind == routing.EventLink && strings.HasPrefix(e.Link, markerLink):
		w.markers <- e
		return
	}
	w.mu.Lock()
	if n.matches(e) {
		w.own++
	} else {
		w.foreign = append(w.foreign, e)
	}
	w.mu.Unlock()
	agent(e)
}

// settle writes a marker on each of the watch's subscriptions (route,
// neighbour, link), waits for their events (the kernel queues them behind
// every earlier change) and returns what came since the last settle.
func (w *markedWatch) settle(t *testing.T, ip func(...string) string) (own int, foreign []routing.Event) {
	t.Helper()
	w.round++
	addr, link := fmt.Sprintf("%s%d", markerNet, w.round), fmt.Sprintf("%s%d", markerLink, w.round)
	ip("route", "add", addr, "dev", "eth0", "proto", fmt.Sprint(routing.Protocol))
	ip("route", "del", addr, "dev", "eth0", "proto", fmt.Sprint(routing.Protocol))
	ip("neigh", "add", addr, "lladdr", "02:00:00:00:00:99", "dev", routing.DefaultDevice, "nud", "permanent")
	ip("neigh", "del", addr, "dev", routing.DefaultDevice)
	ip("link", "set", w.link, "name", link)
	w.link = link
	want := map[string]bool{"route " + addr: true, "route deleted " + addr: true, "neigh " + addr: true, "neigh deleted " + addr: true, "link " + link: true}
	timeout := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case e := <-w.markers:
			delete(want, markerKey(e))
		case <-timeout:
			t.Fatalf("the watch did not report settle's markers %v within 10 s", want)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	own, foreign = w.own, w.foreign
	w.own, w.foreign = 0, nil
	return own, foreign
}

// markerKey names a marker's event as settle's want does.
func markerKey(e routing.Event) string {
	deleted := ""
	if e.Deleted {
		deleted = "deleted "
	}
	switch e.Kind {
	case routing.EventRoute:
		return "route " + deleted + e.Route.Dst.Addr().String()
	case routing.EventNeigh:
		return "neigh " + deleted + e.Neigh.IP.String()
	}
	return "link " + deleted + e.Link
}
