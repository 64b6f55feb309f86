package policy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/nftmsg"
	"github.com/podnet/podnet/dataplane/roottest"
)

// testNode is a node in network namespaces: pods on a bridge cbr0 with
// br_netfilter on (as proxyd sets it), and one host "far" behind a route,
// so both the bridged and the routed forward paths are crossed.
type testNode struct {
	t      testing.TB
	prefix string
	node   ns.NetNS
	pods   map[string]ns.NetNS // by namespace/name, and "far"
}

func run(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (n *testNode) netns(name string) ns.NetNS {
	full := fmt.Sprintf("%s-%s", n.prefix, name)
	run(n.t, "ip", "netns", "add", full)
	n.t.Cleanup(func() { exec.Command("ip", "netns", "del", full).Run() })
	h, err := ns.GetNS("/run/netns/" + full)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { h.Close() })
	return h
}

func (n *testNode) in(name string, cmds ...string) {
	n.t.Helper()
	for _, c := range cmds {
		run(n.t, append([]string{"ip", "netns", "exec", fmt.Sprintf("%s-%s", n.prefix, name)}, strings.Fields(c)...)...)
	}
}

// addPod plugs a pod (index i) into cbr0 with 10.244.1.i and fd00:10:244:1::i.
func (n *testNode) addPod(key string, i int) {
	h := n.netns(fmt.Sprintf("p%d", i))
	n.pods[key] = h
	n.in("node", fmt.Sprintf("ip link add veth%d type veth peer name eth0 netns %s-p%d", i, n.prefix, i),
		fmt.Sprintf("ip link set veth%d master cbr0 up", i))
	n.in(fmt.Sprintf("p%d", i), "ip link set lo up", "ip link set eth0 up",
		fmt.Sprintf("ip addr add 10.244.1.%d/24 dev eth0", i), fmt.Sprintf("ip -6 addr add fd00:10:244:1::%d/64 dev eth0 nodad", i),
		"ip route add default via 10.244.1.1", "ip -6 route add default via fd00:10:244:1::1")
}

func newTestNode(t testing.TB) *testNode {
	roottest.Require(t)
	roottest.Tool(t, "ip", "iproute2")
	n := &testNode{t: t, prefix: fmt.Sprintf("podnet-pol-%d", os.Getpid()), pods: make(map[string]ns.NetNS)}
	n.node = n.netns("node")
	// No duplicate address detection on the node's links, as podnet's
	// cbr0 has none: a tentative link-local address holds back the first
	// neighbour solicitation to a pod for a second.
	n.in("node", "ip link set lo up", "sysctl -qw net.ipv6.conf.default.accept_dad=0", "ip link add cbr0 type bridge", "ip link set cbr0 up",
		"ip addr add 10.244.1.1/24 dev cbr0", "ip -6 addr add fd00:10:244:1::1/64 dev cbr0 nodad",
		"sysctl -qw net.ipv4.ip_forward=1", "sysctl -qw net.ipv6.conf.all.forwarding=1")
	if _, err := os.Stat("/proc/sys/net/bridge/bridge-nf-call-iptables"); err != nil {
		roottest.Unavailable(t, "br_netfilter not loaded (modprobe br_netfilter)")
	}
	n.in("node", "sysctl -qw net.bridge.bridge-nf-call-iptables=1", "sysctl -qw net.bridge.bridge-nf-call-ip6tables=1")
	n.addPod("a/web", 2)
	n.addPod("b/client", 3)
	n.addPod("c/client", 4)
	n.pods["far"] = n.netns("far")
	n.in("node", fmt.Sprintf("ip link add far0 type veth peer name eth0 netns %s-far", n.prefix), "ip link set far0 up",
		"ip addr add 10.244.9.1/24 dev far0", "ip -6 addr add fd00:10:244:9::1/64 dev far0 nodad")
	n.in("far", "ip link set lo up", "ip link set eth0 up", "ip addr add 10.244.9.2/24 dev eth0",
		"ip -6 addr add fd00:10:244:9::2/64 dev eth0 nodad", "ip route add default via 10.244.9.1", "ip -6 route add default via fd00:10:244:9::1")
	return n
}

