// Package proxytest holds what the Service proxy modes' tests share: one
// node's addresses, builders for Services and EndpointSlices, the scenario
// of every kind of Service that the golden and tracer tests program, golden
// files, and a namespace lab where a Service VIP is tested for real.
package proxytest

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Update is the -update flag of every test binary that links this package:
// rewrite golden files instead of comparing with them.
var Update = flag.Bool("update", false, "rewrite golden files")

// NodeName is the node the proxier under test runs on.
const NodeName = "node-a"

// The node's addresses and the pods around it.
var (
	NodeIP      = netip.MustParseAddr("192.168.10.11")
	ClusterCIDR = netip.MustParsePrefix("10.244.0.0/16")
	LocalAddrs  = []netip.Addr{NodeIP, netip.MustParseAddr("10.244.1.1"), netip.MustParseAddr("127.0.0.1")}
	LocalPod    = netip.MustParseAddr("10.244.1.5")   // an endpoint on this node
	RemotePod   = netip.MustParseAddr("10.244.2.7")   // an endpoint on another node
	ClientPod   = netip.MustParseAddr("10.244.1.9")   // a pod that is no endpoint
	Outsider    = netip.MustParseAddr("192.168.20.5") // outside the cluster
)

// A parses an address (test input only).
func A(s string) netip.Addr { return netip.MustParseAddr(s) }

// SvcOpt changes a Service Svc builds.
type SvcOpt func(*cluster.Service)

// Svc is a ClusterIP Service in namespace default with one cluster IP.
func Svc(name, vip string, ports []cluster.ServicePort, opts ...SvcOpt) *cluster.Service {
	s := &cluster.Service{Namespace: "default", Name: name, Type: cluster.ServiceTypeClusterIP,
		ClusterIPs: []netip.Addr{A(vip)}, Ports: ports}
	for _, o := range opts {
		o(s)
	}
	return s
}

// TCP is a TCP Service port named "p<port>", with a NodePort unless 0.
func TCP(port, nodePort uint16) cluster.ServicePort {
	return cluster.ServicePort{Name: "p" + fmt.Sprint(port), Protocol: cluster.TCP, Port: port, NodePort: nodePort}
}

// Port is a named Service port.
func Port(name string, p cluster.Protocol, n uint16) cluster.ServicePort {
	return cluster.ServicePort{Name: name, Protocol: p, Port: n}
}

// Endpoint is an endpoint: its address, its node, and whether it is ready
// (and so serving).
type Endpoint struct {
	Addr  netip.Addr
	Node  string
	Ready bool
}

// EP is an Endpoint.
func EP(addr netip.Addr, node string, ready bool) Endpoint { return Endpoint{addr, node, ready} }

// Slice is s's EndpointSlice; its address type follows the first endpoint.
func Slice(s *cluster.Service, ports []cluster.EndpointPort, eps ...Endpoint) *cluster.EndpointSlice {
	fam := "IPv4"
	if len(eps) > 0 && eps[0].Addr.Is6() {
		fam = "IPv6"
	}
	es := &cluster.EndpointSlice{Namespace: s.Namespace, Name: s.Name + "-abc", ServiceName: s.Name, AddressType: fam, Ports: ports}
	for _, e := range eps {
		es.Endpoints = append(es.Endpoints, cluster.Endpoint{Addresses: []netip.Addr{e.Addr}, NodeName: e.Node,
			Ready: e.Ready, Serving: e.Ready})
	}
	return es
}

// EPPort is a named endpoint port.
func EPPort(name string, p cluster.Protocol, n uint16) cluster.EndpointPort {
	return cluster.EndpointPort{Name: name, Protocol: p, Port: n}
}

// WorldOf is the ServicePorts of family f the objects give NodeName.
func WorldOf(f ipfamily.Family, objs ...cluster.Object) map[cluster.Key][]*proxy.ServicePort {
	st := cluster.NewStore()
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, objs)
	state := proxy.NewState(f)
	state.Update(st, NodeName, nil, true)
	return state.Ports
}

// World is WorldOf for IPv4.
func World(objs ...cluster.Object) map[cluster.Key][]*proxy.ServicePort {
	return WorldOf(ipfamily.IPv4, objs...)
}

