package routing

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/roottest"
)

// newTestNS creates a network namespace with "eth0" (a veth; this kernel
// may lack the dummy driver) holding
// 192.168.10.11/24 and returns a netlink handle into it.
func newTestNS(t testing.TB) (string, *netlink.Handle, netns.NsHandle) {
	return newTestNSWith(t, "192.168.10.11/24")
}

// newTestNSWith is newTestNS with eth0 holding addr.
func newTestNSWith(t testing.TB, addr string) (string, *netlink.Handle, netns.NsHandle) {
	t.Helper()
	roottest.Require(t)
	name := fmt.Sprintf("podnet-rt-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	nsh, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nsh.Close() })
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	eth0 := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", MTU: 1500}, PeerName: "eth0-peer"}
	if err := h.LinkAdd(eth0); err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr(addr)
	if err := h.AddrAdd(eth0, a); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(eth0); err != nil {
		t.Fatal(err)
	}
	return name, h, nsh
}

// newTestKernel is a NetlinkKernel in nsh, closed at the end of the test.
func newTestKernel(t testing.TB, nsh netns.NsHandle) *NetlinkKernel {
	t.Helper()
	k, err := NewNetlinkKernel(nsh, ipfamily.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return k
}

func ipIn(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
	return string(out)
}

// TestNetlinkKernelStates applies the golden states to a real kernel (in a
// namespace) and checks it reads back exactly the plan, a second apply
// changes nothing, and `ip` shows what the design promises.
func TestNetlinkKernelStates(t *testing.T) {
	ns, _, nsh := newTestNS(t)
	k := newTestKernel(t, nsh)
	r := &Reconciler{Kernel: k, Device: DefaultDevice}
	for _, s := range states {
		if s.cfg.UnderlayMTU != 1500 {
			continue // eth0 here has MTU 1500; the kernel caps podnet.1 below it
		}
		p := Compute(s.cfg, s.nodes)
		if _, err := r.Apply(p); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		changes, err := r.Apply(p)
		if err != nil || len(changes) != 0 {
			t.Fatalf("%s: second apply changed %q (err %v)", s.name, changes, err)
		}
		checkKernelHolds(t, k, p)
	}

	p := Compute(config(BackendAuto), []*cluster.Node{self, node2, node4})
	if _, err := r.Apply(p); err != nil {
		t.Fatal(err)
	}
	link := ipIn(t, ns, "-d", "link", "show", "podnet.1")
	for _, want := range []string{"mtu 1450", "vxlan id 1 local 192.168.10.11 dev eth0", "dstport 8472", "nolearning", "link/ether 0e:70:c0:a8:0a:0b"} {
		if !strings.Contains(link, want) {
			t.Errorf("ip link show podnet.1 lacks %q:\n%s", want, link)
		}
	}
	routes := ipIn(t, ns, "route", "show", "proto", "98")
	for _, want := range []string{"10.244.2.0/24 via 192.168.10.12 dev eth0", "10.244.4.0/24 via 10.244.4.0 dev podnet.1 onlink"} {
		if !strings.Contains(routes, want) {
			t.Errorf("routes lack %q:\n%s", want, routes)
		}
	}
	if neigh := ipIn(t, ns, "neigh", "show", "dev", "podnet.1"); !strings.Contains(neigh, "10.244.4.0 lladdr 0e:70:c0:a8:14:0e PERMANENT") {
		t.Errorf("neighbours:\n%s", neigh)
	}
	fdb, _ := exec.Command("ip", "netns", "exec", ns, "bridge", "fdb", "show", "dev", "podnet.1").CombinedOutput()
	if !strings.Contains(string(fdb), "0e:70:c0:a8:14:0e dst 192.168.20.14 self permanent") {
		t.Errorf("fdb:\n%s", fdb)
	}

	// A route that is not podnet's is never touched.
	ipIn(t, ns, "route", "add", "10.99.0.0/16", "via", "192.168.10.1")
	// Hand deletions come back with exactly the missing entries re-added.
	ipIn(t, ns, "route", "del", "10.244.2.0/24")
	ipIn(t, ns, "neigh", "del", "10.244.4.0", "dev", "podnet.1")
	changes, err := r.Apply(p)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(changes)
	want := []string{"replace route 10.244.2.0/24 via 192.168.10.12 dev eth0", "set neigh 10.244.4.0 lladdr 0e:70:c0:a8:14:0e dev podnet.1 permanent"}
	if !slices.Equal(changes, want) {
		t.Errorf("repair changes = %q, want %q", changes, want)
	}
	if !strings.Contains(ipIn(t, ns, "route", "show"), "10.99.0.0/16 via 192.168.10.1") {
		t.Error("a foreign route was removed")
	}

	// host-gw backend: the device and everything on it go away.
	if _, err := r.Apply(Compute(config(BackendHostGW), []*cluster.Node{self, node2})); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "-n", ns, "link", "show", "podnet.1").CombinedOutput(); err == nil {
		t.Errorf("podnet.1 still exists with host-gw:\n%s", out)
	}
}

func checkKernelHolds(t *testing.T, k Kernel, p Plan) {
	t.Helper()
	routes, err := k.Routes()
	if err != nil {
		t.Fatal(err)
	}
	sortRoutes := func(rs []Route) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.String())
		}
		slices.Sort(out)
		return out
	}
	if got, want := sortRoutes(routes), sortRoutes(p.Routes); !slices.Equal(got, want) {
		t.Errorf("routes = %q, want %q", got, want)
	}
	if p.Device == nil {
		return
	}
	d, err := k.VXLAN(p.Device.Name)
	if err != nil || d == nil {
		t.Fatalf("device: %v, %v", d, err)
	}
	if d.String() != p.Device.String() {
		t.Errorf("device = %s, want %s", d, p.Device)
	}
	fdb, _ := k.FDB(p.Device.Name)
	if len(fdb) != len(p.FDB) {
		t.Errorf("fdb = %v, want %v", fdb, p.FDB)
	}
	neighs, _ := k.Neighs(p.Device.Name)
	if len(neighs) != len(p.Neighs) {
		t.Errorf("neighs = %v, want %v", neighs, p.Neighs)
	}
}

