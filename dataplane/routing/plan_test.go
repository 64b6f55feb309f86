package routing

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

var update = flag.Bool("update", false, "rewrite golden files")

func node(name, ip, cidr string) *cluster.Node {
	n := &cluster.Node{Name: name}
	if ip != "" {
		n.InternalIPs = []netip.Addr{netip.MustParseAddr(ip)}
	}
	if cidr != "" {
		n.PodCIDRs = []netip.Prefix{netip.MustParsePrefix(cidr)}
	}
	return n
}

func config(b Backend) Config {
	return Config{
		NodeName: "node1", Backend: b,
		NodeIP:     netip.MustParseAddr("192.168.10.11"),
		NodeSubnet: netip.MustParsePrefix("192.168.10.0/24"),
		Iface:      "eth0", UnderlayMTU: 1500,
		Device: DefaultDevice, VNI: DefaultVNI, Port: DefaultPort,
	}
}

type state struct {
	name  string
	cfg   Config
	nodes []*cluster.Node
}

var (
	self   = node("node1", "192.168.10.11", "10.244.1.0/24")
	node2  = node("node2", "192.168.10.12", "10.244.2.0/24")
	node3  = node("node3", "192.168.10.13", "10.244.3.0/24")
	node4  = node("node4", "192.168.20.14", "10.244.4.0/24")
	states = []state{
		{"no podCIDR yet", config(BackendAuto), []*cluster.Node{node("node1", "192.168.10.11", ""), node2}},
		{"alone", config(BackendAuto), []*cluster.Node{self}},
		{"auto four nodes", config(BackendAuto), []*cluster.Node{self, node2, node3, node4}},
		{"node2 moves to the far segment", config(BackendAuto), []*cluster.Node{self, node("node2", "192.168.20.12", "10.244.2.0/24"), node3, node4}},
		{"node3 deleted, node4 new podCIDR", config(BackendAuto), []*cluster.Node{self, node2, node("node4", "192.168.20.14", "10.244.40.0/24")}},
		{"vxlan forced", config(BackendVXLAN), []*cluster.Node{self, node2, node3, node4}},
		{"host-gw forced", config(BackendHostGW), []*cluster.Node{self, node2, node3}},
		{"host-gw forced with a far peer", config(BackendHostGW), []*cluster.Node{self, node2, node4}},
		{"vni and port changed", func() Config { c := config(BackendAuto); c.VNI, c.Port = 7, 4789; return c }(), []*cluster.Node{self, node2, node4}},
		{"underlay MTU 9000", func() Config { c := config(BackendAuto); c.UnderlayMTU = 9000; return c }(), []*cluster.Node{self, node4}},
		{"peers that cannot be routed", config(BackendAuto), []*cluster.Node{
			self, node2,
			node("no-cidr", "192.168.10.20", ""),
			node("no-ip", "", "10.244.9.0/24"),
			node("overlaps-self", "192.168.10.21", "10.244.1.0/24"),
			node("same-as-node2", "192.168.10.22", "10.244.2.0/24"),
			node("ipv6-only", "fd00::1", "10.244.8.0/24"),
		}},
	}
)

func newFake() *FakeKernel {
	return NewFakeKernel(map[string]netip.Prefix{"eth0": netip.MustParsePrefix("192.168.10.0/24")})
}

