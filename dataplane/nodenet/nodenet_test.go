package nodenet

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/health"
	"github.com/podnet/podnet/dataplane/hostnet"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/link"
	"github.com/podnet/podnet/dataplane/nodeconfig"
	"github.com/podnet/podnet/dataplane/routing"
	"github.com/podnet/podnet/dataplane/runner"
)

type fakeSysctl map[string]string

func (f fakeSysctl) Get(name string) (string, error) { return f[name], nil }
func (f fakeSysctl) Set(name, v string) error        { f[name] = v; return nil }

// newTestNodeNet wires a Network to fakes: the kernel, iptables and
// sysctls of node1 at 192.168.10.11/24 on eth0 (MTU 1500).
func newTestNodeNet(t *testing.T, backend routing.Backend, k *routing.FakeKernel, ipt *hostnet.FakeIPTables) (*Network, *cluster.Store) {
	t.Helper()
	store := cluster.NewStore()
	o := Config{
		NodeName: "node1", ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		Backend: backend, VXLANVNI: 1, VXLANPort: 8472, NodeConfigPath: filepath.Join(t.TempDir(), "node.json"),
		Masquerade: true, SyncPeriod: 30 * time.Second, MinSyncPeriod: time.Second,
	}
	n := &Network{
		o:      o,
		clock:  runner.SystemClock,
		log:    slog.New(slog.DiscardHandler),
		store:  store,
		health: health.NewChecker(),
		underlay: func(ip netip.Addr) (underlay, error) {
			if ip != netip.MustParseAddr("192.168.10.11") {
				return underlay{}, fmt.Errorf("no interface holds %s", ip)
			}
			return underlay{iface: "eth0", subnet: netip.MustParsePrefix("192.168.10.0/24"), mtu: 1500}, nil
		},
		fams:    []*family{newFamily(o.ClusterCIDRs[0], k, ipt)},
		sysctl:  fakeSysctl{"net/ipv4/ip_forward": "0", "net/bridge/bridge-nf-call-iptables": "0"},
		mod:     func(string) error { return nil },
		metrics: newMetrics(prometheus.NewRegistry()),
	}
	n.followNodes(func() {})
	return n, store
}

func testNode(name, ip, cidr string) *cluster.Node {
	n := &cluster.Node{Name: name, InternalIPs: []netip.Addr{netip.MustParseAddr(ip)}}
	if cidr != "" {
		n.PodCIDRs = []netip.Prefix{netip.MustParsePrefix(cidr)}
	}
	return n
}

