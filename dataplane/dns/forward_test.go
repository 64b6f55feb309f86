package dns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/dataplane/testport"
)

// freePort returns a loopback port free for both UDP and TCP right now.
func freePort(t testing.TB) uint16 { return uint16(testport.Free(t)) }

// startDnsmasq runs Debian's dnsmasq on a loopback port with the test's
// records and waits until it answers.
func startDnsmasq(t testing.TB, port uint16, args ...string) *exec.Cmd {
	t.Helper()
	bin := roottest.Tool(t, "dnsmasq", "dnsmasq-base")
	all := append([]string{"--no-daemon", "--no-resolv", "--no-hosts", "--bind-interfaces", "--listen-address=127.0.0.1",
		fmt.Sprintf("--port=%d", port), "--user=" + currentUser(), "--pid-file="}, args...)
	cmd := exec.Command(bin, all...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	c := &mdns.Client{Timeout: 100 * time.Millisecond}
	q := new(mdns.Msg)
	q.SetQuestion("ready.example.test.", mdns.TypeA)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		select {
		case <-exited:
			t.Fatalf("dnsmasq exited: %s", out.String())
		default:
		}
		if _, _, err := c.Exchange(q, fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			return cmd
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("dnsmasq does not answer: %s", out.String())
	return nil
}

func currentUser() string {
	out, err := exec.Command("id", "-un").Output()
	if err != nil {
		return "root"
	}
	return strings.TrimSpace(string(out))
}

// goUpstream is a small miekg/dns server on loopback for behaviours no real
// resolver shows on demand (truncation, forged answers).
type goUpstream struct {
	addr    netip.AddrPort
	udp     atomic.Int32
	tcp     atomic.Int32
	servers []*mdns.Server
}

// answerA answers r with one A record for its question name.
func answerA(w mdns.ResponseWriter, r *mdns.Msg, ttl int, addr string) {
	m := new(mdns.Msg)
	m.SetReply(r)
	m.Answer = []mdns.RR{mustRR(fmt.Sprintf("%s %d IN A %s", r.Question[0].Name, ttl, addr))}
	w.WriteMsg(m)
}

// listenUDPAndTCP opens a UDP socket and a TCP listener on one free
// loopback port (a UDP port the kernel picks may be taken for TCP).
func listenUDPAndTCP(t testing.TB) (net.PacketConn, net.Listener) {
	for try := 0; ; try++ {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, l
		}
		pc.Close()
		if try == 20 {
			t.Fatal(err)
		}
	}
}

func startGoUpstream(t testing.TB, h func(w mdns.ResponseWriter, r *mdns.Msg, tcp bool)) *goUpstream {
	t.Helper()
	pc, l := listenUDPAndTCP(t)
	u := &goUpstream{addr: pc.LocalAddr().(*net.UDPAddr).AddrPort()}
	handler := mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) {
		tcp := w.RemoteAddr().Network() == "tcp"
		if tcp {
			u.tcp.Add(1)
		} else {
			u.udp.Add(1)
		}
		h(w, r, tcp)
	})
	var started sync.WaitGroup
	started.Add(2)
	for _, s := range []*mdns.Server{{PacketConn: pc, Handler: handler}, {Listener: l, Handler: handler}} {
		s.NotifyStartedFunc = started.Done
		u.servers = append(u.servers, s)
		go s.ActivateAndServe()
	}
	started.Wait()
	t.Cleanup(func() {
		for _, s := range u.servers {
			s.Shutdown()
		}
	})
	return u
}

func aRecords(name string, n int) []mdns.RR {
	var out []mdns.RR
	for i := range n {
		rr, _ := mdns.NewRR(fmt.Sprintf("%s 300 IN A 192.0.2.%d", name, i+1))
		out = append(out, rr)
	}
	return out
}

type fwdSetup struct {
	srv   *Server
	fwd   *Forwarder
	cache *Cache
	reg   *prometheus.Registry
	m     *Metrics
	st    *cluster.Store
	zone  *Zone
}