// watched is a test namespace with Watch running on it from the start,
// sorting the events it reports into those its table matches (own) and
// the rest (foreign); settle says when every change made so far has been
// reported.
type watched struct {
	ns    string
	h     *netlink.Handle
	rec   *Reconciler
	table *Table

	mu           sync.Mutex
	own, foreign []Event
	// markers receives the events of settle's markers, kept out of own
	// and foreign.
	markers chan Event
	// round numbers settle's calls, to tell one call's markers from
	// another's; link is the name settle last gave the spare link.
	round int
	link  string
}

// The markers settle writes: a route tagged as podnet's to
// markerNet.round, a neighbour markerNet.round on the device, and the
// spare link (eth0's veth peer) renamed markerLink+round.
const (
	markerNet  = "198.51.100."
	markerLink = "marker"
)

// watchedTestNS is a test namespace with Watch running, then the plan for
// self, node2 (host-gw) and node4 (VXLAN) applied: none of the apply's own
// events may count as foreign, and there must be some.
func watchedTestNS(t *testing.T) *watched {
	t.Helper()
	ns, h, nsh := newTestNS(t)
	w := &watched{ns: ns, h: h, rec: &Reconciler{Kernel: newTestKernel(t, nsh), Device: DefaultDevice},
		table: NewTable(config(BackendAuto), []*cluster.Node{self, node2, node4}), markers: make(chan Event, 16), link: "eth0-peer"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	live := make(chan struct{})
	go func() {
		done <- Watch(ctx, nsh, DefaultDevice, w.record, func() { close(live) })
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-live:
	case err := <-done:
		t.Fatalf("Watch: %v", err)
	}
	if _, err := w.rec.Apply(w.table.Plan()); err != nil {
		t.Fatal(err)
	}
	w.ownOnly(t, "the first apply")
	return w
}

// record is Watch's onEvent.
func (w *watched) record(e Event) {
	if w.isMarker(e) {
		w.markers <- e
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.table.Matches(e) {
		w.own = append(w.own, e)
	} else {
		w.foreign = append(w.foreign, e)
	}
}

func (w *watched) isMarker(e Event) bool {
	switch e.Kind {
	case EventRoute:
		return strings.HasPrefix(e.Route.Dst.String(), markerNet)
	case EventNeigh:
		return strings.HasPrefix(e.Neigh.IP.String(), markerNet)
	case EventLink:
		return strings.HasPrefix(e.Link, markerLink)
	}
	return false
}

// settle returns the events Watch reported since the last settle, once
// every change made to the kernel before it has been reported: the kernel
// queues each subscription's events in the order of the changes, so when
// the events of a marker written on each subscription (route, neighbour,
// link) have come, every earlier event has too.
func (w *watched) settle(t *testing.T) (own, foreign []Event) {
	t.Helper()
	w.round++
	addr, link := netip.MustParseAddr(fmt.Sprintf("%s%d", markerNet, w.round)), fmt.Sprintf("%s%d", markerLink, w.round)
	want := map[string]bool{"route " + addr.String(): true, "route deleted " + addr.String(): true, "link " + link: true}
	eth0, err := w.h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	r := &netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(addr.BitLen(), addr.BitLen())}, Protocol: Protocol}
	if err := w.h.RouteAdd(r); err != nil {
		t.Fatalf("marker route: %v", err)
	}
	if err := w.h.RouteDel(r); err != nil {
		t.Fatalf("marker route: %v", err)
	}
	if dev, err := w.h.LinkByName(DefaultDevice); err == nil && dev.Attrs().Flags&net.FlagUp != 0 {
		want["neigh "+addr.String()], want["neigh deleted "+addr.String()] = true, true
		n := &netlink.Neigh{LinkIndex: dev.Attrs().Index, IP: addr.AsSlice(), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 0x99},
			State: netlink.NUD_PERMANENT, Family: netlink.FAMILY_V4}
		if addr.Is6() {
			n.Family = netlink.FAMILY_V6
		}
		if err := w.h.NeighAdd(n); err != nil {
			t.Fatalf("marker neighbour: %v", err)
		}
		if err := w.h.NeighDel(n); err != nil {
			t.Fatalf("marker neighbour: %v", err)
		}
	}
	spare, err := w.h.LinkByName(w.link)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.h.LinkSetName(spare, link); err != nil {
		t.Fatalf("marker link: %v", err)
	}
	w.link = link
	timeout := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case e := <-w.markers:
			delete(want, markerKey(e))
		case <-timeout:
			t.Fatalf("Watch did not report the markers %v within 10 s", slices.Sorted(maps.Keys(want)))
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	own, foreign = w.own, w.foreign
	w.own, w.foreign = nil, nil
	return own, foreign
}

