package dns

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	mdns "github.com/miekg/dns"

	"github.com/podnet/podnet/dataplane/cluster"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// testState is the fixed cluster the table tests query.
func testState() *cluster.Store {
	st := cluster.NewStore()
	var objs []cluster.Object
	for _, ns := range []string{"default", "kube-system", "testns"} {
		objs = append(objs, &cluster.Namespace{Name: ns})
	}
	svc := func(ns, name string, ips []netip.Addr, ports ...cluster.ServicePort) *cluster.Service {
		return &cluster.Service{Namespace: ns, Name: name, Type: cluster.ServiceTypeClusterIP, ClusterIPs: ips, Ports: ports}
	}
	headless := func(ns, name string) *cluster.Service {
		return &cluster.Service{Namespace: ns, Name: name, Type: cluster.ServiceTypeClusterIP, Headless: true}
	}
	http := cluster.ServicePort{Name: "http", Protocol: cluster.TCP, Port: 80}
	objs = append(objs,
		svc("default", "kubernetes", addrs("10.96.0.1"), cluster.ServicePort{Name: "https", Protocol: cluster.TCP, Port: 443}),
		svc("kube-system", "kube-dns", addrs("10.96.0.10"),
			cluster.ServicePort{Name: "dns", Protocol: cluster.UDP, Port: 53},
			cluster.ServicePort{Name: "dns-tcp", Protocol: cluster.TCP, Port: 53}),
		svc("testns", "svc1", addrs("10.96.1.1"), http),
		&cluster.EndpointSlice{Namespace: "testns", Name: "svc1-abc", ServiceName: "svc1", AddressType: "IPv4",
			Ports:     []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}},
			Endpoints: []cluster.Endpoint{{Addresses: addrs("10.244.1.5"), Ready: true}}},
		svc("testns", "svc6", addrs("fd00::1"), http),
		svc("testns", "dual", addrs("10.96.1.2", "fd00::2"), http),
		svc("testns", "noports", addrs("10.96.1.3")),
		headless("testns", "hdls"),
		&cluster.EndpointSlice{Namespace: "testns", Name: "hdls-1", ServiceName: "hdls", AddressType: "IPv4",
			Ports: []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 80}, {Name: "sip", Protocol: cluster.UDP, Port: 5060}},
			Endpoints: []cluster.Endpoint{
				{Addresses: addrs("10.244.1.10"), Ready: true, Hostname: "web-0"},
				{Addresses: addrs("10.244.2.11"), Ready: true},
				{Addresses: addrs("10.244.2.12"), Ready: false},
			}},
		headless("testns", "hdlsempty"),
		&cluster.EndpointSlice{Namespace: "testns", Name: "hdlsempty-1", ServiceName: "hdlsempty", AddressType: "IPv4",
			Ports:     []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 80}},
			Endpoints: []cluster.Endpoint{{Addresses: addrs("10.244.3.2"), Ready: false}}},
		func() *cluster.Service {
			s := headless("testns", "hdlsnotready")
			s.PublishNotReadyAddresses = true
			return s
		}(),
		&cluster.EndpointSlice{Namespace: "testns", Name: "hdlsnotready-1", ServiceName: "hdlsnotready", AddressType: "IPv4",
			Ports:     []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 80}},
			Endpoints: []cluster.Endpoint{{Addresses: addrs("10.244.3.3"), Ready: false}}},
		headless("testns", "hdlsprtls"),
		&cluster.EndpointSlice{Namespace: "testns", Name: "hdlsprtls-1", ServiceName: "hdlsprtls", AddressType: "IPv4",
			Endpoints: []cluster.Endpoint{{Addresses: addrs("10.244.4.4"), Ready: true}}},
		headless("testns", "hdls2"),
		&cluster.EndpointSlice{Namespace: "testns", Name: "hdls2-1", ServiceName: "hdls2", AddressType: "IPv4",
			Endpoints: []cluster.Endpoint{{Addresses: addrs("10.244.5.5"), Ready: true, TargetPod: "pod2"}}},
		&cluster.Pod{Namespace: "testns", Name: "pod2", IPs: addrs("10.244.5.5"), Hostname: "mypod", Subdomain: "hdls2"},
		&cluster.Pod{Namespace: "testns", Name: "web-0", IPs: addrs("10.244.1.10"), Hostname: "web-0", Subdomain: "hdls"},
		&cluster.Service{Namespace: "testns", Name: "ext", Type: cluster.ServiceTypeExternalName, ExternalName: "example.test"},
		&cluster.Service{Namespace: "testns", Name: "extin", Type: cluster.ServiceTypeExternalName, ExternalName: "svc1.testns.svc.cluster.local."},
	)
	st.Replace([]cluster.Kind{cluster.KindNamespace, cluster.KindService, cluster.KindEndpointSlice, cluster.KindPod}, objs)
	st.MarkSynced()
	return st
}

type zoneCase struct {
	qname  string
	qtype  uint16
	rcode  int
	answer []string
	ns     []string
	extra  []string
}

const soa = "cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. SERIAL 7200 1800 86400 5"

func nodata(q string, t uint16) zoneCase {
	return zoneCase{qname: q, qtype: t, rcode: mdns.RcodeSuccess, ns: []string{soa}}
}

func nxdomain(q string, t uint16) zoneCase {
	return zoneCase{qname: q, qtype: t, rcode: mdns.RcodeNameError, ns: []string{soa}}
}