func newForwardingServer(t testing.TB, fo ForwardOptions, co CacheOptions) *fwdSetup {
	t.Helper()
	if fo.TryTimeout == 0 {
		fo.TryTimeout = 300 * time.Millisecond
	}
	if fo.Deadline == 0 {
		fo.Deadline = time.Second
	}
	if fo.HealthInterval == 0 {
		fo.HealthInterval = 50 * time.Millisecond
	}
	fwd, err := NewForwarder(fo)
	if err != nil {
		t.Fatal(err)
	}
	// No fwd.Run: its loop probes would count as upstream queries. Stop
	// the health checks at the end instead.
	t.Cleanup(func() { fwd.doneOnce.Do(func() { close(fwd.done) }) })
	st := testState()
	z := NewZone(st, ZoneOptions{ShortNames: true})
	z.Flush()
	cache := NewCache(co)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, z, cache, fwd)
	return &fwdSetup{srv: NewServer(ServerOptions{Zone: z, Forwarder: fwd, Cache: cache, Metrics: m}), fwd: fwd, cache: cache, reg: reg, m: m, st: st, zone: z}
}

func TestForwardThroughDnsmasq(t *testing.T) {
	port := freePort(t)
	startDnsmasq(t, port, "--address=/example.test/192.0.2.1", "--txt-record=txt.example.test,hello")
	up := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	fs := newForwardingServer(t, ForwardOptions{Upstreams: []netip.AddrPort{up}}, CacheOptions{})

	m := query(t, fs.srv, "www.example.test.", mdns.TypeA, false)
	if m.Rcode != mdns.RcodeSuccess || len(m.Answer) != 1 || m.Answer[0].(*mdns.A).A.String() != "192.0.2.1" {
		t.Fatalf("forwarded answer: %v", m)
	}
	m = query(t, fs.srv, "txt.example.test.", mdns.TypeTXT, true)
	if len(m.Answer) != 1 || m.Answer[0].(*mdns.TXT).Txt[0] != "hello" {
		t.Fatalf("TXT: %v", m)
	}
	// Second time from the cache, with the client's case and ID.
	m = query(t, fs.srv, "WWW.Example.TEST.", mdns.TypeA, false)
	if len(m.Answer) != 1 || m.Answer[0].Header().Name != "WWW.Example.TEST." {
		t.Fatalf("cached answer: %v", m)
	}
	if got := testutil.ToFloat64(fs.m.cacheHits.WithLabelValues("dns://:53", "success", ".", "")); got != 1 {
		t.Errorf("cache hits %v, want 1", got)
	}
	if got := testutil.ToFloat64(fs.m.forwardRequests.WithLabelValues(up.String())); got != 2 {
		t.Errorf("forwarded %v queries, want 2", got)
	}
	// ExternalName: the CNAME, then the target through the forwarder.
	m = query(t, fs.srv, "ext.testns.svc.cluster.local.", mdns.TypeA, false)
	want := []string{"ext.testns.svc.cluster.local.\t5\tIN\tCNAME\texample.test.", "example.test.\t0\tIN\tA\t192.0.2.1"}
	if got := rrStrings(m.Answer); m.Rcode != 0 || !m.Authoritative || len(got) != 2 || got[0] != want[1] && !strings.HasPrefix(got[0], "example.test.") {
		t.Fatalf("ExternalName answer: %v", m)
	}
	if m.Answer[0].Header().Rrtype != mdns.TypeCNAME || m.Answer[1].(*mdns.A).A.String() != "192.0.2.1" {
		t.Fatalf("ExternalName answer order: %v", m.Answer)
	}
	// A reverse name the cluster does not own goes upstream too.
	if m := query(t, fs.srv, "9.9.9.9.in-addr.arpa.", mdns.TypePTR, false); m.Rcode == mdns.RcodeRefused && m.Authoritative {
		t.Fatalf("reverse name outside the cluster answered by dnsd: %v", m)
	}
}