// TestRouterStates applies every state in sequence and checks the plan and
// the resulting kernel state against golden text; then replays the states
// in random orders and checks each lands on the same kernel state.
func TestRouterStates(t *testing.T) {
	k := newFake()
	r := &Reconciler{Kernel: k, Device: DefaultDevice}
	var golden strings.Builder
	dumps := make([]string, len(states))
	for i, s := range states {
		k.SetMTU("eth0", s.cfg.UnderlayMTU)
		p := Compute(s.cfg, s.nodes)
		if _, err := r.Apply(p); err != nil {
			t.Fatalf("%s: apply: %v", s.name, err)
		}
		dumps[i] = k.Dump()
		fmt.Fprintf(&golden, "=== %s (backend %s, pod MTU %d)\n--- plan\n%s--- kernel\n%s\n", s.name, s.cfg.Backend, s.cfg.PodMTU(), p, dumps[i])

		// Applying the same plan again changes nothing: this is what makes
		// a proxyd restart harmless to running pods.
		before := k.Mutations
		changes, err := r.Apply(p)
		if err != nil || len(changes) != 0 || k.Mutations != before {
			t.Errorf("%s: second apply changed %v (err %v)", s.name, changes, err)
		}
	}
	checkGolden(t, "TestRouterStates.golden", golden.String())

	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 20; round++ {
		k := newFake()
		r := &Reconciler{Kernel: k, Device: DefaultDevice}
		for _, i := range rng.Perm(len(states)) {
			s := states[i]
			k.SetMTU("eth0", s.cfg.UnderlayMTU)
			if _, err := r.Apply(Compute(s.cfg, s.nodes)); err != nil {
				t.Fatalf("round %d, %s: %v", round, s.name, err)
			}
			if got := k.Dump(); got != dumps[i] {
				t.Fatalf("round %d, %s: kernel state\n%s\nwant\n%s", round, s.name, got, dumps[i])
			}
		}
	}
}

// TestTableMatchesCompute walks random sequences of single Node changes
// (peers coming, going, moving between the segments, changing podCIDR or
// address, claiming another's podCIDR or its network address, sharing an
// address, losing their podCIDR, overlapping this node's; one at a time
// and several in one Update) through a Table,
// with every backend: after each step the table's plan is Compute's for
// the same Nodes, and the kernel patched with the table's deltas holds
// what a full Apply of Compute's plan makes of another kernel, with no
// more changes.
func TestTableMatchesCompute(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	randomNode := func() *cluster.Node {
		i := rng.IntN(12)
		name := fmt.Sprintf("n%02d", i)
		seg := 10 + 10*rng.IntN(2)
		ip := fmt.Sprintf("192.168.%d.%d", seg, 100+rng.IntN(14))
		cidr := fmt.Sprintf("10.244.%d.0/%d", 100+rng.IntN(14), 24+rng.IntN(2))
		switch rng.IntN(10) {
		case 0:
			cidr = ""
		case 1:
			cidr = "10.244.1.0/25" // overlaps this node's
		case 2:
			ip = ""
		}
		return node(name, ip, cidr)
	}
	for _, backend := range []Backend{BackendAuto, BackendVXLAN, BackendHostGW} {
		for round := range 20 {
			cfg := config(backend)
			nodes := map[string]*cluster.Node{"node1": self}
			list := func() []*cluster.Node {
				var l []*cluster.Node
				for _, n := range nodes {
					l = append(l, n)
				}
				return l
			}
			ku, ka := newFake(), newFake()
			tab := NewTable(cfg, list())
			ru := &Reconciler{Kernel: ku, Device: DefaultDevice}
			ra := &Reconciler{Kernel: ka, Device: DefaultDevice}
			if _, err := ru.Apply(tab.Plan()); err != nil {
				t.Fatal(err)
			}
			for step := range 40 {
				var d Delta
				switch n := randomNode(); rng.IntN(5) {
				case 0:
					delete(nodes, n.Name)
					d = tab.Delete(n.Name)
				case 1:
					// Several at once, some going.
					changed := map[string]*cluster.Node{}
					for range 1 + rng.IntN(4) {
						if rng.IntN(3) == 0 {
							name := fmt.Sprintf("n%02d", rng.IntN(12))
							delete(nodes, name)
							changed[name] = nil
							continue
						}
						n := randomNode()
						nodes[n.Name] = n
						changed[n.Name] = n
					}
					d = tab.Update(changed)
				default:
					nodes[n.Name] = n
					d = tab.Set(n)
				}
				want := Compute(cfg, list())
				if got := tab.Plan(); got.String() != want.String() {
					t.Fatalf("%s round %d step %d: table plan\n%s\nCompute\n%s", backend, round, step, got, want)
				}
				if got := tab.Skipped(); !slices.Equal(got, want.Skipped) {
					t.Fatalf("%s round %d step %d: Skipped %q, Compute's %q", backend, round, step, got, want.Skipped)
				}
				before := ku.Mutations
				if _, err := ru.Patch(d); err != nil {
					t.Fatalf("%s round %d step %d: patch %+v: %v", backend, round, step, d, err)
				}
				patched := ku.Mutations - before
				before = ka.Mutations
				if _, err := ra.Apply(want); err != nil {
					t.Fatalf("%s round %d step %d: apply: %v", backend, round, step, err)
				}
				if got, want := ku.Dump(), ka.Dump(); got != want {
					t.Fatalf("%s round %d step %d: delta %+v: after Patch\n%s\nafter Apply\n%s", backend, round, step, d, got, want)
				}
				if applied := ka.Mutations - before; patched > applied {
					t.Errorf("%s round %d step %d: Patch made %d changes, Apply %d", backend, round, step, patched, applied)
				}
			}
		}
	}
}