// Scenario is every kind of Service a mode programs: endpoints local and
// remote, several ports, UDP and SCTP, none, NodePort with an external IP,
// LoadBalancer with eTP Local and source ranges, iTP Local with and without
// a local endpoint, affinity, headless, and another proxy's Service.
func Scenario() map[cluster.Key][]*proxy.ServicePort {
	p80 := []cluster.EndpointPort{EPPort("p80", cluster.TCP, 8080)}
	both := []Endpoint{EP(LocalPod, NodeName, true), EP(RemotePod, "node-b", true)}
	remote := EP(RemotePod, "node-b", true)
	web := Svc("web", "10.96.0.20", []cluster.ServicePort{TCP(80, 0), TCP(443, 0)})
	webEPs := Slice(web, []cluster.EndpointPort{EPPort("p80", cluster.TCP, 8080), EPPort("p443", cluster.TCP, 8443)}, both...)
	dns := Svc("dns", "10.96.0.10", []cluster.ServicePort{Port("dns", cluster.UDP, 53), Port("dns-tcp", cluster.TCP, 53)})
	dnsEPs := Slice(dns, []cluster.EndpointPort{EPPort("dns", cluster.UDP, 5353), EPPort("dns-tcp", cluster.TCP, 5354)}, remote)
	empty := Svc("empty", "10.96.0.30", []cluster.ServicePort{TCP(80, 0)})
	emptyNP := Svc("empty-np", "10.96.0.31", []cluster.ServicePort{TCP(80, 30031)}, func(s *cluster.Service) { s.Type = cluster.ServiceTypeNodePort })
	sctp := Svc("sctp", "10.96.0.40", []cluster.ServicePort{Port("s", cluster.SCTP, 9000)})
	sctpEPs := Slice(sctp, []cluster.EndpointPort{EPPort("s", cluster.SCTP, 9001)}, remote)
	np := Svc("np", "10.96.0.50", []cluster.ServicePort{TCP(80, 30080)}, func(s *cluster.Service) {
		s.Type = cluster.ServiceTypeNodePort
		s.ExternalIPs = []netip.Addr{A("192.168.10.200")}
	})
	npEPs := Slice(np, p80, both...)
	local := Svc("local", "10.96.0.60", []cluster.ServicePort{TCP(80, 30060)}, func(s *cluster.Service) {
		s.Type = cluster.ServiceTypeLoadBalancer
		s.ExternalTrafficPolicyLocal = true
		s.HealthCheckNodePort = 32000
		s.LoadBalancerIPs = []netip.Addr{A("192.168.30.1")}
		s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.20.0/24"), netip.MustParsePrefix("192.168.20.128/25")}
	})
	localEPs := Slice(local, p80, both...)
	remoteOnly := Svc("remote-only", "10.96.0.70", []cluster.ServicePort{TCP(80, 30070)}, func(s *cluster.Service) {
		s.Type = cluster.ServiceTypeNodePort
		s.ExternalTrafficPolicyLocal = true
	})
	remoteOnlyEPs := Slice(remoteOnly, p80, remote)
	itp := Svc("itp", "10.96.0.80", []cluster.ServicePort{TCP(80, 0)}, func(s *cluster.Service) { s.InternalTrafficPolicyLocal = true })
	itpEPs := Slice(itp, p80, both...)
	itpNone := Svc("itp-none", "10.96.0.81", []cluster.ServicePort{TCP(80, 0)}, func(s *cluster.Service) { s.InternalTrafficPolicyLocal = true })
	itpNoneEPs := Slice(itpNone, p80, remote)
	sticky := Svc("sticky", "10.96.0.90", []cluster.ServicePort{TCP(80, 0)}, func(s *cluster.Service) { s.SessionAffinityTimeout = 3 * time.Hour })
	stickyEPs := Slice(sticky, p80, both...)
	headless := &cluster.Service{Namespace: "default", Name: "headless", Headless: true, Ports: []cluster.ServicePort{TCP(80, 0)}}
	other := Svc("other-proxy", "10.96.0.99", []cluster.ServicePort{TCP(80, 0)}, func(s *cluster.Service) { s.ProxyName = "someone-else" })
	otherEPs := Slice(other, p80, remote)
	return World(web, webEPs, dns, dnsEPs, empty, emptyNP, sctp, sctpEPs, np, npEPs, local, localEPs, remoteOnly, remoteOnlyEPs,
		itp, itpEPs, itpNone, itpNoneEPs, sticky, stickyEPs, headless, other, otherEPs)
}

// Golden compares got with testdata/name, or rewrites that file under -update.
func Golden(t testing.TB, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *Update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run with -update to create): %v", err)
	}
	if string(want) != string(got) {
		t.Errorf("%s differs from the golden file (-update to accept):\n%s", name, Diff(string(want), string(got)))
	}
}

// Diff lists the lines where want and got differ.
func Diff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n- %s\n+ %s\n", i+1, wl, gl)
		}
	}
	return b.String()
}