func TestNegativeAnswersCached(t *testing.T) {
	up := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) {
		m := new(mdns.Msg)
		m.SetRcode(r, mdns.RcodeNameError)
		soa, _ := mdns.NewRR("test. 60 IN SOA ns.test. host.test. 1 2 3 4 60")
		m.Ns = []mdns.RR{soa}
		w.WriteMsg(m)
	})
	fs := newForwardingServer(t, ForwardOptions{Upstreams: []netip.AddrPort{up.addr}}, CacheOptions{})
	for range 3 {
		if m := query(t, fs.srv, "gone.test.", mdns.TypeA, false); m.Rcode != mdns.RcodeNameError || len(m.Ns) != 1 {
			t.Fatalf("negative answer: %v", m)
		}
	}
	if n := up.udp.Load(); n != 1 {
		t.Errorf("upstream asked %d times, want 1 (negative caching)", n)
	}
}

func TestTruncatedAnswerRetriedOverTCP(t *testing.T) {
	up := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, tcp bool) {
		m := new(mdns.Msg)
		m.SetReply(r)
		if !tcp {
			m.Truncated = true
		} else {
			m.Answer = aRecords(r.Question[0].Name, 60)
		}
		w.WriteMsg(m)
	})
	fs := newForwardingServer(t, ForwardOptions{Upstreams: []netip.AddrPort{up.addr}}, CacheOptions{})
	m := query(t, fs.srv, "big.test.", mdns.TypeA, true)
	if len(m.Answer) != 60 || m.Truncated {
		t.Fatalf("EDNS0 client: %d answers, TC %v; want 60, no TC", len(m.Answer), m.Truncated)
	}
	if up.tcp.Load() != 1 {
		t.Errorf("TCP queries %d, want 1", up.tcp.Load())
	}
	// A client without EDNS0 gets at most 512 bytes, with TC set.
	q := new(mdns.Msg)
	q.SetQuestion("big.test.", mdns.TypeA)
	pkt, _ := q.Pack()
	resp := fs.srv.Handle(context.Background(), pkt, false)
	if len(resp) > 512 {
		t.Fatalf("answer to a non-EDNS0 client is %d bytes", len(resp))
	}
	var small mdns.Msg
	if err := small.Unpack(resp); err != nil || !small.Truncated || len(small.Answer) >= 60 {
		t.Fatalf("non-EDNS0 answer: err %v, TC %v, %d answers", err, small.Truncated, len(small.Answer))
	}
	// Over TCP the same client gets everything.
	resp = fs.srv.Handle(context.Background(), pkt, true)
	var full mdns.Msg
	if err := full.Unpack(resp); err != nil || full.Truncated || len(full.Answer) != 60 {
		t.Fatalf("TCP answer: err %v, TC %v, %d answers", err, full.Truncated, len(full.Answer))
	}
}

func TestForgedAnswersDropped(t *testing.T) {
	up := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) {
		forged := new(mdns.Msg)
		forged.SetReply(r)
		forged.Id = r.Id + 1
		forged.Answer, _ = []mdns.RR{mustRR("a.test. 300 IN A 6.6.6.6")}, 0
		w.WriteMsg(forged)
		wrongQ := new(mdns.Msg)
		wrongQ.SetReply(r)
		wrongQ.Question[0].Name = "b.test."
		wrongQ.Answer = []mdns.RR{mustRR("b.test. 300 IN A 6.6.6.7")}
		w.WriteMsg(wrongQ)
		good := new(mdns.Msg)
		good.SetReply(r)
		good.Answer = []mdns.RR{mustRR("a.test. 300 IN A 192.0.2.7")}
		w.WriteMsg(good)
	})
	fs := newForwardingServer(t, ForwardOptions{Upstreams: []netip.AddrPort{up.addr}}, CacheOptions{})
	m := query(t, fs.srv, "a.test.", mdns.TypeA, false)
	if len(m.Answer) != 1 || m.Answer[0].(*mdns.A).A.String() != "192.0.2.7" {
		t.Fatalf("answer %v, want the genuine 192.0.2.7", m.Answer)
	}
	if got := fs.fwd.forged.Load(); got != 2 {
		t.Errorf("%d forged answers dropped, want 2", got)
	}
}