var zoneCases = []zoneCase{
	// ClusterIP Services.
	{qname: "kubernetes.default.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{"kubernetes.default.svc.cluster.local. 5 IN A 10.96.0.1"}},
	{qname: "svc1.testns.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{"svc1.testns.svc.cluster.local. 5 IN A 10.96.1.1"}},
	{qname: "SVC1.TestNS.Svc.Cluster.Local.", qtype: mdns.TypeA, answer: []string{"SVC1.TestNS.Svc.Cluster.Local. 5 IN A 10.96.1.1"}},
	nodata("svc1.testns.svc.cluster.local.", mdns.TypeAAAA),
	nodata("svc1.testns.svc.cluster.local.", mdns.TypeTXT),
	nodata("svc1.testns.svc.cluster.local.", mdns.TypeMX),
	nodata("svc1.testns.svc.cluster.local.", mdns.TypeCNAME),
	nodata("svc1.testns.svc.cluster.local.", mdns.TypeSOA),
	nodata("svc1.testns.svc.cluster.local.", mdns.TypePTR),
	nodata("svc1.testns.svc.cluster.local.", mdns.TypeHTTPS),
	{qname: "svc1.testns.svc.cluster.local.", qtype: mdns.TypeSRV,
		answer: []string{"svc1.testns.svc.cluster.local. 5 IN SRV 0 100 80 svc1.testns.svc.cluster.local."},
		extra:  []string{"svc1.testns.svc.cluster.local. 5 IN A 10.96.1.1"}},
	{qname: "_http._tcp.svc1.testns.svc.cluster.local.", qtype: mdns.TypeSRV,
		answer: []string{"_http._tcp.svc1.testns.svc.cluster.local. 5 IN SRV 0 100 80 svc1.testns.svc.cluster.local."},
		extra:  []string{"svc1.testns.svc.cluster.local. 5 IN A 10.96.1.1"}},
	{qname: "_HTTP._TCP.svc1.testns.svc.cluster.local.", qtype: mdns.TypeSRV,
		answer: []string{"_HTTP._TCP.svc1.testns.svc.cluster.local. 5 IN SRV 0 100 80 svc1.testns.svc.cluster.local."},
		extra:  []string{"svc1.testns.svc.cluster.local. 5 IN A 10.96.1.1"}},
	{qname: "_http._tcp.svc1.testns.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{"_http._tcp.svc1.testns.svc.cluster.local. 5 IN A 10.96.1.1"}},
	nxdomain("_http._udp.svc1.testns.svc.cluster.local.", mdns.TypeSRV),
	nxdomain("_dns._tcp.svc1.testns.svc.cluster.local.", mdns.TypeSRV),
	nxdomain("_tcp.svc1.testns.svc.cluster.local.", mdns.TypeSRV),
	{qname: "_dns._udp.kube-dns.kube-system.svc.cluster.local.", qtype: mdns.TypeSRV,
		answer: []string{"_dns._udp.kube-dns.kube-system.svc.cluster.local. 5 IN SRV 0 100 53 kube-dns.kube-system.svc.cluster.local."},
		extra:  []string{"kube-dns.kube-system.svc.cluster.local. 5 IN A 10.96.0.10"}},
	{qname: "kube-dns.kube-system.svc.cluster.local.", qtype: mdns.TypeSRV,
		answer: []string{"kube-dns.kube-system.svc.cluster.local. 5 IN SRV 0 50 53 kube-dns.kube-system.svc.cluster.local."},
		extra:  []string{"kube-dns.kube-system.svc.cluster.local. 5 IN A 10.96.0.10"}},
	// An endpoint of a ClusterIP Service has a name too (CoreDNS).
	{qname: "10-244-1-5.svc1.testns.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{"10-244-1-5.svc1.testns.svc.cluster.local. 5 IN A 10.244.1.5"}},
	nxdomain("10-244-1-6.svc1.testns.svc.cluster.local.", mdns.TypeA),
	nxdomain("a.b.c.svc1.testns.svc.cluster.local.", mdns.TypeA),
	// IPv6 and dual stack.
	{qname: "svc6.testns.svc.cluster.local.", qtype: mdns.TypeAAAA, answer: []string{"svc6.testns.svc.cluster.local. 5 IN AAAA fd00::1"}},
	nodata("svc6.testns.svc.cluster.local.", mdns.TypeA),
	{qname: "svc6.testns.svc.cluster.local.", qtype: mdns.TypeSRV,
		answer: []string{"svc6.testns.svc.cluster.local. 5 IN SRV 0 100 80 svc6.testns.svc.cluster.local."},
		extra:  []string{"svc6.testns.svc.cluster.local. 5 IN AAAA fd00::1"}},
	{qname: "dual.testns.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{"dual.testns.svc.cluster.local. 5 IN A 10.96.1.2"}},
	{qname: "dual.testns.svc.cluster.local.", qtype: mdns.TypeAAAA, answer: []string{"dual.testns.svc.cluster.local. 5 IN AAAA fd00::2"}},
	{qname: "dual.testns.svc.cluster.local.", qtype: mdns.TypeSRV,
		answer: []string{"dual.testns.svc.cluster.local. 5 IN SRV 0 50 80 dual.testns.svc.cluster.local."},
		extra:  []string{"dual.testns.svc.cluster.local. 5 IN A 10.96.1.2", "dual.testns.svc.cluster.local. 5 IN AAAA fd00::2"}},
	// A ClusterIP Service without ports has no name (CoreDNS).
	nxdomain("noports.testns.svc.cluster.local.", mdns.TypeA),
	// Missing Services and namespaces.
	nxdomain("svc0.testns.svc.cluster.local.", mdns.TypeA),
	nxdomain("svc0.testns.svc.cluster.local.", mdns.TypeAAAA),
	nxdomain("svc0.testns.svc.cluster.local.", mdns.TypeTXT),
	nxdomain("svc0.testns.svc.cluster.local.", mdns.TypeMX),
	nxdomain("svc0.testns.svc.cluster.local.", mdns.TypeSOA),
	nxdomain("svc0.nons.svc.cluster.local.", mdns.TypeA),
	nodata("testns.svc.cluster.local.", mdns.TypeA),
	nxdomain("nons.svc.cluster.local.", mdns.TypeA),
	nxdomain("foo.cluster.local.", mdns.TypeA),
	nxdomain("svc1.testns.foo.cluster.local.", mdns.TypeA),
	// Headless Services.
	{qname: "hdls.testns.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{
		"hdls.testns.svc.cluster.local. 5 IN A 10.244.1.10", "hdls.testns.svc.cluster.local. 5 IN A 10.244.2.11"}},
	nodata("hdls.testns.svc.cluster.local.", mdns.TypeAAAA),
	{qname: "hdls.testns.svc.cluster.local.", qtype: mdns.TypeSRV, answer: []string{
		"hdls.testns.svc.cluster.local. 5 IN SRV 0 25 80 web-0.hdls.testns.svc.cluster.local.",
		"hdls.testns.svc.cluster.local. 5 IN SRV 0 25 5060 web-0.hdls.testns.svc.cluster.local.",
		"hdls.testns.svc.cluster.local. 5 IN SRV 0 25 80 10-244-2-11.hdls.testns.svc.cluster.local.",
		"hdls.testns.svc.cluster.local. 5 IN SRV 0 25 5060 10-244-2-11.hdls.testns.svc.cluster.local.",
	}, extra: []string{
		"web-0.hdls.testns.svc.cluster.local. 5 IN A 10.244.1.10",
		"10-244-2-11.hdls.testns.svc.cluster.local. 5 IN A 10.244.2.11",
	}},
	{qname: "_sip._udp.hdls.testns.svc.cluster.local.", qtype: mdns.TypeSRV, answer: []string{
		"_sip._udp.hdls.testns.svc.cluster.local. 5 IN SRV 0 50 5060 web-0.hdls.testns.svc.cluster.local.",
		"_sip._udp.hdls.testns.svc.cluster.local. 5 IN SRV 0 50 5060 10-244-2-11.hdls.testns.svc.cluster.local.",
	}, extra: []string{
		"web-0.hdls.testns.svc.cluster.local. 5 IN A 10.244.1.10",
		"10-244-2-11.hdls.testns.svc.cluster.local. 5 IN A 10.244.2.11",
	}},
	nxdomain("_sip._tcp.hdls.testns.svc.cluster.local.", mdns.TypeSRV),
	{qname: "web-0.hdls.testns.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{"web-0.hdls.testns.svc.cluster.local. 5 IN A 10.244.1.10"}},
	{qname: "10-244-2-11.hdls.testns.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{"10-244-2-11.hdls.testns.svc.cluster.local. 5 IN A 10.244.2.11"}},
	nxdomain("10-244-1-10.hdls.testns.svc.cluster.local.", mdns.TypeA), // it has a hostname
	nxdomain("10-244-2-12.hdls.testns.svc.cluster.local.", mdns.TypeA), // not ready
	nxdomain("hdlsempty.testns.svc.cluster.local.", mdns.TypeA),
	nxdomain("hdlsempty.testns.svc.cluster.local.", mdns.TypeSRV),
	{qname: "hdlsnotready.testns.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{"hdlsnotready.testns.svc.cluster.local. 5 IN A 10.244.3.3"}},
	{qname: "hdlsprtls.testns.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{"hdlsprtls.testns.svc.cluster.local. 5 IN A 10.244.4.4"}},
	nodata("hdlsprtls.testns.svc.cluster.local.", mdns.TypeSRV),
	// Pod hostname and subdomain through the headless Service.
	{qname: "mypod.hdls2.testns.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{"mypod.hdls2.testns.svc.cluster.local. 5 IN A 10.244.5.5"}},
	// ExternalName.
	{qname: "ext.testns.svc.cluster.local.", qtype: mdns.TypeCNAME, answer: []string{"ext.testns.svc.cluster.local. 5 IN CNAME example.test."}},
	nodata("ext.testns.svc.cluster.local.", mdns.TypeTXT),
	nodata("ext.testns.svc.cluster.local.", mdns.TypeSRV),
	nxdomain("_http._tcp.ext.testns.svc.cluster.local.", mdns.TypeSRV),
	{qname: "extin.testns.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{
		"extin.testns.svc.cluster.local. 5 IN CNAME svc1.testns.svc.cluster.local.",
		"svc1.testns.svc.cluster.local. 5 IN A 10.96.1.1"}},
	// Reverse.
	{qname: "1.1.96.10.in-addr.arpa.", qtype: mdns.TypePTR, answer: []string{"1.1.96.10.in-addr.arpa. 5 IN PTR svc1.testns.svc.cluster.local."}},
	{qname: "10.1.244.10.in-addr.arpa.", qtype: mdns.TypePTR, answer: []string{"10.1.244.10.in-addr.arpa. 5 IN PTR web-0.hdls.testns.svc.cluster.local."}},
	{qname: "5.1.244.10.in-addr.arpa.", qtype: mdns.TypePTR, answer: []string{"5.1.244.10.in-addr.arpa. 5 IN PTR 10-244-1-5.svc1.testns.svc.cluster.local."}},
	{qname: "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", qtype: mdns.TypePTR,
		answer: []string{"1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa. 5 IN PTR svc6.testns.svc.cluster.local."}},
	// Pods (insecure, the default).
	{qname: "10-244-1-10.testns.pod.cluster.local.", qtype: mdns.TypeA, answer: []string{"10-244-1-10.testns.pod.cluster.local. 5 IN A 10.244.1.10"}},
	{qname: "1-2-3-4.testns.pod.cluster.local.", qtype: mdns.TypeA, answer: []string{"1-2-3-4.testns.pod.cluster.local. 5 IN A 1.2.3.4"}},
	{qname: "fd00--5.testns.pod.cluster.local.", qtype: mdns.TypeAAAA, answer: []string{"fd00--5.testns.pod.cluster.local. 5 IN AAAA fd00::5"}},
	nodata("1-2-3-4.testns.pod.cluster.local.", mdns.TypeAAAA),
	nxdomain("1-2-3-4.nons.pod.cluster.local.", mdns.TypeA),
	nxdomain("not-an-ip.testns.pod.cluster.local.", mdns.TypeA),
	nxdomain("01-2-3-4.testns.pod.cluster.local.", mdns.TypeA),
	nxdomain("x.1-2-3-4.testns.pod.cluster.local.", mdns.TypeA),
	nodata("testns.pod.cluster.local.", mdns.TypeA),
	// The zone's own names.
	nodata("cluster.local.", mdns.TypeA),
	nodata("svc.cluster.local.", mdns.TypeA),
	nodata("pod.cluster.local.", mdns.TypeA),
	{qname: "cluster.local.", qtype: mdns.TypeSOA, answer: []string{soa}},
	{qname: "cluster.local.", qtype: mdns.TypeNS, answer: []string{"cluster.local. 5 IN NS ns.dns.cluster.local."},
		extra: []string{"ns.dns.cluster.local. 5 IN A 10.96.0.10"}},
	{qname: "ns.dns.cluster.local.", qtype: mdns.TypeA, answer: []string{"ns.dns.cluster.local. 5 IN A 10.96.0.10"}},
	{qname: "dns-version.cluster.local.", qtype: mdns.TypeTXT, answer: []string{`dns-version.cluster.local. 28800 IN TXT "1.1.0"`}},
	// CoreDNS answers NXDOMAIN here; the name exists, so NODATA is right.
	nodata("dns-version.cluster.local.", mdns.TypeA),
	// Zone transfers.
	{qname: "cluster.local.", qtype: mdns.TypeAXFR, rcode: mdns.RcodeRefused},
	{qname: "cluster.local.", qtype: mdns.TypeIXFR, rcode: mdns.RcodeRefused},
	// Short names, as users type them.
	{qname: "kubernetes.default.", qtype: mdns.TypeA, answer: []string{"kubernetes.default. 5 IN A 10.96.0.1"}},
	{qname: "kubernetes.default.svc.", qtype: mdns.TypeA, answer: []string{"kubernetes.default.svc. 5 IN A 10.96.0.1"}},
	{qname: "Kubernetes.Default.", qtype: mdns.TypeA, answer: []string{"Kubernetes.Default. 5 IN A 10.96.0.1"}},
	nodata("kubernetes.default.", mdns.TypeAAAA),
	// Without a forwarder, names that are not the cluster's are refused.
	{qname: "nosuch.default.", qtype: mdns.TypeA, rcode: mdns.RcodeRefused},
	{qname: "9.9.9.9.in-addr.arpa.", qtype: mdns.TypePTR, rcode: mdns.RcodeRefused},
}

func newTestServer(t testing.TB, st *cluster.Store, zo ZoneOptions) (*Server, *Zone) {
	t.Helper()
	z := NewZone(st, zo)
	z.Flush()
	return NewServer(ServerOptions{Zone: z}), z
}

// query sends one question through the server's handler and unpacks the
// answer.
func query(t testing.TB, s *Server, name string, qtype uint16, edns bool) *mdns.Msg {
	t.Helper()
	q := new(mdns.Msg)
	q.SetQuestion(name, qtype)
	if edns {
		q.SetEdns0(4096, false)
	}
	pkt, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	resp := s.Handle(context.Background(), pkt, false)
	if resp == nil {
		t.Fatalf("%s %s: no answer", name, mdns.TypeToString[qtype])
	}
	m := new(mdns.Msg)
	if err := m.Unpack(resp); err != nil {
		t.Fatalf("%s %s: unpack answer: %v", name, mdns.TypeToString[qtype], err)
	}
	if m.Id != q.Id || !m.Response || len(m.Question) != 1 || m.Question[0].Name != name {
		t.Fatalf("%s: answer does not match the question: %v", name, m)
	}
	return m
}

func normRRs(t testing.TB, ss []string, serial uint32) []string {
	t.Helper()
	var out []string
	for _, s := range ss {
		rr, err := mdns.NewRR(strings.ReplaceAll(s, "SERIAL", fmt.Sprint(serial)))
		if err != nil {
			t.Fatalf("bad expected RR %q: %v", s, err)
		}
		out = append(out, rr.String())
	}
	slices.Sort(out)
	return out
}

func rrStrings(rrs []mdns.RR) []string {
	var out []string
	for _, rr := range rrs {
		if rr.Header().Rrtype == mdns.TypeOPT {
			continue
		}
		out = append(out, rr.String())
	}
	slices.Sort(out)
	return out
}

func checkCase(t *testing.T, s *Server, z *Zone, c zoneCase) {
	t.Helper()
	for _, edns := range []bool{false, true} {
		m := query(t, s, c.qname, c.qtype, edns)
		serial := z.snap.Load().serial
		if m.Rcode != c.rcode {
			t.Errorf("%s %s: rcode %s, want %s", c.qname, mdns.TypeToString[c.qtype], mdns.RcodeToString[m.Rcode], mdns.RcodeToString[c.rcode])
		}
		for _, sec := range []struct {
			name      string
			got, want []string
		}{
			{"answer", rrStrings(m.Answer), normRRs(t, c.answer, serial)},
			{"authority", rrStrings(m.Ns), normRRs(t, c.ns, serial)},
			{"additional", rrStrings(m.Extra), normRRs(t, c.extra, serial)},
		} {
			if !slices.Equal(sec.got, sec.want) {
				t.Errorf("%s %s %s:\n got  %q\n want %q", c.qname, mdns.TypeToString[c.qtype], sec.name, sec.got, sec.want)
			}
		}
		if c.rcode != mdns.RcodeRefused && !m.Authoritative {
			t.Errorf("%s %s: AA not set", c.qname, mdns.TypeToString[c.qtype])
		}
		if (m.IsEdns0() != nil) != edns {
			t.Errorf("%s %s: EDNS0 in answer %v, in query %v", c.qname, mdns.TypeToString[c.qtype], m.IsEdns0() != nil, edns)
		}
	}
}

func TestZoneAnswers(t *testing.T) {
	s, z := newTestServer(t, testState(), ZoneOptions{ShortNames: true})
	if z.snap.Load().serial == 0 {
		t.Fatal("SOA serial is 0 after the first sync")
	}
	for _, c := range zoneCases {
		checkCase(t, s, z, c)
	}
}

func TestPodModes(t *testing.T) {
	s, z := newTestServer(t, testState(), ZoneOptions{Pods: PodsVerified})
	for _, c := range []zoneCase{
		{qname: "10-244-1-10.testns.pod.cluster.local.", qtype: mdns.TypeA, answer: []string{"10-244-1-10.testns.pod.cluster.local. 5 IN A 10.244.1.10"}},
		nxdomain("1-2-3-4.testns.pod.cluster.local.", mdns.TypeA),
		nxdomain("10-244-1-10.default.pod.cluster.local.", mdns.TypeA), // right address, wrong namespace
	} {
		checkCase(t, s, z, c)
	}
	s, z = newTestServer(t, testState(), ZoneOptions{Pods: PodsDisabled})
	checkCase(t, s, z, nxdomain("10-244-1-10.testns.pod.cluster.local.", mdns.TypeA))
	// Without short names, "kubernetes.default." is not the cluster's.
	checkCase(t, s, z, zoneCase{qname: "kubernetes.default.", qtype: mdns.TypeA, rcode: mdns.RcodeRefused})
}

func TestOtherDomainAndTTL(t *testing.T) {
	s, z := newTestServer(t, testState(), ZoneOptions{Domain: "k8s.example", TTL: 30})
	checkCase(t, s, z, zoneCase{qname: "svc1.testns.svc.k8s.example.", qtype: mdns.TypeA, answer: []string{"svc1.testns.svc.k8s.example. 30 IN A 10.96.1.1"}})
	checkCase(t, s, z, zoneCase{qname: "svc0.testns.svc.k8s.example.", qtype: mdns.TypeA, rcode: mdns.RcodeNameError,
		ns: []string{"k8s.example. 30 IN SOA ns.dns.k8s.example. hostmaster.k8s.example. SERIAL 7200 1800 86400 30"}})
	checkCase(t, s, z, zoneCase{qname: "svc1.testns.svc.cluster.local.", qtype: mdns.TypeA, rcode: mdns.RcodeRefused})
}

func TestServfailUntilSynced(t *testing.T) {
	st := cluster.NewStore()
	st.Upsert(&cluster.Service{Namespace: "default", Name: "kubernetes", ClusterIPs: addrs("10.96.0.1"),
		Ports: []cluster.ServicePort{{Name: "https", Protocol: cluster.TCP, Port: 443}}})
	s, z := newTestServer(t, st, ZoneOptions{})
	for _, name := range []string{"kubernetes.default.svc.cluster.local.", "nope.default.svc.cluster.local."} {
		if m := query(t, s, name, mdns.TypeA, false); m.Rcode != mdns.RcodeServerFailure {
			t.Errorf("%s before sync: %s, want SERVFAIL", name, mdns.RcodeToString[m.Rcode])
		}
	}
	st.MarkSynced()
	z.Flush()
	if m := query(t, s, "kubernetes.default.svc.cluster.local.", mdns.TypeA, false); m.Rcode != mdns.RcodeSuccess || len(m.Answer) != 1 {
		t.Errorf("after sync: %v", m)
	}
}

// TestIncrementalMatchesRebuild changes the state step by step and checks
// after every step that the incrementally kept index answers exactly as one
// built from scratch.
func TestIncrementalMatchesRebuild(t *testing.T) {
	st := testState()
	z := NewZone(st, ZoneOptions{ShortNames: true, Pods: PodsVerified})
	z.Flush()
	steps := []func(){
		func() { st.Delete(cluster.KindService, cluster.Key{Namespace: "testns", Name: "svc1"}) },
		func() {
			st.Upsert(&cluster.Service{Namespace: "testns", Name: "svc1", ClusterIPs: addrs("10.96.1.99"),
				Ports: []cluster.ServicePort{{Name: "grpc", Protocol: cluster.TCP, Port: 9000}}})
		},
		func() {
			st.Upsert(&cluster.EndpointSlice{Namespace: "testns", Name: "hdls-2", ServiceName: "hdls", AddressType: "IPv4",
				Ports:     []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 80}},
				Endpoints: []cluster.Endpoint{{Addresses: addrs("10.244.7.7"), Ready: true, Hostname: "web-1"}}})
		},
		func() { st.Delete(cluster.KindEndpointSlice, cluster.Key{Namespace: "testns", Name: "hdls-1"}) },
		func() { st.Delete(cluster.KindPod, cluster.Key{Namespace: "testns", Name: "pod2"}) },
		func() {
			st.Upsert(&cluster.Namespace{Name: "empty"})
			st.Delete(cluster.KindNamespace, cluster.Key{Name: "testns"})
		},
		func() {
			st.Upsert(&cluster.Service{Namespace: "kube-system", Name: "kube-dns", ClusterIPs: addrs("10.96.0.11"),
				Ports: []cluster.ServicePort{{Name: "dns", Protocol: cluster.UDP, Port: 53}}})
		},
		func() {
			for _, svc := range st.Services() {
				if svc.Namespace == "testns" {
					st.Delete(cluster.KindService, svc.Key())
				}
			}
			for _, pod := range st.Pods() {
				st.Delete(cluster.KindPod, pod.Key())
			}
		},
	}
	for i, step := range steps {
		step()
		z.Flush()
		fresh := NewZone(st, ZoneOptions{ShortNames: true, Pods: PodsVerified})
		fresh.Flush()
		if a, b := zoneDump(t, z), zoneDump(t, fresh); !maps.Equal(a, b) {
			t.Fatalf("step %d: answers differ:\n incremental %v\n rebuilt     %v", i, slices.Sorted(maps.Keys(a)), slices.Sorted(maps.Keys(b)))
		}
		a, b := z.snap.Load(), fresh.snap.Load()
		if fmt.Sprint(a.podIPs) != fmt.Sprint(b.podIPs) || fmt.Sprint(sortedKeys(a.namespaces)) != fmt.Sprint(sortedKeys(b.namespaces)) {
			t.Fatalf("step %d: pods or namespaces differ: %v/%v vs %v/%v", i, a.podIPs, a.namespaces, b.podIPs, b.namespaces)
		}
	}
	// The last steps removed testns entirely: its names are gone.
	s := NewServer(ServerOptions{Zone: z})
	if m := query(t, s, "testns.svc.cluster.local.", mdns.TypeA, false); m.Rcode != mdns.RcodeNameError {
		t.Errorf("testns after removal: %s, want NXDOMAIN", mdns.RcodeToString[m.Rcode])
	}
	if m := query(t, s, "ns.dns.cluster.local.", mdns.TypeA, false); len(m.Answer) != 1 || m.Answer[0].(*mdns.A).A.String() != "10.96.0.11" {
		t.Errorf("ns.dns after the kube-dns change: %v", m.Answer)
	}
}

// zoneDump is every answer z gives for the names and reverse records it
// holds, by question, with the SOA serial zeroed.
func zoneDump(t testing.TB, z *Zone) map[string]string {
	t.Helper()
	snap := *z.snap.Load()
	snap.serial = 0
	z.snap.Store(&snap)
	var names []string
	for n := range snap.names {
		names = append(names, presentName([]byte(n)))
	}
	for _, e := range snap.eps {
		for pos := 0; pos < len(e.byHost); pos += e.run(pos) {
			names = append(names, presentName(e.appendTarget(nil, int(e.byHost[pos]))))
		}
	}
	for a := range snap.ptr {
		names = append(names, reverseName(a))
	}
	for a := range snap.ptrMulti {
		names = append(names, reverseName(a))
	}
	s := NewServer(ServerOptions{Zone: z})
	out := map[string]string{}
	for _, n := range names {
		for _, qt := range []uint16{mdns.TypeA, mdns.TypeAAAA, mdns.TypeSRV, mdns.TypeTXT, mdns.TypePTR, mdns.TypeCNAME} {
			q := new(mdns.Msg)
			q.SetQuestion(n, qt)
			q.Id = 1
			pkt, err := q.Pack()
			if err != nil {
				t.Fatal(err)
			}
			if resp := s.Handle(context.Background(), pkt, true); resp != nil {
				out[n+" "+mdns.TypeToString[qt]] = string(resp)
			}
		}
	}
	return out
}

func reverseName(a netip.Addr) string {
	n, err := mdns.ReverseAddr(a.String())
	if err != nil {
		panic(err)
	}
	return n
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, presentName([]byte(k)))
	}
	slices.Sort(out)
	return out
}

// TestSharedAddresses covers the names and reverse records of addresses
// more than one endpoint or Service claims, as they are answered and as
// they change when a claim goes away.
func TestSharedAddresses(t *testing.T) {
	st := cluster.NewStore()
	http := []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}}
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, []cluster.Object{
		&cluster.Service{Namespace: "testns", Name: "a", ClusterIPs: addrs("10.96.5.1"), Ports: []cluster.ServicePort{{Name: "http", Protocol: cluster.TCP, Port: 80}}},
		&cluster.Service{Namespace: "default", Name: "b", Headless: true},
		&cluster.Service{Namespace: "testns", Name: "c", ClusterIPs: addrs("10.96.5.3"), Ports: []cluster.ServicePort{{Name: "http", Protocol: cluster.TCP, Port: 80}}},
		// 10.244.9.9 is an endpoint of a (twice, named alike) and b (two
		// hostnames); web has two addresses; 10.96.5.3 is c's cluster IP
		// and an endpoint of a.
		&cluster.EndpointSlice{Namespace: "testns", Name: "a-1", ServiceName: "a", AddressType: "IPv4", Ports: http,
			Endpoints: []cluster.Endpoint{{Addresses: addrs("10.244.9.9"), Ready: true}, {Addresses: addrs("10.96.5.3"), Ready: true}}},
		&cluster.EndpointSlice{Namespace: "testns", Name: "a-2", ServiceName: "a", AddressType: "IPv4", Ports: http,
			Endpoints: []cluster.Endpoint{{Addresses: addrs("10.244.9.9"), Ready: true}}},
		&cluster.EndpointSlice{Namespace: "default", Name: "b-1", ServiceName: "b", AddressType: "IPv4", Ports: http,
			Endpoints: []cluster.Endpoint{
				{Addresses: addrs("10.244.9.9"), Ready: true, Hostname: "web"},
				{Addresses: addrs("10.244.9.10"), Ready: true, Hostname: "web"},
				{Addresses: addrs("10.244.9.9"), Ready: true, Hostname: "db"},
			}},
	})
	st.MarkSynced()
	s, z := newTestServer(t, st, ZoneOptions{})
	for _, c := range []zoneCase{
		{qname: "9.9.244.10.in-addr.arpa.", qtype: mdns.TypePTR, answer: []string{
			"9.9.244.10.in-addr.arpa. 5 IN PTR web.b.default.svc.cluster.local.",
			"9.9.244.10.in-addr.arpa. 5 IN PTR db.b.default.svc.cluster.local.",
			"9.9.244.10.in-addr.arpa. 5 IN PTR 10-244-9-9.a.testns.svc.cluster.local.",
		}},
		{qname: "3.5.96.10.in-addr.arpa.", qtype: mdns.TypePTR, answer: []string{"3.5.96.10.in-addr.arpa. 5 IN PTR c.testns.svc.cluster.local."}},
		{qname: "10-244-9-9.a.testns.svc.cluster.local.", qtype: mdns.TypeSRV,
			answer: []string{"10-244-9-9.a.testns.svc.cluster.local. 5 IN SRV 0 50 8080 10-244-9-9.a.testns.svc.cluster.local."},
			extra:  []string{"10-244-9-9.a.testns.svc.cluster.local. 5 IN A 10.244.9.9"}},
		{qname: "web.b.default.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{
			"web.b.default.svc.cluster.local. 5 IN A 10.244.9.9", "web.b.default.svc.cluster.local. 5 IN A 10.244.9.10"}},
		{qname: "web.b.default.svc.cluster.local.", qtype: mdns.TypeSRV,
			answer: []string{"web.b.default.svc.cluster.local. 5 IN SRV 0 50 8080 web.b.default.svc.cluster.local."},
			extra:  []string{"web.b.default.svc.cluster.local. 5 IN A 10.244.9.9", "web.b.default.svc.cluster.local. 5 IN A 10.244.9.10"}},
		{qname: "db.b.default.svc.cluster.local.", qtype: mdns.TypeA, answer: []string{"db.b.default.svc.cluster.local. 5 IN A 10.244.9.9"}},
		nodata("db.b.default.svc.cluster.local.", mdns.TypeAAAA),
		nodata("db.b.default.svc.cluster.local.", mdns.TypeTXT),
		nxdomain("nope.b.default.svc.cluster.local.", mdns.TypeA),
		nxdomain("x.web.b.default.svc.cluster.local.", mdns.TypeA),
	} {
		checkCase(t, s, z, c)
	}
	// The PTR records' order is answered as is: check it, not just the set.
	m := query(t, s, "9.9.244.10.in-addr.arpa.", mdns.TypePTR, false)
	var got []string
	for _, rr := range m.Answer {
		got = append(got, rr.(*mdns.PTR).Ptr)
	}
	if want := []string{"web.b.default.svc.cluster.local.", "db.b.default.svc.cluster.local.", "10-244-9-9.a.testns.svc.cluster.local."}; !slices.Equal(got, want) {
		t.Errorf("PTR order %q, want %q", got, want)
	}

	st.Delete(cluster.KindService, cluster.Key{Namespace: "default", Name: "b"})
	st.Delete(cluster.KindService, cluster.Key{Namespace: "testns", Name: "c"})
	z.Flush()
	for _, c := range []zoneCase{
		{qname: "9.9.244.10.in-addr.arpa.", qtype: mdns.TypePTR, answer: []string{"9.9.244.10.in-addr.arpa. 5 IN PTR 10-244-9-9.a.testns.svc.cluster.local."}},
		{qname: "3.5.96.10.in-addr.arpa.", qtype: mdns.TypePTR, answer: []string{"3.5.96.10.in-addr.arpa. 5 IN PTR 10-96-5-3.a.testns.svc.cluster.local."}},
		{qname: "10.9.244.10.in-addr.arpa.", qtype: mdns.TypePTR, rcode: mdns.RcodeRefused},
		nxdomain("web.b.default.svc.cluster.local.", mdns.TypeA),
	} {
		checkCase(t, s, z, c)
	}
	if snap := z.snap.Load(); len(snap.ptrMulti) != 0 {
		t.Errorf("%d addresses with several owners left, want 0", len(snap.ptrMulti))
	}
}

