package dns

import (
	"context"
	"fmt"
	"net/netip"

	mdns "github.com/miekg/dns"
)

// The server's answers that need an upstream: forwarding a query outside the
// cluster zone (with the cache and prefetch around it) and chasing an
// ExternalName Service's CNAME target.

// upstreamQuery is the question of the client's packet as a query of our
// own: recursion desired, the client's CD, EDNS0 with our size and its DO.
func upstreamQuery(pkt []byte, r *request) (*mdns.Msg, error) {
	var req mdns.Msg
	if err := req.Unpack(pkt); err != nil {
		return nil, fmt.Errorf("unpack query: %w", err)
	}
	if len(req.Question) != 1 {
		return nil, fmt.Errorf("query has %d questions, want 1", len(req.Question))
	}
	q := new(mdns.Msg)
	q.SetQuestion(req.Question[0].Name, req.Question[0].Qtype)
	q.Question[0].Qclass = req.Question[0].Qclass
	q.CheckingDisabled = r.flags&flagCD != 0
	q.SetEdns0(ourUDPSize, r.do)
	return q, nil
}

// forward answers a name outside the cluster: from the cache, else (when
// block) from an upstream.
func (s *Server) forward(ctx context.Context, pkt []byte, r *request, sc *scratch, block bool) ([]byte, bool) {
	f := s.forwarder()
	if f == nil {
		return errorReply(sc.resp, r, rcodeRefused), false
	}
	if f.isProbe(r.lower) {
		return errorReply(sc.resp, r, rcodeServFail), false
	}
	if r.qtype == typeAXFR || r.qtype == typeIXFR {
		return errorReply(sc.resp, r, rcodeRefused), false
	}
	if addrs, ok := f.host(r.lower); ok {
		sc.q.plugin = pluginHosts
		return hostsReply(sc.resp, r, addrs), false
	}
	e, resp, hit := s.fromCache(ctx, pkt, r, sc)
	if hit {
		return resp, false
	}
	if !block {
		return nil, true
	}
	return s.exchange(ctx, pkt, r, sc, e), false
}

// fromCache answers from a fresh cache entry (hit), prefetching it when it
// is popular and about to expire; else it returns the stale entry, if any,
// for exchange to fall back on.
func (s *Server) fromCache(ctx context.Context, pkt []byte, r *request, sc *scratch) (*cacheEntry, []byte, bool) {
	c := s.opts.Cache
	if c == nil {
		return nil, nil, false
	}
	now := c.clock()
	sc.key = cacheKey(sc.key, r)
	e, fresh := c.get(sc.key, now)
	if !fresh {
		return e, nil, false
	}
	sc.q.plugin = pluginCache
	if s.opts.Metrics != nil {
		s.opts.Metrics.cacheHit(e.denial)
	}
	if c.wantsPrefetch(e, now) {
		s.prefetch(ctx, pkt, r, sc.key, e)
	}
	return e, c.reply(sc.resp, e, r, false, now), true
}

// exchange asks the upstreams and caches their answer; when none answers,
// a usable stale entry e is served instead.
func (s *Server) exchange(ctx context.Context, pkt []byte, r *request, sc *scratch, e *cacheEntry) []byte {
	f, c := s.forwarder(), s.opts.Cache
	sc.q.plugin = pluginForward
	if c != nil && s.opts.Metrics != nil {
		s.opts.Metrics.cacheMiss()
	}
	if !f.acquire() {
		if s.opts.Metrics != nil {
			s.opts.Metrics.forwardRefused.Inc()
		}
		return errorReply(sc.resp, r, rcodeRefused)
	}
	defer f.release()
	q, err := upstreamQuery(pkt, r)
	if err != nil {
		return errorReply(sc.resp, r, rcodeFormErr)
	}
	m, err := f.Exchange(ctx, q)
	if err != nil {
		if l := s.qlog.Load(); l != nil {
			l.logError(r, err)
		}
		if e != nil && c.usableStale(e) {
			sc.q.plugin = pluginCache
			if s.opts.Metrics != nil {
				s.opts.Metrics.servedStale()
			}
			return c.reply(sc.resp, e, r, true, c.now())
		}
		return errorReply(sc.resp, r, rcodeServFail)
	}
	if c != nil {
		if ne := c.put(sc.key, m); ne != nil {
			return c.reply(sc.resp, ne, r, false, c.now())
		}
	}
	return msgReply(sc.resp, r, m)
}