// TestTableDeltaIsOneNodes: a VXLAN Node added is its route, neighbour
// and FDB entry; set again unchanged, nothing; removed, the same three.
func TestTableDeltaIsOneNodes(t *testing.T) {
	tab := NewTable(config(BackendAuto), []*cluster.Node{self, node2, node4})
	n5 := node("node5", "192.168.20.15", "10.244.5.0/24")
	add := tab.Set(n5)
	if len(add.Set.Routes) != 1 || len(add.Set.Neighs) != 1 || len(add.Set.FDB) != 1 || len(add.Delete.Routes)+len(add.Delete.Neighs)+len(add.Delete.FDB) != 0 {
		t.Errorf("add: %+v", add)
	}
	if d := tab.Set(node("node5", "192.168.20.15", "10.244.5.0/24")); !d.Empty() {
		t.Errorf("unchanged: %+v", d)
	}
	del := tab.Delete("node5")
	if !slices.Equal(del.Delete.Routes, add.Set.Routes) || len(del.Delete.Neighs) != 1 || len(del.Delete.FDB) != 1 || len(del.Set.Routes)+len(del.Set.Neighs)+len(del.Set.FDB) != 0 {
		t.Errorf("delete: %+v", del)
	}
}

// TestReconcileRepairs breaks the kernel state the ways an operator or
// another agent might and checks Apply puts back exactly what is missing.
func TestReconcileRepairs(t *testing.T) {
	cfg := config(BackendAuto)
	p := Compute(cfg, []*cluster.Node{self, node2, node3, node4})
	k := newFake()
	r := &Reconciler{Kernel: k, Device: DefaultDevice}
	if _, err := r.Apply(p); err != nil {
		t.Fatal(err)
	}
	want := k.Dump()

	tests := []struct {
		name   string
		break_ func()
		fixes  int
	}{
		{"route deleted", func() { _ = k.DeleteRoute(p.Routes[0]) }, 1},
		{"route changed", func() {
			_ = k.ReplaceRoute(Route{Dst: p.Routes[1].Dst, Gw: netip.MustParseAddr("192.168.10.99"), Dev: "eth0"})
		}, 1},
		{"neigh wrong MAC", func() { n := p.Neighs[0]; n.MAC = VTEPMAC(netip.MustParseAddr("1.2.3.4")); _ = k.SetNeigh(n) }, 1},
		{"stray neigh and fdb", func() {
			_ = k.SetNeigh(Neigh{Dev: DefaultDevice, IP: netip.MustParseAddr("10.244.77.0"), MAC: VTEPMAC(netip.MustParseAddr("1.2.3.4"))})
			_ = k.SetFDB(FDB{Dev: DefaultDevice, MAC: VTEPMAC(netip.MustParseAddr("1.2.3.4")), Dst: netip.MustParseAddr("1.2.3.4")})
		}, 2},
		{"fdb deleted", func() { _ = k.DeleteFDB(p.FDB[0]) }, 1},
		{"device MTU changed", func() { d, _ := k.VXLAN(DefaultDevice); d.MTU = 1400; _ = k.UpdateVXLAN(*d) }, 1},
		// Down drops the routes through the device, like the kernel.
		{"device down", func() { d, _ := k.VXLAN(DefaultDevice); d.Up = false; _ = k.UpdateVXLAN(*d) }, 2},
		// Deleted: device, neighbour, FDB entry and route all come back.
		{"device deleted", func() { _ = k.DeleteLink(DefaultDevice) }, 4},
		{"device recreated with another VNI", func() {
			d, _ := k.VXLAN(DefaultDevice)
			_ = k.DeleteLink(DefaultDevice)
			d.VNI = 42
			_ = k.CreateVXLAN(*d)
		}, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.break_()
			if k.Dump() == want {
				t.Fatal("breaking did not change the state")
			}
			changes, err := r.Apply(p)
			if err != nil {
				t.Fatal(err)
			}
			if got := k.Dump(); got != want {
				t.Fatalf("state after repair\n%s\nwant\n%s", got, want)
			}
			if len(changes) != tt.fixes {
				t.Errorf("changes = %q, want %d", changes, tt.fixes)
			}
		})
	}
}

