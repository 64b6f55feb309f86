package agent

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
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
	n.rec = &routing.Reconciler{Kernel: k, Device: routing.DefaultDevice}
	n.watch = func(ctx context.Context, onEvent func(routing.Event)) error {
		return routing.Watch(ctx, nsh, routing.DefaultDevice, onEvent, nil)
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
	go func() { n.run(ctx); close(done) }()
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
	waitFor("first sync", func() bool { return strings.Count(routes(), "\n") == 200 })
	// Echoes of the first sync, and of each change below, come within
	// milliseconds; a full sync they caused would follow them.
	settle := func(after string) {
		t.Helper()
		time.Sleep(500 * time.Millisecond)
		if f := n.fullSyncs.Load(); f != 1 {
			t.Fatalf("after %s: %d full syncs, want 1 (the first)", after, f)
		}
	}
	settle("the first sync")

	store.Upsert(testNode("peer999", "192.168.20.99", "10.244.250.0/24"))
	waitFor("node added", func() bool { return strings.Contains(routes(), "10.244.250.0/24 via 10.244.250.0 dev podnet.1 onlink") })
	settle("a VXLAN Node added")
	store.Upsert(testNode("peer999", "192.168.10.99", "10.244.250.0/24"))
	waitFor("node moved", func() bool { return strings.Contains(routes(), "10.244.250.0/24 via 192.168.10.99 dev eth0") })
	settle("a Node moved to host-gw")
	store.Delete(cluster.KindNode, cluster.Key{Name: "peer999"})
	waitFor("node removed", func() bool { return !strings.Contains(routes(), "10.244.250.0/24") })
	settle("a Node removed")

	// Someone else deletes a route and a neighbour: a full sync repairs both.
	ip("route", "del", "10.244.10.0/24")
	ip("neigh", "del", "10.244.11.0", "dev", routing.DefaultDevice)
	waitFor("repair", func() bool {
		return n.fullSyncs.Load() >= 2 && strings.Contains(routes(), "10.244.10.0/24 via 192.168.10.20 dev eth0") &&
			strings.Contains(ip("neigh", "show", "dev", routing.DefaultDevice), "10.244.11.0 lladdr")
	})
}
