package dns

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/podnet/podnet/dataplane/cluster"
)

// autopathSetup is the test cluster with a client pod in testns at
// 10.244.9.9 (and 127.0.0.1, for the UDP test), two host-network pods of
// different namespaces on 192.168.10.11, and an upstream that knows
// example.com. and svc.corp.test. only.
type autopathSetup struct {
	*fwdSetup
	up *goUpstream
	mu sync.Mutex
	// asked are the names the upstream was asked, in order.
	asked []string
}

func newAutopathSetup(t *testing.T, ap *AutopathOptions) *autopathSetup {
	t.Helper()
	a := &autopathSetup{}
	a.up = startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) {
		name := r.Question[0].Name
		if name == "." {
			return // the forwarder's health probe
		}
		a.mu.Lock()
		a.asked = append(a.asked, name)
		a.mu.Unlock()
		m := new(mdns.Msg)
		m.SetReply(r)
		switch {
		case name == "example.com." && r.Question[0].Qtype == mdns.TypeA:
			m.Answer = aRecords(name, 1)
		case name == "example.com.", name == "www.corp.test.":
			if r.Question[0].Qtype == mdns.TypeA {
				m.Answer = aRecords(name, 1)
			}
		default:
			m.Rcode = mdns.RcodeNameError
		}
		w.WriteMsg(m)
	})
	a.fwdSetup = newForwardingServer(t, ForwardOptions{Upstreams: []netip.AddrPort{a.up.addr}}, CacheOptions{})
	a.st.Upsert(&cluster.Pod{Namespace: "testns", Name: "client", IPs: addrs("10.244.9.9", "127.0.0.1")})
	a.st.Upsert(&cluster.Pod{Namespace: "kube-system", Name: "proxyd-x", IPs: addrs("192.168.10.11")})
	a.st.Upsert(&cluster.Pod{Namespace: "testns", Name: "hostnet", IPs: addrs("192.168.10.11")})
	a.zone = NewZone(a.st, ZoneOptions{ShortNames: true, PodIndex: true})
	a.zone.Flush()
	a.srv = NewServer(ServerOptions{Zone: a.zone, Forwarder: a.fwd, Cache: a.cache, Metrics: a.m, Autopath: ap})
	return a
}

func (a *autopathSetup) ask(t *testing.T, from, name string, qtype uint16) *mdns.Msg {
	t.Helper()
	a.mu.Lock()
	a.asked = nil
	a.mu.Unlock()
	q := new(mdns.Msg)
	q.SetQuestion(name, qtype)
	pkt, _ := q.Pack()
	resp := a.srv.handleFrom(context.Background(), pkt, netip.AddrPortFrom(netip.MustParseAddr(from), 40000), false)
	m := new(mdns.Msg)
	if resp == nil || m.Unpack(resp) != nil {
		t.Fatalf("%s from %s: no answer", name, from)
	}
	if m.Id != q.Id || len(m.Question) != 1 || m.Question[0].Name != name {
		t.Fatalf("%s: answer does not match the question: %v", name, m)
	}
	return m
}

func (a *autopathSetup) upstreamAsked() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.asked)
}

