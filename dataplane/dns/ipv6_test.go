package dns

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/podnet/podnet/dataplane/cluster"
)

// dualStackState is a dual-stack cluster's DNS objects: an IPv6-only
// ClusterIP Service, a dual-stack headless Service whose slices are one
// per address type (as the EndpointSlice controller writes them), and
// pods with an address of each family.
func dualStackState() *cluster.Store {
	st := cluster.NewStore()
	http := cluster.ServicePort{Name: "http", Protocol: cluster.TCP, Port: 80}
	objs := []cluster.Object{
		&cluster.Namespace{Name: "ns6"},
		&cluster.Service{Namespace: "ns6", Name: "only6", Type: cluster.ServiceTypeClusterIP,
			ClusterIPs: addrs("fd00:10:96::a"), Ports: []cluster.ServicePort{http}},
		&cluster.Service{Namespace: "ns6", Name: "db", Type: cluster.ServiceTypeClusterIP, Headless: true},
		&cluster.EndpointSlice{Namespace: "ns6", Name: "db-v4", ServiceName: "db", AddressType: "IPv4",
			Ports: []cluster.EndpointPort{{Name: "pg", Protocol: cluster.TCP, Port: 5432}},
			Endpoints: []cluster.Endpoint{
				{Addresses: addrs("10.244.1.20"), Ready: true, Hostname: "db-0"},
				{Addresses: addrs("10.244.2.21"), Ready: true},
			}},
		&cluster.EndpointSlice{Namespace: "ns6", Name: "db-v6", ServiceName: "db", AddressType: "IPv6",
			Ports: []cluster.EndpointPort{{Name: "pg", Protocol: cluster.TCP, Port: 5432}},
			Endpoints: []cluster.Endpoint{
				{Addresses: addrs("fd00:10:244:1::20"), Ready: true, Hostname: "db-0"},
				{Addresses: addrs("fd00:10:244:2::21"), Ready: true},
				{Addresses: addrs("fd00:10:244:3::"), Ready: true},
				{Addresses: addrs("fd00:10:244:4::9"), Ready: false},
			}},
		&cluster.Pod{Namespace: "ns6", Name: "db-0", IPs: addrs("10.244.1.20", "fd00:10:244:1::20"), Hostname: "db-0", Subdomain: "db"},
	}
	st.Replace([]cluster.Kind{cluster.KindNamespace, cluster.KindService, cluster.KindEndpointSlice, cluster.KindPod}, objs)
	st.MarkSynced()
	return st
}

const soa6 = "cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. SERIAL 7200 1800 86400 5"