// serve runs TCP and UDP echo servers on port in a pod, both families.
func (n *testNode) serve(key string, port int) {
	err := n.pods[key].Do(func(ns.NetNS) error {
		l, err := net.Listen("tcp", fmt.Sprintf("[::]:%d", port))
		if err != nil {
			return err
		}
		n.t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(c, c); c.Close() }()
			}
		}()
		u, err := net.ListenPacket("udp", fmt.Sprintf("[::]:%d", port))
		if err != nil {
			return err
		}
		n.t.Cleanup(func() { u.Close() })
		go func() {
			buf := make([]byte, 100)
			for {
				k, from, err := u.ReadFrom(buf)
				if err != nil {
					return
				}
				u.WriteTo(buf[:k], from)
			}
		}()
		return nil
	})
	if err != nil {
		n.t.Fatal(err)
	}
}

// deniedWait is how long a connection gets before it counts as dropped: the
// namespaces answer in well under a millisecond, and a dropped SYN is
// retransmitted only after 1 s, so the wait sees one attempt.
const deniedWait = 700 * time.Millisecond

// allowedWait bounds the retries of a probe that should be answered.
const allowedWait = 5 * time.Second

// dial opens a connection from a pod to addr:port.
func (n *testNode) dial(from, network string, to netip.Addr, port int) (net.Conn, error) {
	var c net.Conn
	err := n.pods[from].Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout(network, netip.AddrPortFrom(to, uint16(port)).String(), deniedWait)
		return err
	})
	return c, err
}

// echo says whether a message over c comes back.
func echo(c net.Conn) bool {
	c.SetDeadline(time.Now().Add(deniedWait))
	if _, err := c.Write([]byte("ping")); err != nil {
		return false
	}
	buf := make([]byte, 4)
	_, err := io.ReadFull(c, buf)
	return err == nil && string(buf) == "ping"
}

// reach says whether a new connection (TCP) or flow (UDP) from a pod gets an
// answer.
func (n *testNode) reach(from, network string, to netip.Addr, port int) bool {
	c, err := n.dial(from, network, to, port)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return false
		}
		n.t.Fatalf("dial %s %s:%d from %s: %v", network, to, port, from, err)
	}
	defer c.Close()
	return echo(c)
}

type probe struct {
	from, network string
	to            string // an address of ips
	port          int
	want          bool
}

// expect checks each probe. A denied probe gets one attempt of deniedWait;
// an allowed one is retried for allowedWait, since a first contact over IPv6
// through the node was seen to go unanswered for longer than deniedWait
// (CI, once, before any policy; the cause is not known yet).
func (n *testNode) expect(step string, probes ...probe) {
	n.t.Helper()
	for _, p := range probes {
		to := netip.MustParseAddr(ips[p.to])
		got := n.reach(p.from, p.network, to, p.port)
		for start := time.Now(); p.want && !got && time.Since(start) < allowedWait; {
			got = n.reach(p.from, p.network, to, p.port)
		}
		if got != p.want {
			n.t.Errorf("%s: %s -> %s %s/%d: reached %v, want %v", step, p.from, p.to, p.network, p.port, got, p.want)
		}
	}
}

func (n *testNode) table() *Table {
	conn, err := nftables.New(nftables.WithNetNSFd(int(n.node.Fd())), nftmsg.Buffers())
	if err != nil {
		n.t.Fatal(err)
	}
	return NewTable(conn, Options{Families: ipfamily.All, LogGroup: 24})
}

// rootFixture is the fixture with the test node's addresses.
func rootFixture() ([]*cluster.Pod, []*cluster.Namespace) {
	pods, nss := fixture()
	addrs := map[string][]string{
		"a/web": {"10.244.1.2", "fd00:10:244:1::2"}, "b/client": {"10.244.1.3", "fd00:10:244:1::3"},
		"c/client": {"10.244.1.4", "fd00:10:244:1::4"}, "a/db": {"10.244.7.7", "fd00:10:244:7::7"},
	}
	for _, p := range pods {
		if a, ok := addrs[p.Key().String()]; ok {
			p.IPs = []netip.Addr{netip.MustParseAddr(a[0]), netip.MustParseAddr(a[1])}
		}
	}
	return pods, nss
}

func init() {
	for k, v := range map[string]string{
		"r/web": "10.244.1.2", "r/web6": "fd00:10:244:1::2", "r/b": "10.244.1.3", "r/b6": "fd00:10:244:1::3",
		"r/c": "10.244.1.4", "r/c6": "fd00:10:244:1::4", "r/far": "10.244.9.2", "r/far6": "fd00:10:244:9::2",
	} {
		ips[k] = v
	}
}

