package nftables_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/conntrack"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/nftables"
	"github.com/podnet/podnet/dataplane/proxy/proxytest"
	"github.com/podnet/podnet/dataplane/roottest"
)

// kernelOf is the Netlink Kernel of a namespace.
func kernelOf(t *testing.T, n ns.NetNS) nftables.Netlink {
	t.Helper()
	return nftables.Netlink{NetNS: int(n.Fd())}
}

// sameAsKernel compares the kernel's table with what Generate says: every
// set with its elements, every chain with its number of rules.
func sameAsKernel(t *testing.T, k nftables.Netlink, want *nftables.Table) {
	t.Helper()
	got, err := k.Read(want.Family)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range want.Sets {
		if s.Timeout > 0 {
			s.Elems = nil
			if g := got.Sets[name]; g != nil {
				g.Elems = nil
			}
		}
	}
	for _, c := range want.Chains {
		c.Rules = make([]nftables.Rule, len(c.Rules))
	}
	if g, w := got.String(), want.String(); g != w {
		t.Errorf("the kernel's table differs from the one meant:\n%s", proxytest.Diff(w, g))
	}
}

// TestRealKernelTable programs the scenario (every kind of Service) into
// the kernel of a namespace, reads it back, moves through partial syncs
// and a restart, and deletes the table.
func TestRealKernelTable(t *testing.T) {
	roottest.Require(t)
	l := proxytest.NewNetnsLab(t, "tbl")
	k := kernelOf(t, l.Node)
	p := nftables.NewProxier(defaultCfg, k)
	if _, err := p.Sync(proxytest.Scenario(), nil, true); err != nil {
		t.Fatalf("full sync: %v", err)
	}
	sameAsKernel(t, k, defaultCfg.Generate(proxytest.Scenario()))
	ms := mutations()
	for i, m := range []int{1, 3, 2, 4, 5, 6, 0, 7, 1} {
		if _, err := p.Sync(ms[m](), nil, false); err != nil {
			t.Fatalf("partial sync %d: %v", i, err)
		}
		sameAsKernel(t, k, defaultCfg.Generate(ms[m]()))
	}
	// A restart finds the table and rewrites it in one transaction.
	p = nftables.NewProxier(defaultCfg, k)
	if _, err := p.Sync(proxytest.Scenario(), nil, true); err != nil {
		t.Fatalf("full sync after a restart: %v", err)
	}
	sameAsKernel(t, k, defaultCfg.Generate(proxytest.Scenario()))
	// IPv6 beside it, in the same table.
	cfg6 := nftables.Config{Family: ipfamily.IPv6, ClusterCIDR: netip.MustParsePrefix("fd00:10:244::/56")}
	web6 := &cluster.Service{Namespace: "default", Name: "web", Type: cluster.ServiceTypeNodePort,
		ClusterIPs: []netip.Addr{proxytest.A("fd00:10:96::20")}, Ports: []cluster.ServicePort{proxytest.TCP(80, 30080)}, SessionAffinityTimeout: time.Minute}
	ports6 := proxytest.WorldOf(ipfamily.IPv6, web6, proxytest.Slice(web6, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)},
		proxytest.EP(proxytest.A("fd00:10:244:1::5"), proxytest.NodeName, true), proxytest.EP(proxytest.A("fd00:10:244:2::7"), "node-b", true)))
	p6 := nftables.NewProxier(cfg6, k)
	if _, err := p6.Sync(ports6, nil, true); err != nil {
		t.Fatalf("IPv6 full sync: %v", err)
	}
	sameAsKernel(t, k, cfg6.Generate(ports6))
	sameAsKernel(t, k, defaultCfg.Generate(proxytest.Scenario()))
	if err := k.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got, err := k.Read(ipfamily.IPv4); err != nil || len(got.Chains)+len(got.Sets) != 0 {
		t.Errorf("after cleanup: %v, %v", got, err)
	}
	if err := k.Cleanup(); err != nil {
		t.Errorf("cleanup without a table: %v", err)
	}
}