func mustRR(s string) mdns.RR {
	rr, err := mdns.NewRR(s)
	if err != nil {
		panic(err)
	}
	return rr
}

// blackhole is a UDP socket that reads and never answers.
func blackhole(t testing.TB) netip.AddrPort {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		b := make([]byte, 1500)
		for {
			if _, _, err := pc.ReadFrom(b); err != nil {
				return
			}
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

func TestOneUpstreamDown(t *testing.T) {
	good := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) {
		answerA(w, r, 300, "192.0.2.9")
	})
	dead := blackhole(t)
	fs := newForwardingServer(t, ForwardOptions{
		Upstreams: []netip.AddrPort{dead, good.addr}, Policy: PolicySequential,
		TryTimeout: 100 * time.Millisecond, HealthInterval: time.Hour,
	}, CacheOptions{})
	deadTries := func() float64 { return testutil.ToFloat64(fs.m.forwardRequests.WithLabelValues(dead.String())) }
	for i := range 3 {
		before := deadTries()
		m := query(t, fs.srv, fmt.Sprintf("n%d.test.", i), mdns.TypeA, false)
		if m.Rcode != 0 || len(m.Answer) != 1 {
			t.Fatalf("query %d with one upstream down: %v", i, m)
		}
		if i == 2 && deadTries() != before {
			t.Errorf("the upstream marked down was still tried")
		}
	}
	if fs.fwd.Healthy(dead) {
		t.Error("the dead upstream is not marked down after two failures")
	}
	if !fs.fwd.Healthy(good.addr) {
		t.Error("the good upstream is marked down")
	}
}

func TestUpstreamRecovers(t *testing.T) {
	port := freePort(t)
	up := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	fs := newForwardingServer(t, ForwardOptions{Upstreams: []netip.AddrPort{up}, TryTimeout: 100 * time.Millisecond}, CacheOptions{})
	for range 2 {
		if m := query(t, fs.srv, "x.example.test.", mdns.TypeA, false); m.Rcode != mdns.RcodeServerFailure {
			t.Fatalf("no upstream running: %s, want SERVFAIL", mdns.RcodeToString[m.Rcode])
		}
	}
	if fs.fwd.Healthy(up) {
		t.Fatal("upstream not marked down")
	}
	startDnsmasq(t, port, "--address=/example.test/192.0.2.1")
	deadline := time.Now().Add(3 * time.Second)
	for !fs.fwd.Healthy(up) {
		if time.Now().After(deadline) {
			t.Fatal("health check did not bring the upstream back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if m := query(t, fs.srv, "x.example.test.", mdns.TypeA, false); m.Rcode != 0 || len(m.Answer) != 1 {
		t.Fatalf("after recovery: %v", m)
	}
}

func TestAllUpstreamsDown(t *testing.T) {
	var answering atomic.Bool
	answering.Store(true)
	up := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) {
		if !answering.Load() {
			return // silence, like a dead resolver
		}
		answerA(w, r, 60, "192.0.2.10")
	})
	fs := newForwardingServer(t, ForwardOptions{
		Upstreams: []netip.AddrPort{up.addr, blackhole(t)}, TryTimeout: 150 * time.Millisecond, Deadline: 400 * time.Millisecond,
		HealthInterval: time.Hour,
	}, CacheOptions{StaleFor: time.Hour})
	now := time.Now()
	fs.cache.now = func() time.Time { return now }
	// Warm the cache while one upstream answers (random policy: retry until
	// the answering one was asked).
	for i := 0; ; i++ {
		m := query(t, fs.srv, "stale.test.", mdns.TypeA, false)
		if m.Rcode == 0 {
			break
		}
		if i > 10 {
			t.Fatal("could not warm the cache")
		}
	}
	answering.Store(false)
	now = now.Add(2 * time.Minute) // past the 60 s TTL

	m := query(t, fs.srv, "stale.test.", mdns.TypeA, false)
	if m.Rcode != 0 || len(m.Answer) != 1 || m.Answer[0].Header().Ttl != staleTTL {
		t.Fatalf("stale answer: %v", m)
	}
	start := time.Now()
	m = query(t, fs.srv, "never-cached.test.", mdns.TypeA, false)
	took := time.Since(start)
	if m.Rcode != mdns.RcodeServerFailure {
		t.Fatalf("uncached name with every upstream down: %s, want SERVFAIL", mdns.RcodeToString[m.Rcode])
	}
	if took > time.Second { // the 400 ms deadline, and slack for a loaded CI box
		t.Errorf("SERVFAIL after %v, deadline is 400ms", took)
	}
	if got := testutil.ToFloat64(fs.m.cacheStale); got != 1 {
		t.Errorf("stale answers %v, want 1", got)
	}
}