// markerKey names a marker's event as settle's want does.
func markerKey(e Event) string {
	deleted := ""
	if e.Deleted {
		deleted = "deleted "
	}
	switch e.Kind {
	case EventRoute:
		return "route " + deleted + e.Route.Dst.Addr().String()
	case EventNeigh:
		return "neigh " + deleted + e.Neigh.IP.String()
	}
	return "link " + deleted + e.Link
}

// ownOnly fails unless what happened since the last settle was reported,
// all of it as the table's own.
func (w *watched) ownOnly(t *testing.T, after string) {
	t.Helper()
	own, foreign := w.settle(t)
	if len(foreign) > 0 {
		t.Fatalf("after %s: foreign events %+v", after, foreign)
	}
	if len(own) == 0 {
		t.Fatalf("after %s: no event at all", after)
	}
}

// quiet fails when anything since the last settle was foreign.
func (w *watched) quiet(t *testing.T, after string) {
	t.Helper()
	if _, foreign := w.settle(t); len(foreign) > 0 {
		t.Fatalf("after %s: foreign events %+v", after, foreign)
	}
}

// foreignSeen fails unless something since the last settle was foreign.
func (w *watched) foreignSeen(t *testing.T, after string) {
	t.Helper()
	if _, foreign := w.settle(t); len(foreign) == 0 {
		t.Fatalf("no foreign event for %s", after)
	}
}