// randState adds to st about 40 Services of every kind (some replacing
// others) with slices whose endpoints draw from a small pool of addresses,
// so that addresses, hostnames and ports repeat within and across
// Services, and a few Pods with hostnames.
func randState(rng *rand.Rand, st *cluster.Store) {
	pool := func() netip.Addr {
		if rng.IntN(6) == 0 {
			return netip.MustParseAddr(fmt.Sprintf("fd00::%x", rng.IntN(30)))
		}
		return netip.AddrFrom4([4]byte{10, 244, 0, byte(rng.IntN(60))})
	}
	nss := []string{"a", "a-b", "b", "kube-system"}
	pnames := []string{"", "http", "dns", "HTTP"}
	protos := []cluster.Protocol{cluster.TCP, cluster.UDP, ""}
	for i := range 40 {
		ns := nss[rng.IntN(len(nss))]
		name := fmt.Sprintf("s%d", rng.IntN(30))
		svc := &cluster.Service{Namespace: ns, Name: name, Type: cluster.ServiceTypeClusterIP}
		switch rng.IntN(6) {
		case 0:
			svc.Headless = true
		case 1:
			svc.Headless = true
			svc.PublishNotReadyAddresses = true
		case 2:
			svc.Type = cluster.ServiceTypeExternalName
			svc.ExternalName = "x.example.test"
		default:
			svc.ClusterIPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(rng.IntN(40))})}
			if rng.IntN(4) == 0 {
				svc.ClusterIPs = append(svc.ClusterIPs, netip.MustParseAddr(fmt.Sprintf("fd00::%x", rng.IntN(30))))
			}
			if rng.IntN(5) == 0 {
				svc.ClusterIPs = append(svc.ClusterIPs, pool())
			}
			for range rng.IntN(3) {
				svc.Ports = append(svc.Ports, cluster.ServicePort{Name: pnames[rng.IntN(len(pnames))], Protocol: protos[rng.IntN(3)], Port: uint16(80 + rng.IntN(3))})
			}
		}
		st.Upsert(svc)
		for k := range rng.IntN(3) {
			sl := &cluster.EndpointSlice{Namespace: ns, Name: fmt.Sprintf("%s-%d-%d", name, i, k), ServiceName: name, AddressType: []string{"IPv4", "IPv6", "", "FQDN"}[rng.IntN(4)]}
			for range rng.IntN(4) {
				sl.Ports = append(sl.Ports, cluster.EndpointPort{Name: pnames[rng.IntN(len(pnames))], Protocol: protos[rng.IntN(3)], Port: uint16(8080 + rng.IntN(3))})
			}
			for range rng.IntN(5) {
				ep := cluster.Endpoint{Ready: rng.IntN(5) != 0}
				for range 1 + rng.IntN(2) {
					ep.Addresses = append(ep.Addresses, pool())
				}
				switch rng.IntN(5) {
				case 0:
					ep.Hostname = []string{"web-0", "Web-1", "db"}[rng.IntN(3)]
				case 1:
					ep.TargetPod = fmt.Sprintf("p%d", rng.IntN(5))
				}
				sl.Endpoints = append(sl.Endpoints, ep)
			}
			st.Upsert(sl)
		}
	}
	for i := range 5 {
		st.Upsert(&cluster.Pod{Namespace: nss[rng.IntN(len(nss))], Name: fmt.Sprintf("p%d", i), IPs: []netip.Addr{pool()},
			Hostname: []string{"", "mypod", "h"}[rng.IntN(3)], Subdomain: fmt.Sprintf("s%d", rng.IntN(30))})
	}
}