func TestApplyReportsKernelErrors(t *testing.T) {
	// A missing underlay parent: the device cannot be made, and routes
	// through it fail; host-gw routes through a missing iface fail too.
	k := NewFakeKernel(map[string]netip.Prefix{})
	r := &Reconciler{Kernel: k, Device: DefaultDevice}
	_, err := r.Apply(Compute(config(BackendAuto), []*cluster.Node{self, node2, node4}))
	if err == nil {
		t.Fatal("want errors")
	}
	for _, want := range []string{"create link podnet.1", "replace route 10.244.4.0/24"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestFakeRefusesMTUTheParentCannotCarry(t *testing.T) {
	k := newFake()
	r := &Reconciler{Kernel: k, Device: DefaultDevice}
	c := config(BackendAuto)
	c.UnderlayMTU = 9000 // the plan believes in jumbo frames, eth0 has 1500
	if _, err := r.Apply(Compute(c, []*cluster.Node{self, node4})); err == nil || !strings.Contains(err.Error(), "mtu 8950") {
		t.Fatalf("err = %v, want the MTU refused", err)
	}
}

func TestPodMTU(t *testing.T) {
	for _, tt := range []struct {
		b    Backend
		want int
	}{{BackendAuto, 1450}, {BackendVXLAN, 1450}, {BackendHostGW, 1500}} {
		if got := config(tt.b).PodMTU(); got != tt.want {
			t.Errorf("%s: PodMTU = %d, want %d", tt.b, got, tt.want)
		}
	}
}

func TestVTEPMAC(t *testing.T) {
	m := VTEPMAC(netip.MustParseAddr("192.168.10.11"))
	if m.String() != "0e:70:c0:a8:0a:0b" {
		t.Errorf("VTEPMAC = %s", m)
	}
	if m[0]&1 != 0 || m[0]&2 == 0 {
		t.Errorf("VTEPMAC %s must be unicast and locally administered", m)
	}
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (run with -update after checking):\n%s", path, got)
	}
}

// TestTableChangeCostsTheSameAtAnySize: one Node added and removed
// allocates no more among 5,000 peers than among 50 (computing the plan
// again, as before the Table, allocated in proportion to the peers).
func TestTableChangeCostsTheSameAtAnySize(t *testing.T) {
	allocs := map[int]float64{}
	for _, n := range []int{50, 5000} {
		tab := NewTable(scaleConfig(BackendVXLAN), scalePeers(n))
		extra := scalePeers(n + 1)[n]
		allocs[n] = testing.AllocsPerRun(50, func() {
			if tab.Set(extra).Empty() || tab.Delete(extra.Name).Empty() {
				t.Fatal("no change")
			}
		})
	}
	if allocs[5000] > allocs[50]+1 {
		t.Errorf("allocations per add and remove: %.0f among 5,000 peers, %.0f among 50", allocs[5000], allocs[50])
	}
	t.Logf("allocations per add and remove: %v", allocs)
}

// TestIPv6Routes routes the IPv6 family of dual-stack Nodes: host-gw
// routes via the peers' IPv6 InternalIPs on the node's subnet, VXLAN with a
// /128 VTEP address and neighbours beyond it; the Nodes' IPv4 podCIDRs and
// addresses are not this table's, and a Node without an IPv6 podCIDR is
// skipped, named. The fake refuses a route whose gateway is of the other
// family, as the kernel does without RTA_VIA.
func TestIPv6Routes(t *testing.T) {
	dual := func(name, ip4, ip6, cidr4, cidr6 string) *cluster.Node {
		n := node(name, ip4, cidr4)
		if ip6 != "" {
			n.InternalIPs = append(n.InternalIPs, netip.MustParseAddr(ip6))
		}
		if cidr6 != "" {
			n.PodCIDRs = append(n.PodCIDRs, netip.MustParsePrefix(cidr6))
		}
		return n
	}
	cfg := Config{
		NodeName: "node1", Backend: BackendAuto, Family: ipfamily.IPv6,
		NodeIP:     netip.MustParseAddr("fd00:10::11"),
		NodeSubnet: netip.MustParsePrefix("fd00:10::/64"),
		Iface:      "eth0", UnderlayMTU: 1500,
		Device: DefaultDevice, VNI: DefaultVNI, Port: DefaultPort,
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	nodes := []*cluster.Node{
		dual("node1", "192.168.10.11", "fd00:10::11", "10.244.1.0/24", "fd00:244:1::/64"),
		dual("node2", "192.168.10.12", "fd00:10::12", "10.244.2.0/24", "fd00:244:2::/64"),
		dual("node4", "192.168.20.14", "fd00:20::14", "10.244.4.0/24", "fd00:244:4::/64"),
		dual("v4only", "192.168.10.15", "", "10.244.5.0/24", ""),
	}
	p := Compute(cfg, nodes)
	if p.PodCIDR != netip.MustParsePrefix("fd00:244:1::/64") {
		t.Errorf("plan podCIDR = %v", p.PodCIDR)
	}
	if p.Device == nil || p.Device.Addr != netip.MustParsePrefix("fd00:244:1::/128") || p.Device.Local != cfg.NodeIP {
		t.Fatalf("device = %+v", p.Device)
	}
	if len(p.Skipped) != 1 || !strings.Contains(p.Skipped[0], "v4only: no IPv6 podCIDR") {
		t.Errorf("skipped = %q", p.Skipped)
	}
	k := NewFakeKernel(map[string]netip.Prefix{"eth0": cfg.NodeSubnet})
	r := &Reconciler{Kernel: k, Device: DefaultDevice}
	if _, err := r.Apply(p); err != nil {
		t.Fatal(err)
	}
	dump := k.Dump()
	for _, want := range []string{
		"route fd00:244:2::/64 via fd00:10::12 dev eth0",
		"route fd00:244:4::/64 via fd00:244:4:: dev podnet.1 onlink",
		"neigh fd00:244:4:: lladdr " + VTEPMAC(netip.MustParseAddr("fd00:20::14")).String() + " dev podnet.1 permanent",
		"fdb " + VTEPMAC(netip.MustParseAddr("fd00:20::14")).String() + " dev podnet.1 dst fd00:20::14 self permanent",
		// Over an IPv6 underlay the outer header is 20 bytes longer.
		"mtu 1430",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("kernel lacks %q:\n%s", want, dump)
		}
	}
	if strings.Contains(dump, "10.244.") {
		t.Errorf("IPv4 entries in the IPv6 table:\n%s", dump)
	}
	if changes, err := r.Apply(p); err != nil || len(changes) != 0 {
		t.Errorf("second apply: %q, %v", changes, err)
	}
	tbl := NewTable(cfg, nodes)
	if got, want := tbl.Plan().String(), p.String(); got != want {
		t.Errorf("table plan\n%s\nwant\n%s", got, want)
	}
	err := k.ReplaceRoute(Route{Dst: netip.MustParsePrefix("fd00:244:9::/64"), Gw: netip.MustParseAddr("192.168.10.12"), Dev: "eth0"})
	if !errors.Is(err, syscall.EINVAL) {
		t.Errorf("route via a gateway of the other family: %v, want EINVAL", err)
	}
	cfg.NodeIP = netip.MustParseAddr("192.168.10.11")
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "not an IPv6 address") {
		t.Errorf("IPv4 node IP for the IPv6 family: %v", err)
	}
}