func TestSyncOnce(t *testing.T) {
	k := routing.NewFakeKernel(map[string]netip.Prefix{"eth0": netip.MustParsePrefix("192.168.10.0/24")})
	ipt := hostnet.NewFakeIPTables()
	n, store := newTestNodeNet(t, routing.BackendAuto, k, ipt)

	// Not in the state yet: not ready, and nothing written.
	if _, err := n.syncOnce(true); err == nil || !strings.Contains(err.Error(), "not in the cluster state") {
		t.Fatalf("err = %v", err)
	}
	// Present, no podCIDR: routes to peers already, but not ready and no
	// node config, with a reason that says so.
	store.Upsert(testNode("node1", "192.168.10.11", ""))
	store.Upsert(testNode("node2", "192.168.10.12", "10.244.2.0/24"))
	store.Upsert(testNode("node4", "192.168.20.11", "10.244.4.0/24"))
	_, err := n.syncOnce(true)
	if err == nil || !strings.Contains(err.Error(), `"node1" has no IPv4 podCIDR in spec.podCIDRs yet`) {
		t.Fatalf("err = %v", err)
	}
	if _, err := nodeconfig.Read(n.o.NodeConfigPath); !errors.Is(err, nodeconfig.ErrNotFound) {
		t.Errorf("node config written without a podCIDR: %v", err)
	}

	// The podCIDR arrives: ready, node config with the VXLAN MTU, sysctls
	// on, chains in place.
	store.Upsert(testNode("node1", "192.168.10.11", "10.244.1.0/24"))
	if _, err := n.syncOnce(true); err != nil {
		t.Fatal(err)
	}
	cfg, err := nodeconfig.Read(n.o.NodeConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	if want := (nodeconfig.Config{PodCIDR: netip.MustParsePrefix("10.244.1.0/24"), ClusterCIDR: n.o.ClusterCIDRs[0], MTU: 1450}); !reflect.DeepEqual(cfg, want) {
		t.Errorf("node config = %+v, want %+v", cfg, want)
	}
	if s := n.sysctl.(fakeSysctl); s["net/ipv4/ip_forward"] != "1" || s["net/bridge/bridge-nf-call-iptables"] != "1" {
		t.Errorf("sysctls = %v", s)
	}
	dump := k.Dump()
	for _, want := range []string{
		"route 10.244.2.0/24 via 192.168.10.12 dev eth0",
		"route 10.244.4.0/24 via 10.244.4.0 dev podnet.1 onlink",
		"fdb 0e:70:c0:a8:14:0b dev podnet.1 dst 192.168.20.11",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("kernel lacks %q:\n%s", want, dump)
		}
	}
	if !strings.Contains(ipt.Dump(), "MASQUERADE --random-fully") {
		t.Errorf("no masquerade rule:\n%s", ipt.Dump())
	}

	// A second agent over the same kernel (a restart) changes nothing.
	mutations, writes := k.Mutations, ipt.Writes
	n2, store2 := newTestNodeNet(t, routing.BackendAuto, k, ipt)
	n2.o.NodeConfigPath = n.o.NodeConfigPath
	for _, node := range store.Nodes() {
		store2.Upsert(node)
	}
	if _, err := n2.syncOnce(true); err != nil {
		t.Fatal(err)
	}
	if k.Mutations != mutations || ipt.Writes != writes {
		t.Errorf("restart changed the kernel: %d netlink and %d iptables changes", k.Mutations-mutations, ipt.Writes-writes)
	}

	// A deleted peer takes its route, neighbour and FDB entry with it.
	store.Delete(cluster.KindNode, cluster.Key{Name: "node4"})
	if _, err := n.syncOnce(true); err != nil {
		t.Fatal(err)
	}
	if d := k.Dump(); strings.Contains(d, "10.244.4.0") || strings.Contains(d, "192.168.20.11") {
		t.Errorf("node4's entries left:\n%s", d)
	}
}

func TestSyncOnceHostGWWritesUnderlayMTU(t *testing.T) {
	k := routing.NewFakeKernel(map[string]netip.Prefix{"eth0": netip.MustParsePrefix("192.168.10.0/24")})
	n, store := newTestNodeNet(t, routing.BackendHostGW, k, hostnet.NewFakeIPTables())
	store.Upsert(testNode("node1", "192.168.10.11", "10.244.1.0/24"))
	if _, err := n.syncOnce(true); err != nil {
		t.Fatal(err)
	}
	cfg, err := nodeconfig.Read(n.o.NodeConfigPath)
	if err != nil || cfg.MTU != 1500 {
		t.Errorf("node config %+v, %v: want MTU 1500", cfg, err)
	}
	if strings.Contains(k.Dump(), "podnet.1") {
		t.Errorf("host-gw made a VXLAN device:\n%s", k.Dump())
	}
}