func TestConcurrencyCap(t *testing.T) {
	fs := newForwardingServer(t, ForwardOptions{Upstreams: []netip.AddrPort{blackhole(t)}, MaxConcurrent: 1,
		TryTimeout: 500 * time.Millisecond, Deadline: 500 * time.Millisecond, MaxFails: 100}, CacheOptions{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		q := new(mdns.Msg)
		q.SetQuestion("slow.test.", mdns.TypeA)
		pkt, _ := q.Pack()
		fs.srv.Handle(context.Background(), pkt, false)
	}()
	deadline := time.Now().Add(time.Second)
	for len(fs.fwd.sem) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if m := query(t, fs.srv, "other.test.", mdns.TypeA, false); m.Rcode != mdns.RcodeRefused {
		t.Errorf("past the cap: %s, want REFUSED", mdns.RcodeToString[m.Rcode])
	}
	<-done
}

func TestPrefetch(t *testing.T) {
	up := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) {
		answerA(w, r, 100, "192.0.2.11")
	})
	fs := newForwardingServer(t, ForwardOptions{Upstreams: []netip.AddrPort{up.addr}}, CacheOptions{PrefetchHits: 2, MaxTTL: time.Hour})
	var mu sync.Mutex
	now := time.Now()
	fs.cache.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	query(t, fs.srv, "hot.test.", mdns.TypeA, false) // miss: upstream 1
	query(t, fs.srv, "hot.test.", mdns.TypeA, false) // hit 1
	mu.Lock()
	now = now.Add(95 * time.Second) // 5 s of 100 left
	mu.Unlock()
	m := query(t, fs.srv, "hot.test.", mdns.TypeA, false) // hit 2: prefetch
	if m.Answer[0].Header().Ttl != 5 {
		t.Errorf("aged TTL %d, want 5", m.Answer[0].Header().Ttl)
	}
	deadline := time.Now().Add(2 * time.Second)
	for up.udp.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if up.udp.Load() != 2 {
		t.Fatalf("upstream asked %d times, want 2 (the prefetch)", up.udp.Load())
	}
	for time.Now().Before(deadline) {
		if m := query(t, fs.srv, "hot.test.", mdns.TypeA, false); m.Answer[0].Header().Ttl == 100 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Error("prefetched entry not in the cache")
}

func TestRoundRobin(t *testing.T) {
	var ups []netip.AddrPort
	var seen []*goUpstream
	for i := range 2 {
		u := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) {
			m := new(mdns.Msg)
			m.SetReply(r)
			m.Answer = []mdns.RR{mustRR(fmt.Sprintf("%s 300 IN A 192.0.2.%d", r.Question[0].Name, 20+i))}
			w.WriteMsg(m)
		})
		ups = append(ups, u.addr)
		seen = append(seen, u)
	}
	// Tries long enough that no query is retried on the other upstream on
	// a loaded machine (a 300 ms try timed out once in CI, 3 and 2 queries).
	fs := newForwardingServer(t, ForwardOptions{Upstreams: ups, Policy: PolicyRoundRobin,
		TryTimeout: 3 * time.Second, Deadline: 6 * time.Second}, CacheOptions{})
	for i := range 4 {
		query(t, fs.srv, fmt.Sprintf("rr%d.test.", i), mdns.TypeA, false)
	}
	if seen[0].udp.Load() != 2 || seen[1].udp.Load() != 2 {
		t.Errorf("round robin: %d and %d queries, want 2 and 2", seen[0].udp.Load(), seen[1].udp.Load())
	}
}

