package dns

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/podnet/podnet/dataplane/cluster"
)

func TestErrorRcodes(t *testing.T) {
	s, _ := newTestServer(t, testState(), ZoneOptions{})
	good := func() []byte {
		q := new(mdns.Msg)
		q.SetQuestion("svc1.testns.svc.cluster.local.", mdns.TypeA)
		q.Id = 0xbeef
		b, _ := q.Pack()
		return b
	}
	withEDNS := func(ver uint8) []byte {
		q := new(mdns.Msg)
		q.SetQuestion("svc1.testns.svc.cluster.local.", mdns.TypeA)
		q.Id = 0xbeef
		o := q.SetEdns0(1232, false).IsEdns0()
		o.SetVersion(ver)
		b, _ := q.Pack()
		return b
	}
	for _, c := range []struct {
		name  string
		pkt   []byte
		rcode int // -1: no answer
	}{
		{"short", []byte{0xbe, 0xef, 1}, -1},
		{"response", func() []byte { b := good(); b[2] |= 0x80; return b }(), -1},
		{"two questions", func() []byte { b := good(); b[5] = 2; return b }(), mdns.RcodeFormatError},
		{"an answer in a query", func() []byte { b := good(); b[7] = 1; return b }(), mdns.RcodeFormatError},
		{"cut question", good()[:20], mdns.RcodeFormatError},
		{"compressed question", []byte{0xbe, 0xef, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1}, mdns.RcodeFormatError},
		{"additional not OPT", func() []byte {
			q := new(mdns.Msg)
			q.SetQuestion("a.", mdns.TypeA)
			q.Id = 0xbeef
			q.Extra = []mdns.RR{mustRR("a. 1 IN A 1.2.3.4")}
			b, _ := q.Pack()
			return b
		}(), mdns.RcodeFormatError},
		{"NOTIFY", func() []byte { b := good(); b[2] |= 4 << 3; return b }(), mdns.RcodeNotImplemented},
		{"UPDATE", func() []byte { b := good(); b[2] |= 5 << 3; return b }(), mdns.RcodeNotImplemented},
		{"EDNS version 1", withEDNS(1), mdns.RcodeBadVers},
		{"EDNS version 0", withEDNS(0), mdns.RcodeSuccess},
	} {
		resp := s.Handle(context.Background(), c.pkt, false)
		if c.rcode < 0 {
			if resp != nil {
				t.Errorf("%s: answered, want dropped", c.name)
			}
			continue
		}
		var m mdns.Msg
		if resp == nil || m.Unpack(resp) != nil {
			t.Errorf("%s: no parseable answer", c.name)
			continue
		}
		if m.Id != 0xbeef || !m.Response || m.Rcode != c.rcode {
			t.Errorf("%s: id %x response %v rcode %s, want rcode %s", c.name, m.Id, m.Response, mdns.RcodeToString[m.Rcode], mdns.RcodeToString[c.rcode])
		}
	}
}

func TestTruncatedClusterAnswer(t *testing.T) {
	st := testState()
	st.Upsert(&cluster.Service{Namespace: "testns", Name: "big", Headless: true})
	sl := &cluster.EndpointSlice{Namespace: "testns", Name: "big-1", ServiceName: "big", AddressType: "IPv4"}
	for i := range 60 {
		sl.Endpoints = append(sl.Endpoints, cluster.Endpoint{Addresses: addrs(fmt.Sprintf("10.244.9.%d", i+1)), Ready: true})
	}
	st.Upsert(sl)
	s, _ := newTestServer(t, st, ZoneOptions{})
	m := query(t, s, "big.testns.svc.cluster.local.", mdns.TypeA, false)
	m.Compress = true
	if !m.Truncated || m.Len() > 512 || len(m.Answer) == 0 {
		t.Fatalf("60 A records to a client without EDNS0: TC %v, %d bytes, %d answers", m.Truncated, m.Len(), len(m.Answer))
	}
	m = query(t, s, "big.testns.svc.cluster.local.", mdns.TypeA, true)
	if m.Truncated || len(m.Answer) != 60 {
		t.Fatalf("with EDNS0 4096: TC %v, %d answers", m.Truncated, len(m.Answer))
	}
	q := new(mdns.Msg)
	q.SetQuestion("big.testns.svc.cluster.local.", mdns.TypeA)
	pkt, _ := q.Pack()
	var full mdns.Msg
	if err := full.Unpack(s.Handle(context.Background(), pkt, true)); err != nil || len(full.Answer) != 60 {
		t.Fatalf("over TCP: %v, %d answers", err, len(full.Answer))
	}
}