// TestDualStackSharesOneDevice: on a node whose underlay is IPv4 alone,
// IPv6 pods go over VXLAN to every peer (no IPv6 address to host-gw by),
// on the same device as IPv4's VXLAN peers: one MTU (1450, an IPv4
// underlay's), one FDB entry per peer whichever family wants it, and each
// family's reconciler leaves the entries the other wants. A second apply
// changes nothing, and a peer leaving takes its FDB entry only once
// neither family wants it.
func TestDualStackSharesOneDevice(t *testing.T) {
	node := func(name, ip, cidr4, cidr6 string) *cluster.Node {
		n := &cluster.Node{Name: name, InternalIPs: []netip.Addr{netip.MustParseAddr(ip)}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix(cidr4)}}
		if cidr6 != "" {
			n.PodCIDRs = append(n.PodCIDRs, netip.MustParsePrefix(cidr6))
		}
		return n
	}
	nodes := []*cluster.Node{
		node("node1", "192.168.10.11", "10.244.1.0/24", "fd00:244:1::/64"),
		node("node2", "192.168.10.12", "10.244.2.0/24", "fd00:244:2::/64"),
		node("node4", "192.168.20.14", "10.244.4.0/24", "fd00:244:4::/64"),
		node("v4pods", "192.168.10.15", "10.244.5.0/24", ""),
	}
	base := Config{NodeName: "node1", Backend: BackendAuto, UnderlayMTU: 1500, Device: DefaultDevice, VNI: DefaultVNI, Port: DefaultPort}
	c4 := base
	c4.Family, c4.NodeIP, c4.NodeSubnet, c4.Iface = ipfamily.IPv4, netip.MustParseAddr("192.168.10.11"), netip.MustParsePrefix("192.168.10.0/24"), "eth0"
	c6 := base
	c6.Family, c6.Underlay, c6.UnderlayIface = ipfamily.IPv6, c4.NodeIP, "eth0"
	for _, c := range []Config{c4, c6} {
		if err := c.Validate(); err != nil {
			t.Fatalf("%v: %v", c.Family, err)
		}
	}
	if c6.PodMTU() != 1450 {
		t.Errorf("IPv6 pods over an IPv4 underlay: MTU %d, want 1450", c6.PodMTU())
	}
	k := NewFakeKernel(map[string]netip.Prefix{"eth0": c4.NodeSubnet})
	t4, t6 := NewTable(c4, nodes), NewTable(c6, nodes)
	r4 := &Reconciler{Kernel: k.Family(ipfamily.IPv4), Device: DefaultDevice, SharedFDB: t6.HasFDB}
	r6 := &Reconciler{Kernel: k.Family(ipfamily.IPv6), Device: DefaultDevice, SharedFDB: t4.HasFDB}
	apply := func() int {
		t.Helper()
		c4, err4 := r4.Apply(t4.Plan())
		c6, err6 := r6.Apply(t6.Plan())
		if err := errors.Join(err4, err6); err != nil {
			t.Fatal(err)
		}
		return len(c4) + len(c6)
	}
	apply()
	mac2, mac4 := VTEPMAC(netip.MustParseAddr("192.168.10.12")), VTEPMAC(netip.MustParseAddr("192.168.20.14"))
	dump := k.Dump()
	for _, want := range []string{
		"route 10.244.2.0/24 via 192.168.10.12 dev eth0 proto 98",
		"route 10.244.4.0/24 via 10.244.4.0 dev podnet.1 onlink",
		"route fd00:244:2::/64 via fd00:244:2:: dev podnet.1 onlink",
		"route fd00:244:4::/64 via fd00:244:4:: dev podnet.1 onlink",
		"neigh fd00:244:2:: lladdr " + mac2.String(),
		"fdb " + mac2.String() + " dev podnet.1 dst 192.168.10.12 self permanent",
		"fdb " + mac4.String() + " dev podnet.1 dst 192.168.20.14 self permanent",
		"addr 10.244.1.0/32 dev podnet.1", "addr fd00:244:1::/128 dev podnet.1",
		"mtu 1450",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("kernel lacks %q:\n%s", want, dump)
		}
	}
	if strings.Contains(dump, "10.244.5.0/24 via 10.244.5.0") || strings.Count(dump, "fdb ") != 2 {
		t.Errorf("want v4pods by host-gw and one FDB entry per VXLAN peer:\n%s", dump)
	}
	if n := apply(); n != 0 {
		t.Errorf("second apply changed %d entries:\n%s", n, k.Dump())
	}
	// node4 leaves: the IPv4 table's delta first, while IPv6 still wants
	// its FDB entry, then IPv6's.
	gone := map[string]*cluster.Node{"node4": nil}
	if _, err := r4.Patch(t4.Update(gone)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(k.Dump(), "dst 192.168.20.14") {
		t.Errorf("IPv4's patch removed the FDB entry IPv6 still uses:\n%s", k.Dump())
	}
	if _, err := r6.Patch(t6.Update(gone)); err != nil {
		t.Fatal(err)
	}
	if dump := k.Dump(); strings.Contains(dump, "192.168.20.14") || strings.Contains(dump, "244:4") || strings.Contains(dump, "10.244.4.") {
		t.Errorf("node4 left entries behind:\n%s", dump)
	}
	if n := apply(); n != 0 {
		t.Errorf("apply after the patches changed %d entries:\n%s", n, k.Dump())
	}
}

