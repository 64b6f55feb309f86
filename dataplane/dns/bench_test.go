package dns

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	mdns "github.com/miekg/dns"

	"github.com/podnet/podnet/dataplane/cluster"
)

// BenchmarkServe measures the query path without sockets: a cluster A
// record, an endpoint's A record and an address's PTR (both encoded when
// asked), a search-path miss and a cached forwarded name.
func BenchmarkServe(b *testing.B) {
	st := testState()
	for i := range 10000 {
		st.Upsert(&cluster.Service{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i),
			ClusterIPs: addrs(fmt.Sprintf("10.97.%d.%d", i/250, i%250+1)),
			Ports:      []cluster.ServicePort{{Name: "http", Protocol: cluster.TCP, Port: 80}}})
		sl := &cluster.EndpointSlice{Namespace: "bench", Name: fmt.Sprintf("svc-%d-x", i), ServiceName: fmt.Sprintf("svc-%d", i), AddressType: "IPv4",
			Ports: []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}}}
		for j := range 10 {
			sl.Endpoints = append(sl.Endpoints, cluster.Endpoint{Ready: true, Addresses: addrs(fmt.Sprintf("10.%d.%d.%d", 128+i/2500, i%2500/10, (i%10)*10+j+1))})
		}
		st.Upsert(sl)
	}
	z := NewZone(st, ZoneOptions{ShortNames: true})
	z.Flush()
	fwd, err := NewForwarder(ForwardOptions{Upstreams: addrPorts("192.0.2.1:53")})
	if err != nil {
		b.Fatal(err)
	}
	cache := NewCache(CacheOptions{})
	// As Server.Run does: hits read the time runClock keeps.
	clockCtx, stopClock := context.WithCancel(context.Background())
	defer stopClock()
	go cache.runClock(clockCtx)
	s := NewServer(ServerOptions{Zone: z, Forwarder: fwd, Cache: cache})
	cached := new(mdns.Msg)
	cached.SetQuestion("www.example.test.", mdns.TypeA)
	reply := new(mdns.Msg)
	reply.SetReply(cached)
	reply.Answer = aRecords("www.example.test.", 1)
	pkt, _ := cached.Pack()
	var r request
	var lower [256]byte
	parseRequest(pkt, lower[:], &r)
	cache.put(cacheKey(nil, &r), reply)
	for _, c := range []struct {
		name, q string
		qtype   uint16
	}{
		{"cluster", "svc-4242.bench.svc.cluster.local.", mdns.TypeA},
		{"endpoint", "10-129-174-25.svc-4242.bench.svc.cluster.local.", mdns.TypeA},
		{"ptr", "25.174.129.10.in-addr.arpa.", mdns.TypePTR},
		{"nxdomain", "svc-4242.bench.bench.svc.cluster.local.", mdns.TypeA},
		{"cached", "www.example.test.", mdns.TypeA},
	} {
		b.Run(c.name, func(b *testing.B) {
			q := new(mdns.Msg)
			q.SetQuestion(c.q, c.qtype)
			pkt, _ := q.Pack()
			ctx := context.Background()
			sc := s.pool.Get().(*scratch)
			var m mdns.Msg
			if resp, _ := s.serve(ctx, pkt, sc, false, false); m.Unpack(resp) != nil || (len(m.Answer) == 0) != (c.name == "nxdomain") {
				b.Fatalf("%s: answer %v", c.q, &m)
			}
			b.ReportAllocs()
			for b.Loop() {
				resp, async := s.serve(ctx, pkt, sc, false, false)
				if resp == nil || async {
					b.Fatal("no answer")
				}
			}
		})
	}
}

func addrPorts(ss ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range ss {
		out = append(out, netip.MustParseAddrPort(s))
	}
	return out
}