const webIn = `
metadata: {namespace: a, name: web-in}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: b}}, podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 80}, {protocol: UDP, port: dns}]
  - from: [{ipBlock: {cidr: 10.244.9.0/24}}, {ipBlock: {cidr: "fd00:10:244:9::/64"}}]
    ports: [{port: 80}]`

const bEgress = `
metadata: {namespace: b, name: out-to-web}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress: [{to: [{namespaceSelector: {}, podSelector: {matchLabels: {app: web}}}]}]`

// TestEnforceInNamespaces programs the table in a node's namespace and
// checks real packets, bridged and routed, both families: ingress by
// namespace and pod selectors, named UDP port and ipBlock; a connection
// open before the policy survives it; a namespace label change (an element
// update) lets a client in; an egress policy; counters read back; no
// policy lets everything through again.
func TestEnforceInNamespaces(t *testing.T) {
	n := newTestNode(t)
	for _, p := range []struct {
		key   string
		ports []int
	}{{"a/web", []int{80, 81, 53}}, {"c/client", []int{80}}, {"far", []int{80}}} {
		for _, port := range p.ports {
			n.serve(p.key, port)
		}
	}
	pods, nss := rootFixture()
	tbl := n.table()
	t.Cleanup(func() { tbl.Remove() })
	apply := func(nss []*cluster.Namespace, policies ...string) {
		t.Helper()
		prog := NewModel(pods, nss, mustPolicies(t, policies...)).Compile(onNode("node1"))
		if err := tbl.Apply(prog); err != nil {
			t.Fatal(err)
		}
	}
	apply(nss)
	n.expect("no policy", probe{"c/client", "tcp", "r/web", 80, true}, probe{"far", "tcp", "r/web6", 81, true})

	open, err := n.dial("c/client", "tcp", netip.MustParseAddr(ips["r/web"]), 80)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	apply(nss, webIn)
	n.expect("web-in",
		probe{"b/client", "tcp", "r/web", 80, true}, probe{"b/client", "tcp", "r/web6", 80, true},
		probe{"b/client", "udp", "r/web", 53, true}, probe{"b/client", "udp", "r/web6", 53, true},
		probe{"b/client", "tcp", "r/web", 81, false}, probe{"b/client", "udp", "r/web", 80, false},
		probe{"c/client", "tcp", "r/web", 80, false}, probe{"c/client", "tcp", "r/web6", 80, false},
		probe{"far", "tcp", "r/web", 80, true}, probe{"far", "tcp", "r/web6", 80, true}, probe{"far", "tcp", "r/web", 81, false},
		probe{"a/web", "tcp", "r/c", 80, true})
	if !echo(open) {
		t.Error("a connection open before web-in was cut by it")
	}

	id := tbl.applied[cluster.Key{Namespace: "a", Name: "web-in"}].id
	relabelled := []*cluster.Namespace{nss[0], nss[1], {Name: "c", Labels: map[string]string{"team": "b"}}}
	apply(relabelled, webIn)
	if got := tbl.applied[cluster.Key{Namespace: "a", Name: "web-in"}].id; got != id {
		t.Errorf("a namespace label change replaced the policy's rules (instance %d -> %d), want an element update", id, got)
	}
	n.expect("c labelled team=b", probe{"c/client", "tcp", "r/web", 80, true}, probe{"c/client", "tcp", "r/web6", 80, true})

	apply(relabelled, webIn, bEgress)
	n.expect("b egress to web only",
		probe{"b/client", "tcp", "r/web", 80, true}, probe{"b/client", "tcp", "r/c", 80, false},
		probe{"b/client", "tcp", "r/far6", 80, false}, probe{"c/client", "tcp", "r/web", 80, true})

	counts, err := tbl.Counters()
	if err != nil {
		t.Fatal(err)
	}
	web, eg := counts[cluster.Key{Namespace: "a", Name: "web-in"}], counts[cluster.Key{Namespace: "b", Name: "out-to-web"}]
	if web.Allowed == 0 || web.Dropped == 0 || eg.Allowed == 0 || eg.Dropped == 0 {
		t.Errorf("counters web-in %+v, out-to-web %+v: want allowed and dropped counted for both", web, eg)
	}

	apply(relabelled)
	n.expect("policies gone", probe{"far", "tcp", "r/web", 81, true}, probe{"b/client", "tcp", "r/c", 80, true})
	if counts, err := tbl.Counters(); err != nil || len(counts) != 0 {
		t.Errorf("counters after the policies went: %v, %v; want none", counts, err)
	}
}