// TestIPv6Records: AAAA for IPv6 cluster IPs and headless endpoints, the
// endpoint names of IPv6 addresses as the Kubernetes DNS specification
// writes them (colons as dashes, a trailing dash followed by 0), their
// ip6.arpa PTRs, and SRV targets with AAAA glue.
func TestIPv6Records(t *testing.T) {
	s, z := newTestServer(t, dualStackState(), ZoneOptions{})
	nd := func(q string, qt uint16) zoneCase {
		return zoneCase{qname: q, qtype: qt, ns: []string{soa6}}
	}
	for _, c := range []zoneCase{
		{qname: "only6.ns6.svc.cluster.local.", qtype: mdns.TypeAAAA, answer: []string{"only6.ns6.svc.cluster.local. 5 IN AAAA fd00:10:96::a"}},
		nd("only6.ns6.svc.cluster.local.", mdns.TypeA),
		{qname: "a.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa.", qtype: mdns.TypePTR,
			answer: []string{"a.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa. 5 IN PTR only6.ns6.svc.cluster.local."}},
		// The headless Service's own name: each family from its slice.
		{qname: "db.ns6.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{
			"db.ns6.svc.cluster.local. 5 IN A 10.244.1.20", "db.ns6.svc.cluster.local. 5 IN A 10.244.2.21"}},
		{qname: "db.ns6.svc.cluster.local.", qtype: mdns.TypeAAAA, answer: []string{
			"db.ns6.svc.cluster.local. 5 IN AAAA fd00:10:244:1::20",
			"db.ns6.svc.cluster.local. 5 IN AAAA fd00:10:244:2::21",
			"db.ns6.svc.cluster.local. 5 IN AAAA fd00:10:244:3::",
		}},
		// A hostname holds the pod's address of each family.
		{qname: "db-0.db.ns6.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{"db-0.db.ns6.svc.cluster.local. 5 IN A 10.244.1.20"}},
		{qname: "db-0.db.ns6.svc.cluster.local.", qtype: mdns.TypeAAAA, answer: []string{"db-0.db.ns6.svc.cluster.local. 5 IN AAAA fd00:10:244:1::20"}},
		// Without a hostname, the address with dashes.
		{qname: "fd00-10-244-2--21.db.ns6.svc.cluster.local.", qtype: mdns.TypeAAAA,
			answer: []string{"fd00-10-244-2--21.db.ns6.svc.cluster.local. 5 IN AAAA fd00:10:244:2::21"}},
		nd("fd00-10-244-2--21.db.ns6.svc.cluster.local.", mdns.TypeA),
		{qname: "fd00-10-244-3--0.db.ns6.svc.cluster.local.", qtype: mdns.TypeAAAA,
			answer: []string{"fd00-10-244-3--0.db.ns6.svc.cluster.local. 5 IN AAAA fd00:10:244:3::"}},
		nxdomain("fd00-10-244-4--9.db.ns6.svc.cluster.local.", mdns.TypeAAAA), // not ready
		// Weights count addresses, as CoreDNS: db-0 has two, one SRV.
		{qname: "_pg._tcp.db.ns6.svc.cluster.local.", qtype: mdns.TypeSRV, answer: []string{
			"_pg._tcp.db.ns6.svc.cluster.local. 5 IN SRV 0 20 5432 db-0.db.ns6.svc.cluster.local.",
			"_pg._tcp.db.ns6.svc.cluster.local. 5 IN SRV 0 20 5432 10-244-2-21.db.ns6.svc.cluster.local.",
			"_pg._tcp.db.ns6.svc.cluster.local. 5 IN SRV 0 20 5432 fd00-10-244-2--21.db.ns6.svc.cluster.local.",
			"_pg._tcp.db.ns6.svc.cluster.local. 5 IN SRV 0 20 5432 fd00-10-244-3--0.db.ns6.svc.cluster.local.",
		}, extra: []string{
			"db-0.db.ns6.svc.cluster.local. 5 IN A 10.244.1.20",
			"db-0.db.ns6.svc.cluster.local. 5 IN AAAA fd00:10:244:1::20",
			"10-244-2-21.db.ns6.svc.cluster.local. 5 IN A 10.244.2.21",
			"fd00-10-244-2--21.db.ns6.svc.cluster.local. 5 IN AAAA fd00:10:244:2::21",
			"fd00-10-244-3--0.db.ns6.svc.cluster.local. 5 IN AAAA fd00:10:244:3::",
		}},
		// ip6.arpa of endpoints: their names.
		{qname: "1.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.2.0.0.0.4.4.2.0.0.1.0.0.0.0.d.f.ip6.arpa.", qtype: mdns.TypePTR,
			answer: []string{"1.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.2.0.0.0.4.4.2.0.0.1.0.0.0.0.d.f.ip6.arpa. 5 IN PTR fd00-10-244-2--21.db.ns6.svc.cluster.local."}},
		{qname: "0.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.0.0.4.4.2.0.0.1.0.0.0.0.d.f.ip6.arpa.", qtype: mdns.TypePTR,
			answer: []string{"0.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.0.0.4.4.2.0.0.1.0.0.0.0.d.f.ip6.arpa. 5 IN PTR db-0.db.ns6.svc.cluster.local."}},
		// Pod records of IPv6 pods, in the specification's form and in
		// the address's other spellings.
		{qname: "fd00-10-244-1--20.ns6.pod.cluster.local.", qtype: mdns.TypeAAAA,
			answer: []string{"fd00-10-244-1--20.ns6.pod.cluster.local. 5 IN AAAA fd00:10:244:1::20"}},
		{qname: "fd00-10-244-1-0-0-0-20.ns6.pod.cluster.local.", qtype: mdns.TypeAAAA,
			answer: []string{"fd00-10-244-1-0-0-0-20.ns6.pod.cluster.local. 5 IN AAAA fd00:10:244:1::20"}},
		nd("fd00-10-244-1--20.ns6.pod.cluster.local.", mdns.TypeA),
	} {
		checkCase(t, s, z, c)
	}

	// Verified pod records: only addresses of the namespace's pods.
	s, z = newTestServer(t, dualStackState(), ZoneOptions{Pods: PodsVerified})
	for _, c := range []zoneCase{
		{qname: "fd00-10-244-1--20.ns6.pod.cluster.local.", qtype: mdns.TypeAAAA,
			answer: []string{"fd00-10-244-1--20.ns6.pod.cluster.local. 5 IN AAAA fd00:10:244:1::20"}},
		{qname: "10-244-1-20.ns6.pod.cluster.local.", qtype: mdns.TypeA,
			answer: []string{"10-244-1-20.ns6.pod.cluster.local. 5 IN A 10.244.1.20"}},
		nxdomain("fd00-10-244-1--21.ns6.pod.cluster.local.", mdns.TypeAAAA),
	} {
		checkCase(t, s, z, c)
	}
}