func TestLoopRejectedStatically(t *testing.T) {
	self := netip.MustParseAddrPort("127.0.0.1:53")
	vip := netip.MustParseAddrPort("10.96.0.10:53")
	f, err := NewForwarder(ForwardOptions{
		Upstreams: []netip.AddrPort{self, vip, netip.MustParseAddrPort("192.0.2.53:53")},
		Forbidden: []netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:53"), vip},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Upstreams(); len(got) != 1 || got[0].String() != "192.0.2.53:53" {
		t.Errorf("upstreams kept: %v", got)
	}
	if len(f.Rejected()) != 2 || !strings.Contains(f.Rejected()[0].Error(), "loop") {
		t.Errorf("rejected: %v", f.Rejected())
	}
	if _, err := NewForwarder(ForwardOptions{Upstreams: []netip.AddrPort{vip}, Forbidden: []netip.AddrPort{vip}}); err == nil {
		t.Error("only the kube-dns VIP as upstream: no error")
	}
}

// TestLoopDetected runs dnsd on a loopback socket with dnsmasq as its
// upstream and dnsmasq forwarding back to dnsd: the probe comes back.
func TestLoopDetected(t *testing.T) {
	dnsdPort, dmPort := freePort(t), freePort(t)
	up := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), dmPort)
	fwd, err := NewForwarder(ForwardOptions{Upstreams: []netip.AddrPort{up}, TryTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	z := NewZone(testState(), ZoneOptions{})
	z.Flush()
	srv := NewServer(ServerOptions{Listen: []string{fmt.Sprintf("127.0.0.1:%d", dnsdPort)}, Zone: z, Forwarder: fwd, Sockets: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan Listening, 1)
	go srv.Run(ctx, ready)
	<-ready
	startDnsmasq(t, dmPort, "--address=/example.test/192.0.2.1", fmt.Sprintf("--server=127.0.0.1#%d", dnsdPort))
	go fwd.Run(ctx)
	deadline := time.Now().Add(3 * time.Second)
	for !fwd.Looping(up) {
		if time.Now().After(deadline) {
			t.Fatal("forwarding loop through dnsmasq not detected")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if fwd.Healthy(up) {
		t.Error("looping upstream still in use")
	}
	if m := query(t, srv, "www.google.test.", mdns.TypeA, false); m.Rcode != mdns.RcodeServerFailure {
		t.Errorf("with the only upstream looping: %s, want SERVFAIL", mdns.RcodeToString[m.Rcode])
	}
}

// TestListeners serves real UDP and TCP sockets.
func TestListeners(t *testing.T) {
	up := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) {
		m := new(mdns.Msg)
		m.SetReply(r)
		m.Answer = aRecords(r.Question[0].Name, 40)
		w.WriteMsg(m)
	})
	fwd, err := NewForwarder(ForwardOptions{Upstreams: []netip.AddrPort{up.addr}})
	if err != nil {
		t.Fatal(err)
	}
	st := testState()
	z := NewZone(st, ZoneOptions{ShortNames: true})
	z.Flush()
	srv := NewServer(ServerOptions{Listen: []string{"127.0.0.1:0"}, Zone: z, Forwarder: fwd, Cache: NewCache(CacheOptions{}), Sockets: 2})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error)
	ready := make(chan Listening, 1)
	go func() { stopped <- srv.Run(ctx, ready) }()
	go z.Run(ctx)
	l := <-ready
	for _, proto := range []string{"udp", "tcp"} {
		addr := l.UDP[0].String()
		if proto == "tcp" {
			addr = l.TCP[0].String()
		}
		c := &mdns.Client{Net: proto, Timeout: 2 * time.Second}
		for _, tc := range []struct {
			name  string
			qtype uint16
			n     int
			tc    bool
		}{
			{"kubernetes.default.", mdns.TypeA, 1, false},
			{"_https._tcp.kubernetes.default.svc.cluster.local.", mdns.TypeSRV, 1, false},
			{"1.0.96.10.in-addr.arpa.", mdns.TypePTR, 1, false},
			{"many.test.", mdns.TypeA, 40, false},
		} {
			q := new(mdns.Msg)
			q.SetQuestion(tc.name, tc.qtype)
			var m *mdns.Msg
			if m, _, err = c.Exchange(q, addr); err != nil {
				t.Fatalf("%s %s: %v", proto, tc.name, err)
			}
			if proto == "udp" && tc.n == 40 {
				// 40 A records do not fit in 512 bytes: truncated for a
				// client without EDNS0.
				if !m.Truncated {
					t.Errorf("udp %s: %d bytes answer without TC", tc.name, m.Len())
				}
				continue
			}
			if m.Rcode != 0 || len(m.Answer) != tc.n {
				t.Errorf("%s %s: %v", proto, tc.name, m)
			}
		}
	}
	cancel()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

var _ = cluster.KindService

// TestUpstreamBackIsAskedBeforeItsHealthCheck: with every upstream marked
// down, queries still try them (as CoreDNS does), so an upstream that is
// back answers the next query, not only after the next health check. Before,
// dnsd answered SERVFAIL until the check found it.
func TestUpstreamBackIsAskedBeforeItsHealthCheck(t *testing.T) {
	var answering atomic.Bool
	up := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) {
		if answering.Load() {
			answerA(w, r, 60, "192.0.2.10")
		}
	})
	fs := newForwardingServer(t, ForwardOptions{
		Upstreams: []netip.AddrPort{up.addr}, TryTimeout: 100 * time.Millisecond, Deadline: 300 * time.Millisecond,
		HealthInterval: time.Hour,
	}, CacheOptions{})
	for i := range 3 { // MaxFails tries fail: marked down
		if m := query(t, fs.srv, fmt.Sprintf("dead%d.test.", i), mdns.TypeA, false); m.Rcode != mdns.RcodeServerFailure {
			t.Fatalf("silent upstream: %v", m)
		}
	}
	if !fs.fwd.ups[0].down.Load() {
		t.Fatal("the silent upstream is not marked down")
	}
	answering.Store(true)
	if m := query(t, fs.srv, "back.test.", mdns.TypeA, false); m.Rcode != mdns.RcodeSuccess || len(m.Answer) != 1 {
		t.Errorf("upstream back, still marked down: %v; want its answer", m)
	}
}

