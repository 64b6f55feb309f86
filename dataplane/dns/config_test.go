package dns

import (
	"context"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

func TestParseFileConfig(t *testing.T) {
	c, err := ParseFileConfig([]byte(`
upstreamNameservers: ["10.0.0.53", "10.0.1.53:5353"]
stubDomains:
  corp.example: ["10.1.0.53"]
  eu.corp.example: ["10.2.0.53"]
hosts:
  Registry.Internal: ["192.0.2.10", "2001:db8::10"]
`))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := c.Resolved()
	if got := r.Upstreams; len(got) != 2 || got[0].String() != "10.0.0.53:53" || got[1].String() != "10.0.1.53:5353" {
		t.Errorf("upstreams %v", got)
	}
	if len(r.Stubs) != 2 || r.Stubs[0].Domain != "eu.corp.example." || r.Stubs[1].Domain != "corp.example." {
		t.Errorf("stubs %+v, want the most specific first", r.Stubs)
	}
	if a := r.Hosts["registry.internal."]; len(a) != 2 {
		t.Errorf("hosts %v, want two addresses under the lowercase FQDN", r.Hosts)
	}
	for in, want := range map[string]string{
		`upstreams: ["1.1.1.1"]`:                  "upstreams",
		`upstreamNameservers: ["dns.example"]`:    "upstreamNameservers",
		`stubDomains: {"corp": ["10.1.0.x"]}`:     "stubDomains.corp",
		`stubDomains: {"bad..name": ["1.1.1.1"]}`: "bad..name",
		`hosts: {"h.example": ["300.1.1.1"]}`:     "hosts.h.example",
		`hosts: {"h.example": []}`:                "no addresses",
	} {
		if _, err := ParseFileConfig([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one naming %q", in, err, want)
		}
	}
}

func TestStubDomainsAndHosts(t *testing.T) {
	def := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) { answerA(w, r, 60, "192.0.2.1") })
	corp := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) { answerA(w, r, 60, "10.1.1.1") })
	fs := newForwardingServer(t, ForwardOptions{
		Upstreams: []netip.AddrPort{def.addr},
		Stubs:     []Stub{{Domain: "corp.example.", Upstreams: []netip.AddrPort{corp.addr}}},
		Hosts:     map[string][]netip.Addr{"registry.internal.": {netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")}},
	}, CacheOptions{})
	for name, want := range map[string]string{
		"www.corp.example.":    "10.1.1.1",
		"corp.example.":        "10.1.1.1",
		"notcorp.example.":     "192.0.2.1", // a suffix that is not a label boundary
		"www.example.test.":    "192.0.2.1",
		"REGISTRY.internal.":   "192.0.2.10",
		"x.registry.internal.": "192.0.2.1", // hosts are exact names
	} {
		m := query(t, fs.srv, name, mdns.TypeA, false)
		if m.Rcode != 0 || len(m.Answer) != 1 || m.Answer[0].(*mdns.A).A.String() != want {
			t.Errorf("%s: %v, want %s", name, m, want)
		}
	}
	if m := query(t, fs.srv, "registry.internal.", mdns.TypeAAAA, true); len(m.Answer) != 1 || m.Answer[0].(*mdns.AAAA).AAAA.String() != "2001:db8::10" || m.Answer[0].Header().Ttl != hostsTTL {
		t.Errorf("hosts AAAA: %v", m)
	}
	if m := query(t, fs.srv, "registry.internal.", mdns.TypeMX, false); m.Rcode != 0 || len(m.Answer) != 0 {
		t.Errorf("hosts MX: %v, want NODATA", m)
	}
	if corp.udp.Load() != 2 {
		t.Errorf("the stub domain's upstream got %d queries, want 2", corp.udp.Load())
	}
	if !fs.fwd.Healthy(corp.addr) || len(fs.fwd.StubDomains()) != 1 {
		t.Errorf("stub upstream health %v, stub domains %v", fs.fwd.Healthy(corp.addr), fs.fwd.StubDomains())
	}
	// dnsd status lists the stub domain's upstream apart, with its health.
	want := func(healthy bool) []StubStatus {
		return []StubStatus{{Domain: "corp.example.", Upstreams: []UpstreamStatus{{Address: corp.addr.String(), Healthy: healthy}}}}
	}
	st := Report(fs.srv.opts.Zone, fs.fwd, nil, nil)
	if !reflect.DeepEqual(st.Stubs, want(true)) || len(st.Upstreams) != 1 || st.Upstreams[0].Address != def.addr.String() {
		t.Errorf("status: upstreams %+v, stubs %+v; want %s, then %+v", st.Upstreams, st.Stubs, def.addr, want(true))
	}
	fs.fwd.stubs[0].fwd.ups[0].down.Store(true)
	if st := Report(fs.srv.opts.Zone, fs.fwd, nil, nil); !reflect.DeepEqual(st.Stubs, want(false)) || !st.Upstreams[0].Healthy {
		t.Errorf("status with the stub's upstream down: upstreams %+v, stubs %+v", st.Upstreams, st.Stubs)
	}
}

// TestSetForwarderDropsNoQuery swaps the forwarder while queries wait on
// the old one's slow upstream: every query is answered.
func TestSetForwarderDropsNoQuery(t *testing.T) {
	slow := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) {
		time.Sleep(200 * time.Millisecond)
		answerA(w, r, 60, "192.0.2.1")
	})
	next := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) { answerA(w, r, 60, "192.0.2.2") })
	fs := newForwardingServer(t, ForwardOptions{Upstreams: []netip.AddrPort{slow.addr}}, CacheOptions{})
	nf, err := NewForwarder(ForwardOptions{Upstreams: []netip.AddrPort{next.addr}, TryTimeout: 300 * time.Millisecond, Deadline: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	answers := map[string]int{}
	for i := range 100 {
		if i == 50 {
			time.Sleep(50 * time.Millisecond) // the first half waits on the slow upstream
			fs.srv.SetForwarder(nf)
		}
		wg.Go(func() {
			q := new(mdns.Msg)
			q.SetQuestion(strings.Repeat("a", 1+i%40)+".example.test.", mdns.TypeA)
			q.Id = uint16(i)
			pkt, _ := q.Pack()
			resp := fs.srv.Handle(context.Background(), pkt, false)
			var m mdns.Msg
			key := "no answer"
			if resp != nil && m.Unpack(resp) == nil {
				key = mdns.RcodeToString[m.Rcode]
				if len(m.Answer) == 1 {
					key = m.Answer[0].(*mdns.A).A.String()
				}
			}
			mu.Lock()
			answers[key]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if answers["192.0.2.1"]+answers["192.0.2.2"] != 100 || answers["192.0.2.2"] == 0 || answers["192.0.2.1"] == 0 {
		t.Errorf("answers %v, want all 100 answered, by both the old and the new forwarder", answers)
	}
}

// TestFileConfigLog: the config file's log section, and its bad values
// named.
func TestFileConfigLog(t *testing.T) {
	c, err := ParseFileConfig([]byte("log: {classes: \"denial, error\", errors: true, rate: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := c.Resolved()
	if r.Log == nil || *r.Log != (LogOptions{Queries: LogDenial | LogError, Errors: true, Rate: 10}) {
		t.Errorf("log section: %+v", r.Log)
	}
	if c, _ := ParseFileConfig([]byte("hosts: {}\n")); func() *LogOptions { r, _ := c.Resolved(); return r.Log }() != nil {
		t.Error("a file without a log section replaces the flags' logging")
	}
	for text, want := range map[string]string{
		"log: {classes: sucess}\n": `log.classes: log classes "sucess": "sucess" is not`,
		"log: {rate: -1}\n":        "log.rate: -1 is negative",
	} {
		if _, err := ParseFileConfig([]byte(text)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error with %q", text, err, want)
		}
	}
}