func TestAutopath(t *testing.T) {
	a := newAutopathSetup(t, &AutopathOptions{Search: []string{"corp.test"}})
	const client = "10.244.9.9"
	for _, c := range []struct {
		what, from, name string
		qtype            uint16
		rcode            int
		answer           []string
		upstream         []string // the names the upstream is asked
	}{
		{what: "external name: found at the end of the path",
			from: client, name: "example.com.testns.svc.cluster.local.", qtype: mdns.TypeA,
			answer: []string{
				"example.com.testns.svc.cluster.local. 30 IN CNAME example.com.",
				"example.com. 30 IN A 192.0.2.1",
			},
			upstream: []string{"example.com.corp.test.", "example.com."}},
		{what: "a node search domain",
			from: client, name: "www.testns.svc.cluster.local.", qtype: mdns.TypeA,
			answer:   []string{"www.testns.svc.cluster.local. 30 IN CNAME www.corp.test.", "www.corp.test. 30 IN A 192.0.2.1"},
			upstream: []string{"www.corp.test."}},
		{what: "a Service of another namespace, by <svc>.<ns>",
			from: client, name: "kubernetes.default.testns.svc.cluster.local.", qtype: mdns.TypeA,
			answer: []string{
				"kubernetes.default.testns.svc.cluster.local. 5 IN CNAME kubernetes.default.svc.cluster.local.",
				"kubernetes.default.svc.cluster.local. 5 IN A 10.96.0.1",
			}},
		{what: "NODATA further along is the answer (no records, no CNAME)",
			from: client, name: "example.com.testns.svc.cluster.local.", qtype: mdns.TypeAAAA,
			upstream: []string{"example.com.corp.test.", "example.com."}},
		{what: "a name of the client's namespace answers as ever",
			from: client, name: "svc1.testns.svc.cluster.local.", qtype: mdns.TypeA,
			answer: []string{"svc1.testns.svc.cluster.local. 5 IN A 10.96.1.1"}},
		{what: "nothing anywhere: the first answer, and the client walks on",
			from: client, name: "nosuch.testns.svc.cluster.local.", qtype: mdns.TypeA, rcode: mdns.RcodeNameError,
			upstream: []string{"nosuch.corp.test.", "nosuch."}},
		{what: "a name under another namespace is not the first search domain",
			from: client, name: "example.com.default.svc.cluster.local.", qtype: mdns.TypeA, rcode: mdns.RcodeNameError},
		{what: "a client no pod holds",
			from: "10.244.7.7", name: "example.com.testns.svc.cluster.local.", qtype: mdns.TypeA, rcode: mdns.RcodeNameError},
		{what: "an address pods of two namespaces hold (host network)",
			from: "192.168.10.11", name: "example.com.testns.svc.cluster.local.", qtype: mdns.TypeA, rcode: mdns.RcodeNameError},
	} {
		t.Run(c.what, func(t *testing.T) {
			m := a.ask(t, c.from, c.name, c.qtype)
			if m.Rcode != c.rcode {
				t.Fatalf("rcode %s, want %s: %v", mdns.RcodeToString[m.Rcode], mdns.RcodeToString[c.rcode], m)
			}
			if got, want := rrStrings(m.Answer), normRRs(t, c.answer, 0); !slices.Equal(got, want) {
				t.Errorf("answer\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if c.rcode == mdns.RcodeNameError && (len(m.Ns) != 1 || m.Ns[0].Header().Rrtype != mdns.TypeSOA) {
				t.Errorf("NXDOMAIN without the zone's SOA: %v", m.Ns)
			}
			if got := a.upstreamAsked(); !slices.Equal(got, c.upstream) {
				t.Errorf("upstream asked %q, want %q", got, c.upstream)
			}
		})
	}
	// Every search step is a query of dnsd's own: the client's queries
	// are counted once each, and the walks that found a name.
	if got := testutil.ToFloat64(a.m.autopathSuccess); got != 4 {
		t.Errorf("coredns_autopath_success_total %v, want 4 (the first four cases)", got)
	}
}

func TestAutopathOff(t *testing.T) {
	a := newAutopathSetup(t, nil)
	m := a.ask(t, "10.244.9.9", "example.com.testns.svc.cluster.local.", mdns.TypeA)
	if m.Rcode != mdns.RcodeNameError || len(m.Answer) != 0 || len(a.upstreamAsked()) != 0 {
		t.Errorf("autopath off: %v, upstream asked %q; want NXDOMAIN and no upstream query", m, a.upstreamAsked())
	}
}

// TestAutopathQueriesOnTheWire counts the queries a stub resolver with
// ndots:5 sends for one external name, the way glibc walks its search path:
// each search domain until one is not NXDOMAIN, then the name as given.
func TestAutopathQueriesOnTheWire(t *testing.T) {
	search := []string{"testns.svc.cluster.local.", "svc.cluster.local.", "cluster.local.", "corp.test."}
	walk := func(a *autopathSetup) (int, *mdns.Msg) {
		n := 0
		for _, dom := range append(search, "") {
			n++
			m := a.ask(t, "10.244.9.9", "example.com."+dom, mdns.TypeA)
			if m.Rcode != mdns.RcodeNameError {
				return n, m
			}
		}
		return n, nil
	}
	for _, c := range []struct {
		ap   *AutopathOptions
		want int
	}{{nil, 5}, {&AutopathOptions{Search: []string{"corp.test"}}, 1}} {
		n, m := walk(newAutopathSetup(t, c.ap))
		if m == nil || len(m.Answer) == 0 || m.Answer[len(m.Answer)-1].(*mdns.A).A.String() != "192.0.2.1" {
			t.Fatalf("autopath %v: example.com not found: %v", c.ap != nil, m)
		}
		if n != c.want {
			t.Errorf("autopath %v: %d queries on the wire for example.com, want %d", c.ap != nil, n, c.want)
		}
		t.Logf("autopath %v: %d queries on the wire", c.ap != nil, n)
	}
}

// TestAutopathOverUDP goes through a UDP worker: the walk needs the
// upstream, so it is answered off the fast path, from the client's source
// address.
func TestAutopathOverUDP(t *testing.T) {
	a := newAutopathSetup(t, &AutopathOptions{})
	addr := runLoopback(t, ServerOptions{Zone: a.zone, Forwarder: a.fwd, Cache: a.cache, Autopath: &AutopathOptions{}})
	c := &mdns.Client{Net: "udp", Timeout: 2 * time.Second, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}}}
	q := new(mdns.Msg)
	q.SetQuestion("example.com.testns.svc.cluster.local.", mdns.TypeA)
	m, _, err := c.Exchange(q, addr.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Answer) != 2 || m.Answer[0].(*mdns.CNAME).Target != "example.com." {
		t.Errorf("over UDP: %v, want the CNAME to example.com. and its A", m)
	}
}