// TestOnlyUpstreamMarkedDownIsRetriedWithinTheDeadline: a query whose own
// timeouts mark the only upstream down goes on trying it while its deadline
// allows, as CoreDNS's forward does. Before, the retry rounds skipped an
// upstream marked down even when it was the only one, so two lost datagrams
// (or an upstream stalled for two try timeouts) gave SERVFAIL with a third
// of the deadline left: the dnsd soak's SERVFAIL with the upstream up.
func TestOnlyUpstreamMarkedDownIsRetriedWithinTheDeadline(t *testing.T) {
	var seen atomic.Int32
	up := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) {
		if seen.Add(1) <= 2 {
			return // two datagrams lost
		}
		answerA(w, r, 60, "192.0.2.10")
	})
	fs := newForwardingServer(t, ForwardOptions{
		Upstreams: []netip.AddrPort{up.addr}, TryTimeout: 100 * time.Millisecond, Deadline: 600 * time.Millisecond,
		HealthInterval: time.Hour,
	}, CacheOptions{})
	if m := query(t, fs.srv, "third.test.", mdns.TypeA, false); m.Rcode != mdns.RcodeSuccess || len(m.Answer) != 1 {
		t.Errorf("first two tries lost, deadline left for a third: %v; want the third try's answer", m)
	}
	if fs.fwd.Healthy(up.addr) {
		t.Error("two timeouts in a row did not mark the upstream down")
	}
	if got := seen.Load(); got != 3 {
		t.Errorf("upstream asked %d times, want 3", got)
	}
}
