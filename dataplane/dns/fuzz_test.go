package dns

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"

	mdns "github.com/miekg/dns"
)

// FuzzServe feeds arbitrary packets to the query path (parser, zone,
// cache, truncation). Whatever comes in, dnsd must not crash, and what it
// sends back must be a well-formed response to that packet that fits the
// client's UDP limit. The seed corpus is in testdata/fuzz/FuzzServe.
func FuzzServe(f *testing.F) {
	st := testState()
	z := NewZone(st, ZoneOptions{ShortNames: true})
	z.Flush()
	fwd, err := NewForwarder(ForwardOptions{Upstreams: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.1:53")}})
	if err != nil {
		f.Fatal(err)
	}
	cache := NewCache(CacheOptions{})
	s := NewServer(ServerOptions{Zone: z, Forwarder: fwd, Cache: cache})
	// One cached forwarded answer, so hits go through the wire rewriting.
	for _, name := range []string{"www.example.test.", "big.example.test."} {
		q := new(mdns.Msg)
		q.SetQuestion(name, mdns.TypeA)
		m := new(mdns.Msg)
		m.SetReply(q)
		n := 1
		if name == "big.example.test." {
			n = 60
		}
		m.Answer = aRecords(name, n)
		pkt, _ := q.Pack()
		var r request
		var lower [256]byte
		if err := parseRequest(pkt, lower[:], &r); err != nil {
			f.Fatal(err)
		}
		cache.put(cacheKey(nil, &r), m)
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, pkt []byte, tcp bool) {
		sc := s.pool.Get().(*scratch)
		defer s.pool.Put(sc)
		resp, async := s.serve(ctx, pkt, sc, tcp, false)
		if resp == nil {
			return // dropped, or left for a forwarding goroutine
		}
		if async {
			t.Fatal("both an answer and a forward")
		}
		if len(resp) < headerLen {
			t.Fatalf("answer of %d bytes", len(resp))
		}
		if binary.BigEndian.Uint16(resp) != binary.BigEndian.Uint16(pkt) || resp[2]&0x80 == 0 {
			t.Fatalf("answer is not a response to the packet: % x", resp[:4])
		}
		var m mdns.Msg
		if err := m.Unpack(resp); err != nil {
			t.Fatalf("answer does not parse: %v\n% x", err, resp)
		}
		var r request
		var lower [256]byte
		if !tcp && parseRequest(pkt, lower[:], &r) == nil && len(resp) > r.udpLimit() {
			t.Fatalf("UDP answer of %d bytes, limit %d", len(resp), r.udpLimit())
		}
	})
}
