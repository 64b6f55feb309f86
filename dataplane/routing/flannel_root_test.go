package routing

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netns"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/roottest"
)

// TestFlannelInteropRealKernel: a podnet node and a flannel node, two
// namespaces on one segment, reach each other's pod subnets over VXLAN.
// The flannel node is set up as flannel's vxlan backend does (flannel.1,
// VNI 1, port 8472, its own random MAC, its podCIDR's network address as
// VTEP address; the route, neighbour and FDB entry for the podnet node
// from the annotations podnet writes, cluster.FlannelAnnotations); the
// podnet node applies the plan computed from the flannel node's
// annotations. A TCP connection from node1's bridge address to node2's
// echoes, which takes both directions.
func TestFlannelInteropRealKernel(t *testing.T) {
	roottest.Require(t)
	id := fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	a, b := "podnet-fa-"+id, "podnet-fb-"+id
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
		return string(out)
	}
	for _, n := range []string{a, b} {
		run("ip", "netns", "add", n)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n).Run() })
	}
	run("ip", "link", "add", "eth0", "netns", a, "type", "veth", "peer", "name", "eth0", "netns", b)
	for _, c := range [][]string{
		{a, "addr", "add", "192.168.10.11/24", "dev", "eth0"}, {a, "link", "set", "eth0", "up"}, {a, "link", "set", "lo", "up"},
		{a, "link", "add", "cbr0", "type", "bridge"}, {a, "addr", "add", "10.244.1.1/24", "dev", "cbr0"}, {a, "link", "set", "cbr0", "up"},
		{b, "addr", "add", "192.168.10.12/24", "dev", "eth0"}, {b, "link", "set", "eth0", "up"}, {b, "link", "set", "lo", "up"},
		{b, "link", "add", "cni0", "type", "bridge"}, {b, "addr", "add", "10.244.2.1/24", "dev", "cni0"}, {b, "link", "set", "cni0", "up"},
		// flannel's vxlan backend on node2
		{b, "link", "add", "flannel.1", "type", "vxlan", "id", "1", "local", "192.168.10.12", "dev", "eth0", "dstport", "8472", "nolearning"},
		{b, "addr", "add", "10.244.2.0/32", "dev", "flannel.1"}, {b, "link", "set", "flannel.1", "up"},
	} {
		run(append([]string{"ip", "-n"}, c...)...)
	}
	flannelMAC := strings.Fields(strings.SplitN(run("ip", "-n", b, "-o", "link", "show", "flannel.1"), "link/ether ", 2)[1])[0]

	// node2's annotations, as flannel writes them; node1's, as podnet does.
	node2 := node("node2", "192.168.10.12", "10.244.2.0/24")
	node2.Flannel = cluster.ParseFlannel(map[string]string{
		cluster.FlannelSubnetManaged: "true", cluster.FlannelBackendType: "vxlan",
		cluster.FlannelBackendData: `{"VNI":1,"VtepMAC":"` + flannelMAC + `"}`, cluster.FlannelPublicIP: "192.168.10.12",
	})
	node1IP := netip.MustParseAddr("192.168.10.11")
	node1 := node("node1", "192.168.10.11", "10.244.1.0/24")
	mine := cluster.ParseFlannel(cluster.FlannelAnnotations(1, VTEPMAC(node1IP), node1IP))

	// flannel on node2 programs node1 from node1's annotations.
	vtep1 := VTEPAddr(node1.PodCIDRs[0]).String()
	run("ip", "-n", b, "route", "add", "10.244.1.0/24", "via", vtep1, "dev", "flannel.1", "onlink")
	run("ip", "-n", b, "neigh", "add", vtep1, "lladdr", mine.VTEPMAC.String(), "dev", "flannel.1", "nud", "permanent")
	run("bridge", "-n", b, "fdb", "add", mine.VTEPMAC.String(), "dev", "flannel.1", "dst", mine.PublicIP.String(), "self", "permanent")

	// podnet on node1 programs node2 from flannel's annotations.
	nsh, err := netns.GetFromName(a)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	k := newTestKernel(t, nsh)
	r := &Reconciler{Kernel: k, Device: DefaultDevice}
	plan := Compute(config(BackendAuto), []*cluster.Node{node1, node2})
	if _, err := r.Apply(plan); err != nil {
		t.Fatalf("apply %s: %v", plan, err)
	}
	if fdb := run("bridge", "-n", a, "fdb", "show", "dev", DefaultDevice); !strings.Contains(fdb, flannelMAC+" dst 192.168.10.12") {
		t.Errorf("podnet.1's FDB lacks flannel's MAC:\n%s", fdb)
	}
	if _, err := net.ParseMAC(flannelMAC); err != nil || flannelMAC == VTEPMAC(netip.MustParseAddr("192.168.10.12")).String() {
		t.Fatalf("flannel.1's MAC %q: want a random one, not podnet's derivation", flannelMAC)
	}
	echoAcross(t, "/run/netns/"+b, "/run/netns/"+a, "10.244.2.1:7000", "10.244.1.1:0")
}

// echoAcross listens on addr in namespace srv, dials it from local in
// namespace cli, and checks one line comes back.
func echoAcross(t *testing.T, srv, cli, addr, local string) {
	t.Helper()
	sns, err := ns.GetNS(srv)
	if err != nil {
		t.Fatal(err)
	}
	defer sns.Close()
	cns, err := ns.GetNS(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer cns.Close()
	var ln net.Listener
	if err := sns.Do(func(ns.NetNS) error { ln, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		l, _ := bufio.NewReader(c).ReadString('\n')
		_, _ = c.Write([]byte(l))
	}()
	var c net.Conn
	err = cns.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(local))}
		c, err = d.Dial("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, local, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("across\n")); err != nil {
		t.Fatal(err)
	}
	if l, err := bufio.NewReader(c).ReadString('\n'); err != nil || l != "across\n" {
		t.Fatalf("echo: %q, %v", l, err)
	}
}