// TestPodIndex follows Pods coming, going and sharing addresses.
func TestPodIndex(t *testing.T) {
	st := cluster.NewStore()
	st.MarkSynced()
	z := NewZone(st, ZoneOptions{PodIndex: true})
	z.Flush()
	check := func(addr, want string) {
		t.Helper()
		ns, ok := z.ClientNamespace(netip.MustParseAddr(addr))
		if ns != want || ok != (want != "") {
			t.Errorf("ClientNamespace(%s) = %q %v, want %q", addr, ns, ok, want)
		}
	}
	st.Upsert(&cluster.Pod{Namespace: "a", Name: "p", IPs: addrs("10.244.1.2", "fd00:10:244:1::2")})
	z.Flush()
	check("10.244.1.2", "a")
	check("fd00:10:244:1::2", "a")
	check("::ffff:10.244.1.2", "a")
	st.Upsert(&cluster.Pod{Namespace: "B", Name: "q", IPs: addrs("10.244.1.2")})
	z.Flush()
	check("10.244.1.2", "")
	check("fd00:10:244:1::2", "a")
	st.Delete(cluster.KindPod, cluster.Key{Namespace: "a", Name: "p"})
	z.Flush()
	check("10.244.1.2", "b")
	check("fd00:10:244:1::2", "")
	st.Upsert(&cluster.Pod{Namespace: "B", Name: "q", IPs: addrs("10.244.1.3")})
	z.Flush()
	check("10.244.1.2", "")
	check("10.244.1.3", "b")

	// Without PodIndex the zone keeps no index.
	z2 := NewZone(st, ZoneOptions{})
	z2.Flush()
	if _, ok := z2.ClientNamespace(netip.MustParseAddr("10.244.1.3")); ok {
		t.Error("pod index kept without ZoneOptions.PodIndex")
	}
}