// TestWatchOwnWritesMatchTheTable: Nodes added, changed and removed
// through the Table and Patch echo back as events the Table matches; a
// hand deletion of an entry of the plan, a stray route tagged as podnet's
// and the device going down do not.
func TestWatchOwnWritesMatchTheTable(t *testing.T) {
	w := watchedTestNS(t)
	for _, step := range []struct {
		what string
		d    func() Delta
	}{
		{"node3 added (host-gw)", func() Delta { return w.table.Set(node3) }},
		{"node5 added (VXLAN)", func() Delta { return w.table.Set(node("node5", "192.168.20.15", "10.244.5.0/24")) }},
		{"node5 moved", func() Delta { return w.table.Set(node("node5", "192.168.20.25", "10.244.5.0/24")) }},
		{"node2 to VXLAN", func() Delta { return w.table.Set(node("node2", "192.168.20.12", "10.244.2.0/24")) }},
		{"node5 removed", func() Delta { return w.table.Delete("node5") }},
		{"node3 removed", func() Delta { return w.table.Delete("node3") }},
	} {
		d := step.d()
		if d.Empty() {
			t.Fatalf("%s: no change", step.what)
		}
		if _, err := w.rec.Patch(d); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		w.ownOnly(t, step.what)
	}
	checkKernelHolds(t, w.rec.Kernel, w.table.Plan())

	ipIn(t, w.ns, "route", "del", "10.244.2.0/24")
	w.foreignSeen(t, "a route of the plan deleted")
	ipIn(t, w.ns, "route", "add", "10.244.99.0/24", "via", "192.168.10.99", "proto", "98")
	w.foreignSeen(t, "a stray route tagged as podnet's")
	ipIn(t, w.ns, "link", "set", DefaultDevice, "down")
	w.foreignSeen(t, "the device down")
}

// TestWatchSeesHandDeletion: a route of the plan deleted by hand is foreign.
func TestWatchSeesHandDeletion(t *testing.T) {
	w := watchedTestNS(t)
	ipIn(t, w.ns, "route", "del", "10.244.2.0/24")
	w.foreignSeen(t, "a deleted route")
}

// TestWatchSeesNeighbourDeletionOnTheDeviceOnly: ARP on the underlay is
// not podnet's business; a neighbour of the plan deleted is.
func TestWatchSeesNeighbourDeletionOnTheDeviceOnly(t *testing.T) {
	w := watchedTestNS(t)
	ipIn(t, w.ns, "neigh", "add", "192.168.10.77", "lladdr", "02:00:00:00:00:77", "dev", "eth0")
	w.quiet(t, "a neighbour added on eth0")
	ipIn(t, w.ns, "neigh", "del", "10.244.4.0", "dev", DefaultDevice)
	w.foreignSeen(t, "a deleted neighbour on podnet.1")
}

// TestVXLANTakenByAnotherDevice: a device of another network holding
// podnet's VNI and port (flannel's flannel.1: VNI 1, UDP 8472) makes the
// reconciler's error name it and the flags that move podnet's, and
// nothing of the other device changes.
func TestVXLANTakenByAnotherDevice(t *testing.T) {
	ns, _, nsh := newTestNS(t)
	ipIn(t, ns, "link", "add", "flannel.1", "type", "vxlan", "id", "1", "dstport", "8472", "dev", "eth0", "nolearning")
	ipIn(t, ns, "link", "set", "flannel.1", "up")
	before := ipIn(t, ns, "-d", "link", "show", "flannel.1")
	k := newTestKernel(t, nsh)
	r := &Reconciler{Kernel: k, Device: DefaultDevice}
	cfg := Config{NodeName: "n1", Backend: BackendVXLAN, NodeIP: netip.MustParseAddr("192.168.10.11"), NodeSubnet: netip.MustParsePrefix("192.168.10.0/24"),
		Iface: "eth0", UnderlayMTU: 1500, Device: DefaultDevice, VNI: DefaultVNI, Port: DefaultPort}
	_, err := r.Apply(Compute(cfg, nil))
	if !errors.Is(err, ErrVXLANTaken) || !strings.Contains(err.Error(), "flannel.1 already holds VNI 1 on UDP port 8472") ||
		!strings.Contains(err.Error(), "--vxlan-vni") {
		t.Fatalf("Apply beside flannel.1: %v; want ErrVXLANTaken naming flannel.1 and the flags", err)
	}
	if after := ipIn(t, ns, "-d", "link", "show", "flannel.1"); after != before {
		t.Errorf("flannel.1 changed:\n%s\n%s", before, after)
	}
	cfg.VNI = 2
	if _, err := r.Apply(Compute(cfg, nil)); err != nil {
		t.Errorf("with --vxlan-vni 2: %v", err)
	}
}