// TestRealKernelTraffic sends connections through the table in a
// namespace: a pod and the node reach a ClusterIP (the node masqueraded),
// a Service without endpoints refuses at once, a partial sync moves the
// Service to another port, a NodePort answers from outside.
func TestRealKernelTraffic(t *testing.T) {
	roottest.Require(t)
	l := proxytest.NewNetnsLab(t, "trf")
	l.Serve(t, "10.244.1.5:8080")
	l.Serve(t, "10.244.1.5:8081")
	k := kernelOf(t, l.Node)
	web := proxytest.Svc("web", "10.96.0.20", []cluster.ServicePort{proxytest.TCP(80, 30080)}, func(s *cluster.Service) { s.Type = cluster.ServiceTypeNodePort })
	empty := proxytest.Svc("empty", "10.96.0.30", []cluster.ServicePort{proxytest.TCP(80, 0)})
	server := proxytest.EP(proxytest.A("10.244.1.5"), "node-b", true)
	ports := proxytest.World(web, proxytest.Slice(web, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, server), empty)
	p := nftables.NewProxier(defaultCfg, k)
	if _, err := p.Sync(ports, nil, true); err != nil {
		t.Fatal(err)
	}
	got, err := proxytest.Dial(l.Client, "10.96.0.20:80")
	if err != nil || !strings.HasPrefix(got, "10.244.2.5:") || !strings.HasSuffix(got, "via 10.244.1.5:8080") {
		t.Fatalf("pod → ClusterIP: %q, %v; want the endpoint to see the pod's own address", got, err)
	}
	got, err = proxytest.Dial(l.Node, "10.96.0.20:80")
	if err != nil || !strings.HasPrefix(got, "10.244.1.1:") {
		t.Errorf("node → ClusterIP: %q, %v; want masqueraded to the node's address", got, err)
	}
	got, err = proxytest.Dial(l.Client, "192.168.10.11:30080")
	if err != nil || !strings.HasPrefix(got, "10.244.1.1:") {
		t.Errorf("pod → NodePort: %q, %v; want masqueraded (policy Cluster)", got, err)
	}
	start := time.Now()
	_, err = proxytest.Dial(l.Client, "10.96.0.30:80")
	if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
		t.Errorf("Service without endpoints: %v after %v; want connection refused within 1s", err, time.Since(start))
	}
	ports = proxytest.World(web, proxytest.Slice(web, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8081)}, server), empty)
	if _, err := p.Sync(ports, nil, false); err != nil {
		t.Fatal(err)
	}
	if got, err := proxytest.Dial(l.Client, "10.96.0.20:80"); err != nil || !strings.HasSuffix(got, "via 10.244.1.5:8081") {
		t.Errorf("after a partial sync: %q, %v", got, err)
	}
	// Sticky: every connection of one client lands where the first did.
	sticky := proxytest.Svc("sticky", "10.96.0.90", []cluster.ServicePort{proxytest.TCP(80, 0)}, func(s *cluster.Service) { s.SessionAffinityTimeout = time.Hour })
	// A second slice of the Service: the server's other port, so the
	// Service has two endpoints to choose from.
	sticky2 := proxytest.Slice(sticky, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8081)}, server)
	sticky2.Name = "sticky-def"
	ports = proxytest.World(web, proxytest.Slice(web, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8081)}, server), empty,
		sticky, proxytest.Slice(sticky, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, server),
		sticky2)
	if _, err := p.Sync(ports, nil, false); err != nil {
		t.Fatal(err)
	}
	var seen []string
	for range 8 {
		got, err := proxytest.Dial(l.Client, "10.96.0.90:80")
		if err != nil {
			t.Fatalf("sticky Service: %v (the endpoint that answers is the one affinity chose)", err)
		}
		if !slices.Contains(seen, got[strings.Index(got, "via"):]) {
			seen = append(seen, got[strings.Index(got, "via"):])
		}
	}
	if len(seen) != 1 {
		t.Errorf("one client reached %v, want one endpoint", seen)
	}
}