// TestServeAndForwardOverIPv6: dnsd listens on an IPv6 address (UDP and
// TCP) and forwards to an IPv6 upstream.
func TestServeAndForwardOverIPv6(t *testing.T) {
	pc, err := net.ListenPacket("udp6", "[::1]:0")
	if err != nil {
		t.Fatalf("no IPv6 loopback: %v", err)
	}
	upstream := &mdns.Server{PacketConn: pc, Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) {
		m := new(mdns.Msg)
		m.SetReply(r)
		if r.Question[0].Name == "www.example.test." && r.Question[0].Qtype == mdns.TypeAAAA {
			rr, _ := mdns.NewRR("www.example.test. 60 IN AAAA 2001:db8::80")
			m.Answer = append(m.Answer, rr)
		}
		w.WriteMsg(m)
	})}
	started := make(chan struct{})
	upstream.NotifyStartedFunc = func() { close(started) }
	go upstream.ActivateAndServe()
	<-started
	t.Cleanup(func() { upstream.Shutdown() })

	fwd, err := NewForwarder(ForwardOptions{Upstreams: []netip.AddrPort{pc.LocalAddr().(*net.UDPAddr).AddrPort()},
		TryTimeout: 500 * time.Millisecond, Deadline: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.doneOnce.Do(func() { close(fwd.done) }) })
	z := NewZone(dualStackState(), ZoneOptions{})
	z.Flush()
	srv := NewServer(ServerOptions{Listen: []string{"[::1]:0"}, Zone: z, Forwarder: fwd, Cache: NewCache(CacheOptions{})})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ready := make(chan Listening, 1)
	go srv.Run(ctx, ready)
	l := <-ready
	if len(l.UDP) == 0 || !l.UDP[0].Addr().Is6() || len(l.TCP) == 0 || !l.TCP[0].Addr().Is6() {
		t.Fatalf("listening on %v %v, want [::1]", l.UDP, l.TCP)
	}
	for _, proto := range []string{"udp6", "tcp6"} {
		addr := l.UDP[0].String()
		if proto == "tcp6" {
			addr = l.TCP[0].String()
		}
		c := &mdns.Client{Net: proto[:3], Timeout: 2 * time.Second}
		for _, q := range []struct{ name, want string }{
			{"only6.ns6.svc.cluster.local.", "fd00:10:96::a"},
			{"www.example.test.", "2001:db8::80"},
		} {
			m, _, err := c.Exchange(new(mdns.Msg).SetQuestion(q.name, mdns.TypeAAAA), addr)
			if err != nil {
				t.Fatalf("%s %s: %v", proto, q.name, err)
			}
			if len(m.Answer) != 1 || m.Answer[0].(*mdns.AAAA).AAAA.String() != q.want {
				t.Errorf("%s %s AAAA over %s: %v, want %s", proto, q.name, addr, m.Answer, q.want)
			}
		}
	}
}