// TestNodeChangeIsIncremental: a Node added changes only its own entries
// and reads nothing back from the kernel or iptables; what changed behind
// podnet's back is repaired by the next full sync (netlink reported it).
func TestNodeChangeIsIncremental(t *testing.T) {
	k := routing.NewFakeKernel(map[string]netip.Prefix{"eth0": netip.MustParsePrefix("192.168.10.0/24")})
	ipt := hostnet.NewFakeIPTables()
	n, store := newTestNodeNet(t, routing.BackendAuto, k, ipt)
	store.Upsert(testNode("node1", "192.168.10.11", "10.244.1.0/24"))
	store.Upsert(testNode("node2", "192.168.10.12", "10.244.2.0/24"))
	store.Upsert(testNode("node4", "192.168.20.11", "10.244.4.0/24"))
	n.sync()
	if n.lastProblem != "" {
		t.Fatal(n.lastProblem)
	}
	node2 := routing.Route{Dst: netip.MustParsePrefix("10.244.2.0/24"), Gw: netip.MustParseAddr("192.168.10.12"), Dev: "eth0"}
	if err := k.DeleteRoute(node2); err != nil {
		t.Fatal(err)
	}
	delete(ipt.Chains, "nat/"+hostnet.ChainPostrouting)

	store.Upsert(testNode("node3", "192.168.10.13", "10.244.3.0/24"))
	mutations := k.Mutations
	n.sync()
	if k.Mutations != mutations+1 || !strings.Contains(k.Dump(), "route 10.244.3.0/24 via 192.168.10.13 dev eth0") {
		t.Errorf("node3 added: %d changes, kernel:\n%s", k.Mutations-mutations, k.Dump())
	}
	if strings.Contains(k.Dump(), "10.244.2.0/24") || ipt.Chains["nat/"+hostnet.ChainPostrouting] != nil {
		t.Errorf("a Node change compared everything with the kernel:\n%s\n%s", k.Dump(), ipt.Dump())
	}

	n.needFull.Store(true)
	n.sync()
	if !strings.Contains(k.Dump(), "route 10.244.2.0/24 via 192.168.10.12 dev eth0") || ipt.Chains["nat/"+hostnet.ChainPostrouting] == nil {
		t.Errorf("the full sync did not repair:\n%s\n%s", k.Dump(), ipt.Dump())
	}
}