// TestRealKernelUDPFlowMoves: a UDP flow DNATed through the table moves
// to the new endpoint once its conntrack entry is deleted, as the proxy
// does after a sync.
func TestRealKernelUDPFlowMoves(t *testing.T) {
	roottest.Require(t)
	l := proxytest.NewNetnsLab(t, "udp")
	for _, port := range []string{"5353", "5354"} {
		var pc net.PacketConn
		if err := l.Server.Do(func(ns.NetNS) error {
			var err error
			pc, err = net.ListenPacket("udp", "10.244.1.5:"+port)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 64)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo([]byte(port), from)
			}
		}()
	}
	k := kernelOf(t, l.Node)
	dns := proxytest.Svc("dns", "10.96.0.10", []cluster.ServicePort{proxytest.Port("dns", cluster.UDP, 53)})
	server := proxytest.EP(proxytest.A("10.244.1.5"), "node-b", true)
	p := nftables.NewProxier(defaultCfg, k)
	if _, err := p.Sync(proxytest.World(dns, proxytest.Slice(dns, []cluster.EndpointPort{proxytest.EPPort("dns", cluster.UDP, 5353)}, server)), nil, true); err != nil {
		t.Fatal(err)
	}
	var conn net.Conn
	if err := l.Client.Do(func(ns.NetNS) error {
		var err error
		conn, err = net.Dial("udp", "10.96.0.10:53")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func() string {
		buf := make([]byte, 64)
		conn.Write([]byte("q"))
		conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := conn.Read(buf)
		if err != nil {
			return ""
		}
		return string(buf[:n])
	}
	if got := ask(); got != "5353" {
		t.Fatalf("before: %q", got)
	}
	if _, err := p.Sync(proxytest.World(dns, proxytest.Slice(dns, []cluster.EndpointPort{proxytest.EPPort("dns", cluster.UDP, 5354)}, server)), nil, false); err != nil {
		t.Fatal(err)
	}
	if got := ask(); got != "5353" {
		t.Fatalf("with the conntrack entry still there: %q, want the old endpoint", got)
	}
	if err := l.Node.Do(func(ns.NetNS) error {
		_, err := conntrack.Delete(conntrack.Filter{Protocol: "udp", OrigDst: proxytest.A("10.96.0.10"), OrigDstPort: 53})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got := ask(); got != "5354" {
		t.Errorf("after the entry's deletion: %q, want the new endpoint", got)
	}
}

// TestRealKernelAffinityKeptWhenAnotherEndpointLeaves: a client stays with
// its endpoint when another endpoint of the Service leaves (five rounds,
// each taking away an endpoint the client does not use, then bringing it
// back); when its own endpoint leaves, it moves to another one and stays
// there. Flushing the Service's clients on every departure, as the layout
// did before, passes a round by chance with 1 in 3 at most.
func TestRealKernelAffinityKeptWhenAnotherEndpointLeaves(t *testing.T) {
	roottest.Require(t)
	l := proxytest.NewNetnsLab(t, "aff")
	ports := []uint16{8080, 8081, 8082, 8083}
	for _, p := range ports {
		l.Serve(t, fmt.Sprintf("10.244.1.5:%d", p))
	}
	k := kernelOf(t, l.Node)
	sticky := proxytest.Svc("sticky", "10.96.0.90", []cluster.ServicePort{proxytest.TCP(80, 0)}, func(s *cluster.Service) { s.SessionAffinityTimeout = time.Hour })
	server := proxytest.EP(proxytest.A("10.244.1.5"), "node-b", true)
	// One slice an endpoint: the server at each of its ports.
	world := func(without uint16) map[cluster.Key][]*proxy.ServicePort {
		objs := []cluster.Object{sticky}
		for _, p := range ports {
			if p != without {
				s := proxytest.Slice(sticky, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, p)}, server)
				s.Name = fmt.Sprintf("sticky-%d", p)
				objs = append(objs, s)
			}
		}
		return proxytest.World(objs...)
	}
	p := nftables.NewProxier(defaultCfg, k)
	if _, err := p.Sync(world(0), nil, true); err != nil {
		t.Fatal(err)
	}
	// endpoint dials 8 times and returns the one endpoint answering.
	endpoint := func(when string) uint16 {
		t.Helper()
		var seen []uint16
		for range 8 {
			got, err := proxytest.Dial(l.Client, "10.96.0.90:80")
			if err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			_, port, _ := strings.Cut(got, "via 10.244.1.5:")
			n, _ := strconv.Atoi(port)
			if !slices.Contains(seen, uint16(n)) {
				seen = append(seen, uint16(n))
			}
		}
		if len(seen) != 1 {
			t.Fatalf("%s: one client reached %v, want one endpoint", when, seen)
		}
		return seen[0]
	}
	mine := endpoint("first connections")
	for round := range 5 {
		other := ports[(slices.Index(ports, mine)+1+round%3)%len(ports)]
		if _, err := p.Sync(world(other), nil, false); err != nil {
			t.Fatal(err)
		}
		if got := endpoint(fmt.Sprintf("round %d, %d gone", round, other)); got != mine {
			t.Fatalf("round %d: endpoint %d left and the client moved from %d to %d", round, other, mine, got)
		}
		if _, err := p.Sync(world(0), nil, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Sync(world(mine), nil, false); err != nil {
		t.Fatal(err)
	}
	if got := endpoint(fmt.Sprintf("its own endpoint %d gone", mine)); got == mine {
		t.Errorf("the client's endpoint %d left (still listening) and the client is still sent there", mine)
	}
}