// prefetch refreshes a popular entry in the background.
func (s *Server) prefetch(ctx context.Context, pkt []byte, r *request, key []byte, e *cacheEntry) {
	f := s.forwarder()
	if !f.acquire() {
		e.fetching.Store(false)
		return
	}
	q, err := upstreamQuery(pkt, r)
	if err != nil {
		f.release()
		e.fetching.Store(false)
		return
	}
	key = append([]byte(nil), key...)
	go func() {
		defer f.release()
		m, err := f.Exchange(ctx, q)
		if err != nil || s.opts.Cache.put(key, m) == nil {
			e.fetching.Store(false)
			return
		}
		if s.opts.Metrics != nil {
			s.opts.Metrics.prefetched()
		}
	}()
}

// hostsTTL is the TTL of the config file's host records (CoreDNS's hosts
// plugin's default).
const hostsTTL = 3600

// hostsReply answers r from the config file's addresses of its name: those
// of the asked family, none (NODATA) for other types.
func hostsReply(buf []byte, r *request, addrs []netip.Addr) []byte {
	m := new(mdns.Msg)
	m.Response, m.Authoritative, m.RecursionAvailable = true, true, true
	name := presentName(r.lower)
	m.Question = []mdns.Question{{Name: name, Qtype: r.qtype, Qclass: r.qclass}}
	hdr := func(t uint16) mdns.RR_Header {
		return mdns.RR_Header{Name: name, Rrtype: t, Class: mdns.ClassINET, Ttl: hostsTTL}
	}
	for _, a := range addrs {
		switch {
		case r.qtype == mdns.TypeA && a.Is4():
			m.Answer = append(m.Answer, &mdns.A{Hdr: hdr(mdns.TypeA), A: a.AsSlice()})
		case r.qtype == mdns.TypeAAAA && a.Is6():
			m.Answer = append(m.Answer, &mdns.AAAA{Hdr: hdr(mdns.TypeAAAA), AAAA: a.AsSlice()})
		}
	}
	return msgReply(buf, r, m)
}

// msgReply packs an upstream answer as the reply to r.
func msgReply(buf []byte, r *request, m *mdns.Msg) []byte {
	m.Id = r.id
	m.RecursionDesired = r.flags&flagRD != 0
	m.Extra = dropOPT(m.Extra)
	m.Compress = true
	out, err := m.PackBuffer(buf[:0:cap(buf)])
	if err != nil {
		return errorReply(buf, r, rcodeServFail)
	}
	if len(out) >= headerLen+len(r.qname) {
		copy(out[headerLen:], r.qname)
	}
	return withOPT(out, r)
}

type depthKey struct{}

// externalName answers A/AAAA for an ExternalName Service: the CNAME, then
// the target's addresses as dnsd itself resolves them (cluster, cache or
// upstream), as CoreDNS does. When the target cannot be resolved the answer
// is NODATA.
func (s *Server) externalName(ctx context.Context, pkt []byte, r *request, n *node, sc *scratch) []byte {
	depth, _ := ctx.Value(depthKey{}).(int)
	var req mdns.Msg
	if err := req.Unpack(pkt); err != nil || len(req.Question) != 1 {
		return errorReply(sc.resp, r, rcodeFormErr)
	}
	zone := s.opts.Zone
	if depth >= 8 {
		return zone.negativeFor(sc.resp, r, rcodeSuccess)
	}
	q := new(mdns.Msg)
	q.SetQuestion(n.cname, r.qtype)
	q.SetEdns0(ourUDPSize, false)
	qpkt, err := q.Pack()
	if err != nil {
		return zone.negativeFor(sc.resp, r, rcodeSuccess)
	}
	sub := s.Handle(context.WithValue(ctx, depthKey{}, depth+1), qpkt, true)
	var sm mdns.Msg
	if sub == nil || sm.Unpack(sub) != nil || (sm.Rcode != mdns.RcodeSuccess && sm.Rcode != mdns.RcodeNameError) {
		return zone.negativeFor(sc.resp, r, rcodeSuccess)
	}
	m := new(mdns.Msg)
	m.SetReply(&req)
	m.Authoritative = true
	m.Answer = append([]mdns.RR{&mdns.CNAME{
		Hdr:    mdns.RR_Header{Name: req.Question[0].Name, Rrtype: mdns.TypeCNAME, Class: mdns.ClassINET, Ttl: zone.opts.TTL},
		Target: n.cname,
	}}, sm.Answer...)
	m.Extra = nil
	m.Compress = true
	out, err := m.PackBuffer(sc.resp[:0:cap(sc.resp)])
	if err != nil {
		return errorReply(sc.resp, r, rcodeServFail)
	}
	return withOPT(out, r)
}