func TestFindUnderlay(t *testing.T) {
	links := []link.Interface{
		{Name: "lo", MTU: 65536, Addrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8")}},
		{Name: "eth0", MTU: 9000, Addrs: []netip.Prefix{netip.MustParsePrefix("10.0.0.5/16"), netip.MustParsePrefix("192.168.10.11/24")}},
	}
	ip := netip.MustParseAddr("192.168.10.11")
	u, err := findUnderlay(links, "", ip)
	if err != nil || u != (underlay{iface: "eth0", subnet: netip.MustParsePrefix("192.168.10.0/24"), mtu: 9000}) {
		t.Errorf("findUnderlay = %+v, %v", u, err)
	}
	if _, err := findUnderlay(links, "lo", ip); err == nil || !strings.Contains(err.Error(), "--iface lo does not hold") {
		t.Errorf("wrong --iface: err = %v", err)
	}
	if _, err := findUnderlay(links, "", netip.MustParseAddr("192.168.10.99")); err == nil || !strings.Contains(err.Error(), "set --iface") {
		t.Errorf("no interface: err = %v", err)
	}
}

// TestSyncOnceDualStack: a dual-stack node whose underlay is IPv4 alone:
// node.json holds both podCIDRs (podCIDR the IPv4 one) and the MTU of an
// IPv4 underlay's VXLAN; IPv6 pods reach every peer over the one VXLAN
// device; ip6tables masquerades the IPv6 cluster CIDR; IPv6 forwarding
// and br_netfilter's IPv6 hook are on. A restart changes nothing; a peer
// leaving incrementally takes both families' entries and its one FDB
// entry.
func TestSyncOnceDualStack(t *testing.T) {
	k := routing.NewFakeKernel(map[string]netip.Prefix{"eth0": netip.MustParsePrefix("192.168.10.0/24")})
	ipt4, ipt6 := hostnet.NewFakeIPTables(), hostnet.NewFakeIPTables()
	c4, c6 := netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")
	newNet := func() (*Network, *cluster.Store) {
		n, store := newTestNodeNet(t, routing.BackendAuto, k, ipt4)
		n.o.ClusterCIDRs = []netip.Prefix{c4, c6}
		n.fams = []*family{newFamily(c4, k.Family(ipfamily.IPv4), ipt4), newFamily(c6, k.Family(ipfamily.IPv6), ipt6)}
		linkFamilies(n.fams)
		n.sysctl = fakeSysctl{"net/ipv4/ip_forward": "0", "net/bridge/bridge-nf-call-iptables": "0",
			"net/ipv6/conf/all/forwarding": "0", "net/bridge/bridge-nf-call-ip6tables": "0"}
		return n, store
	}
	n, store := newNet()
	dual := func(name, ip, i string) *cluster.Node {
		nd := testNode(name, ip, "10.244."+i+".0/24")
		nd.PodCIDRs = append(nd.PodCIDRs, netip.MustParsePrefix("fd00:10:244:"+i+"::/64"))
		return nd
	}
	for _, nd := range []*cluster.Node{dual("node1", "192.168.10.11", "1"), dual("node2", "192.168.10.12", "2"), dual("node4", "192.168.20.11", "4")} {
		store.Upsert(nd)
	}
	if _, err := n.syncOnce(true); err != nil {
		t.Fatal(err)
	}
	cfg, err := nodeconfig.Read(n.o.NodeConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PodCIDR != netip.MustParsePrefix("10.244.1.0/24") || fmt.Sprint(cfg.Pods()) != "[10.244.1.0/24 fd00:10:244:1::/64]" ||
		fmt.Sprint(cfg.Clusters()) != "[10.244.0.0/16 fd00:10:244::/56]" || cfg.MTU != 1450 {
		t.Errorf("node config = %+v", cfg)
	}
	if s := n.sysctl.(fakeSysctl); s["net/ipv6/conf/all/forwarding"] != "1" || s["net/bridge/bridge-nf-call-ip6tables"] != "1" || s["net/ipv4/ip_forward"] != "1" {
		t.Errorf("sysctls = %v", s)
	}
	mac2 := routing.VTEPMAC(netip.MustParseAddr("192.168.10.12")).String()
	for _, want := range []string{
		"route 10.244.2.0/24 via 192.168.10.12 dev eth0",
		"route fd00:10:244:2::/64 via fd00:10:244:2:: dev podnet.1 onlink",
		"route fd00:10:244:4::/64 via fd00:10:244:4:: dev podnet.1 onlink",
		"fdb " + mac2 + " dev podnet.1 dst 192.168.10.12",
		"addr fd00:10:244:1::/128 dev podnet.1",
	} {
		if !strings.Contains(k.Dump(), want) {
			t.Errorf("kernel lacks %q:\n%s", want, k.Dump())
		}
	}
	if d := ipt6.Dump(); !strings.Contains(d, "-s fd00:10:244::/56 ! -d ff00::/8") || strings.Contains(d, "10.244.") {
		t.Errorf("ip6tables:\n%s", d)
	}
	if st := n.Report(); fmt.Sprint(st.PodCIDRs) != "[10.244.1.0/24 fd00:10:244:1::/64]" || len(st.Peers) != 4 {
		t.Errorf("status: podCIDRs %v, %d peers (want two per family)", st.PodCIDRs, len(st.Peers))
	}

	mutations := k.Mutations
	n2, store2 := newNet()
	n2.o.NodeConfigPath = n.o.NodeConfigPath
	for _, node := range store.Nodes() {
		store2.Upsert(node)
	}
	if _, err := n2.syncOnce(true); err != nil {
		t.Fatal(err)
	}
	if k.Mutations != mutations {
		t.Errorf("restart changed the kernel %d times:\n%s", k.Mutations-mutations, k.Dump())
	}

	store.Delete(cluster.KindNode, cluster.Key{Name: "node2"})
	if changes, err := n.syncOnce(false); err != nil || changes != 4 {
		t.Errorf("node2 leaving: %d changes (%v), want 4: its IPv4 route (host-gw), its IPv6 route and neighbour, its FDB entry", changes, err)
	}
	if d := k.Dump(); strings.Contains(d, "192.168.10.12") || strings.Contains(d, "244:2") || strings.Contains(d, "10.244.2.") {
		t.Errorf("node2's entries left:\n%s", d)
	}
}