// TestIncrementalMatchesRebuildRandom changes random states at random and
// checks after every change that the incrementally kept index answers
// exactly as one built from scratch.
func TestIncrementalMatchesRebuildRandom(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 2))
		st := cluster.NewStore()
		randState(rng, st)
		st.MarkSynced()
		opts := ZoneOptions{ShortNames: seed%2 == 0, Pods: PodsVerified}
		z := NewZone(st, opts)
		z.Flush()
		for step := range 5 {
			randState(rng, st)
			for _, sl := range st.List(cluster.KindEndpointSlice) {
				if rng.IntN(4) == 0 {
					st.Delete(cluster.KindEndpointSlice, sl.Key())
				}
			}
			for _, svc := range st.Services() {
				if rng.IntN(6) == 0 {
					st.Delete(cluster.KindService, svc.Key())
				}
			}
			z.Flush()
			fresh := NewZone(st, opts)
			fresh.Flush()
			if a, b := zoneDump(t, z), zoneDump(t, fresh); !maps.Equal(a, b) {
				for k := range b {
					if a[k] != b[k] {
						t.Errorf("seed %d step %d: %s differs", seed, step, k)
					}
				}
				t.Fatalf("seed %d step %d: %d answers incremental, %d rebuilt", seed, step, len(a), len(b))
			}
		}
	}
}

// TestZoneLoadedClosesWithTheFirstSyncedIndex: Loaded stays open while the
// Store is not synced, however often the index is flushed, and closes with
// the first flush after it is.
func TestZoneLoadedClosesWithTheFirstSyncedIndex(t *testing.T) {
	st := cluster.NewStore()
	z := NewZone(st, ZoneOptions{Domain: "cluster.local"})
	st.Upsert(&cluster.Namespace{Name: "default"})
	z.Flush()
	select {
	case <-z.Loaded():
		t.Fatal("Loaded closed before the Store synced")
	default:
	}
	st.MarkSynced()
	z.Flush()
	select {
	case <-z.Loaded():
	default:
		t.Fatal("Loaded still open after a flush of the synced Store")
	}
	if !z.Synced() {
		t.Error("Loaded closed but Synced is false")
	}
}