// TestVTEPMACIPv6: nodes of one IPv6 underlay whose addresses share their
// last four bytes get different MACs (those bytes alone were the MAC);
// every MAC is unicast and locally administered, and IPv4's stay as
// earlier releases derive them.
func TestVTEPMACIPv6(t *testing.T) {
	a, b := VTEPMAC(netip.MustParseAddr("fd00:10:0:1::11")), VTEPMAC(netip.MustParseAddr("fd00:10:0:2::11"))
	if bytes.Equal(a, b) {
		t.Errorf("fd00:10:0:1::11 and fd00:10:0:2::11 share the MAC %s", a)
	}
	seen := map[string]string{}
	for i := range 2000 {
		ip := netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, 0, byte(i >> 8), byte(i), 15: 0x11})
		m := VTEPMAC(ip)
		if m[0]&1 != 0 || m[0]&2 == 0 || m[0] == 0x0e && m[1] == 0x70 {
			t.Fatalf("%s: MAC %s not unicast, not locally administered, or in IPv4's 0e:70 range", ip, m)
		}
		if other, dup := seen[m.String()]; dup {
			t.Fatalf("%s and %s share the MAC %s", ip, other, m)
		}
		seen[m.String()] = ip.String()
	}
	if m := VTEPMAC(netip.MustParseAddr("192.168.10.11")).String(); m != "0e:70:c0:a8:0a:0b" {
		t.Errorf("IPv4 VTEP MAC %s, want 0e:70:c0:a8:0a:0b as before", m)
	}
}