func TestReadResolvConf(t *testing.T) {
	p := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(p, []byte("# comment\nsearch example.com\nnameserver 192.0.2.53\nnameserver fd00::53\nnameserver bogus\noptions ndots:5\n"), 0o644)
	got, err := ReadResolvConf(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53"), netip.MustParseAddrPort("[fd00::53]:53")}
	if !slices.Equal(got, want) {
		t.Errorf("nameservers %v, want %v", got, want)
	}
	if _, err := ReadResolvConf(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("missing resolv.conf: no error")
	}
	// The last search line holds, as for the resolver.
	os.WriteFile(p, []byte("search old.example\nsearch Corp.Example. lab.example\nnameserver 192.0.2.53\n"), 0o644)
	if got, err := ReadResolvSearch(p); err != nil || !slices.Equal(got, []string{"corp.example", "lab.example"}) {
		t.Errorf("search %q %v, want [corp.example lab.example]", got, err)
	}
}

func TestCacheBoundsAndClamps(t *testing.T) {
	c := NewCache(CacheOptions{Size: 64, MinTTL: 10 * time.Second, MaxTTL: time.Minute, MaxNegTTL: 20 * time.Second})
	put := func(name string, rcode int, ttl uint32) *cacheEntry {
		q := new(mdns.Msg)
		q.SetQuestion(name, mdns.TypeA)
		m := new(mdns.Msg)
		m.SetRcode(q, rcode)
		if rcode == mdns.RcodeSuccess {
			m.Answer = []mdns.RR{mustRR(fmt.Sprintf("%s %d IN A 192.0.2.1", name, ttl))}
		} else {
			m.Ns = []mdns.RR{mustRR(fmt.Sprintf("test. %d IN SOA ns.test. h.test. 1 2 3 4 %d", ttl, ttl))}
		}
		pkt, _ := q.Pack()
		var r request
		var lower [256]byte
		parseRequest(pkt, lower[:], &r)
		return c.put(cacheKey(nil, &r), m)
	}
	if e := put("short.test.", 0, 1); e.ttl != 10*time.Second || e.ttls[0] != 10 {
		t.Errorf("TTL 1 cached for %v (record TTL %d), want the 10s minimum", e.ttl, e.ttls[0])
	}
	if e := put("long.test.", 0, 86400); e.ttl != time.Minute || e.ttls[0] != 60 {
		t.Errorf("TTL 86400 cached for %v (record TTL %d), want the 1m maximum", e.ttl, e.ttls[0])
	}
	if e := put("gone.test.", mdns.RcodeNameError, 3600); e.ttl != 20*time.Second {
		t.Errorf("negative TTL 3600 cached for %v, want the 20s maximum", e.ttl)
	}
	q := new(mdns.Msg)
	q.SetQuestion("x.test.", mdns.TypeA)
	sf := new(mdns.Msg)
	sf.SetRcode(q, mdns.RcodeServerFailure)
	if c.put([]byte("x"), sf) != nil {
		t.Error("SERVFAIL cached")
	}
	success, denial := c.Evictions()
	if success != 0 || denial != 0 {
		t.Errorf("evictions before the cache was full: %d, %d", success, denial)
	}
	for i := range 1000 {
		put(fmt.Sprintf("n%d.test.", i), 0, 300)
	}
	if n := c.Len(); n > 64+cacheShards {
		t.Errorf("%d entries in a cache of 64", n)
	}
	// Every entry stored and no longer there was evicted, and counted by
	// its kind (the negative one may or may not have been a victim).
	success, denial = c.Evictions()
	if stored := 1003; int(success+denial) != stored-c.Len() || denial > 1 {
		t.Errorf("evictions: %d positive, %d negative; %d stored, %d left", success, denial, stored, c.Len())
	}
}

// TestCacheDefaultsAreKubeadms: unconfigured, the cache keeps answers as
// kubeadm's Corefile (`cache 30`) does: 5 s to 30 s, positive and negative,
// and serves nothing stale.
func TestCacheDefaultsAreKubeadms(t *testing.T) {
	c := NewCache(CacheOptions{})
	for _, tc := range []struct {
		rr    string
		rcode int
		want  time.Duration
	}{
		{"long.test. 86400 IN A 192.0.2.1", mdns.RcodeSuccess, 30 * time.Second},
		{"short.test. 1 IN A 192.0.2.1", mdns.RcodeSuccess, 5 * time.Second},
		{"test. 3600 IN SOA ns.test. h.test. 1 2 3 4 3600", mdns.RcodeNameError, 30 * time.Second},
	} {
		rr := mustRR(tc.rr)
		q := new(mdns.Msg)
		q.SetQuestion("q.test.", mdns.TypeA)
		m := new(mdns.Msg)
		m.SetRcode(q, tc.rcode)
		if tc.rcode == mdns.RcodeSuccess {
			m.Answer = []mdns.RR{rr}
		} else {
			m.Ns = []mdns.RR{rr}
		}
		if e := c.put([]byte(tc.rr), m); e == nil || e.ttl != tc.want {
			t.Errorf("%s (rcode %d) cached as %+v, want for %v", tc.rr, tc.rcode, e, tc.want)
		}
	}
	if c.opts.StaleFor != 0 {
		t.Errorf("serve-stale %v by default, want off", c.opts.StaleFor)
	}
}