// TestSwitchBackendPerFamily applies a host-gw plan, then a VXLAN plan of
// the same peers, then host-gw again, in each family: every switch lands
// on the state a fresh node would hold. Over IPv6 the kernel refuses to
// replace a peer's host-gw route by the VXLAN one (the onlink gateway, the
// peer's VTEP address, lies inside the host-gw route's prefix, which
// points through the underlay: "Nexthop has invalid gateway or device
// mismatch"); the fake refuses it the same way.
func TestSwitchBackendPerFamily(t *testing.T) {
	for _, f := range ipfamily.All {
		t.Run(f.String(), func(t *testing.T) {
			cfg, peer := config(BackendHostGW), node("node2", "192.168.10.12", "10.244.2.0/24")
			self := node("node1", "192.168.10.11", "10.244.1.0/24")
			if f == ipfamily.IPv6 {
				cfg.Family, cfg.NodeIP, cfg.NodeSubnet = f, netip.MustParseAddr("fd00:10::11"), netip.MustParsePrefix("fd00:10::/64")
				peer = node("node2", "fd00:10::12", "fd00:244:2::/64")
				self = node("node1", "fd00:10::11", "fd00:244:1::/64")
			}
			k := NewFakeKernel(map[string]netip.Prefix{"eth0": cfg.NodeSubnet})
			r := &Reconciler{Kernel: k, Device: DefaultDevice}
			for i, b := range []Backend{BackendHostGW, BackendVXLAN, BackendHostGW, BackendVXLAN} {
				cfg.Backend = b
				p := Compute(cfg, []*cluster.Node{self, peer})
				if _, err := r.Apply(p); err != nil {
					t.Fatalf("step %d, %s: %v", i, b, err)
				}
				fresh := NewFakeKernel(map[string]netip.Prefix{"eth0": cfg.NodeSubnet})
				if _, err := (&Reconciler{Kernel: fresh, Device: DefaultDevice}).Apply(p); err != nil {
					t.Fatal(err)
				}
				if got, want := k.Dump(), fresh.Dump(); got != want {
					t.Errorf("step %d, %s: kernel\n%s\nwant\n%s", i, b, got, want)
				}
			}
		})
	}
}
