package dns

import (
	"bytes"
	"context"
	"net/netip"
	"strings"

	mdns "github.com/miekg/dns"
)

// Autopath is CoreDNS's `autopath @kubernetes`: a pod's resolver walks its
// search path (ndots:5: <ns>.svc.<zone>, svc.<zone>, <zone>, the node's
// domains, then the name itself), one query and one NXDOMAIN per step.
// The server knows that path: the client's namespace is the one of the pod
// holding the query's source address (the Zone's pod index). When a name
// under the client's own <ns>.svc.<zone> does not exist, the server walks
// the rest of the path itself and answers the first name that does, as a
// CNAME from the asked name to it followed by its records. An external
// name then costs one query per type on the wire instead of six.
//
// As CoreDNS, the walk starts only from the first search domain, goes on
// past NXDOMAIN and failures (SERVFAIL, REFUSED), and when every step fails
// the client gets the first answer (NXDOMAIN) and walks the path itself.

// AutopathOptions turns autopath on.
type AutopathOptions struct {
	// Search are the domains tried after the cluster's three (the node's
	// search domains, from the resolv.conf pods with dnsPolicy
	// ClusterFirst inherit), lowercase, without the trailing dot.
	Search []string
}

// autopathBase returns the base name of r (the name the client looks up,
// with a trailing dot) when r's answer resp is NXDOMAIN for a name under
// the client's own <ns>.svc.<zone>: autopath applies.
func (s *Server) autopathBase(r *request, resp []byte, sc *scratch) (string, bool) {
	if s.opts.Autopath == nil || len(resp) < headerLen || int(resp[3]&0xF) != rcodeNXDomain || !sc.q.from.IsValid() {
		return "", false
	}
	z := s.opts.Zone
	snap := z.snap.Load()
	rel := r.nlabel - snap.zoneLabels
	// <base...>.<ns>.svc.<zone>, with a base of one label at least.
	if rel < 3 || !bytes.Equal(r.suffix(rel), snap.zone) || string(r.label(rel-1)) != "svc" {
		return "", false
	}
	ns, ok := z.ClientNamespace(sc.q.from.Addr())
	if !ok || string(r.label(rel-2)) != ns {
		return "", false
	}
	return presentName(r.lower[:r.labels[rel-2]]), true
}

// autopath answers r, whose base name is base, from the rest of the
// client's search path; it returns nil when every step failed.
func (s *Server) autopath(ctx context.Context, r *request, base string, sc *scratch) []byte {
	domain := strings.Trim(s.opts.Zone.opts.Domain, ".")
	search := append([]string{"svc." + domain, domain}, s.opts.Autopath.Search...)
	search = append(search, "")
	q := new(mdns.Msg)
	q.SetQuestion("", r.qtype)
	q.Question[0].Qclass = r.qclass
	q.CheckingDisabled = r.flags&flagCD != 0
	q.SetEdns0(ourUDPSize, r.do)
	for _, dom := range search {
		q.Question[0].Name = mdns.Fqdn(base + dom)
		if dom == "" {
			q.Question[0].Name = base
		}
		m := s.resolveInner(ctx, q)
		if m == nil || m.Rcode == mdns.RcodeNameError || m.Rcode == mdns.RcodeServerFailure || m.Rcode == mdns.RcodeRefused {
			continue
		}
		if s.opts.Metrics != nil {
			s.opts.Metrics.autopathSuccess.Inc()
		}
		return autopathReply(sc.resp, r, m)
	}
	return nil
}

// resolveInner answers q as dnsd would a client's query, blocking for
// upstreams, without counting or logging it: it is part of a client's
// query that is counted once.
func (s *Server) resolveInner(ctx context.Context, q *mdns.Msg) *mdns.Msg {
	pkt, err := q.Pack()
	if err != nil {
		return nil
	}
	sc := s.pool.Get().(*scratch)
	defer s.pool.Put(sc)
	sc.q.from, sc.q.v6, sc.q.inner = netip.AddrPort{}, false, true
	defer func() { sc.q.inner = false }()
	resp, _ := s.serve(ctx, pkt, sc, true, true)
	if resp == nil {
		return nil
	}
	m := new(mdns.Msg)
	if m.Unpack(resp) != nil {
		return nil
	}
	return m
}

// autopathReply is m, the answer of a name further along the search path,
// as the answer to r: the asked name as question, and a CNAME from it to
// the name whose records follow.
func autopathReply(buf []byte, r *request, m *mdns.Msg) []byte {
	asked := presentName(r.lower)
	if len(m.Answer) > 0 && !strings.EqualFold(m.Answer[0].Header().Name, asked) {
		cname := &mdns.CNAME{
			Hdr:    mdns.RR_Header{Name: asked, Rrtype: mdns.TypeCNAME, Class: mdns.ClassINET, Ttl: m.Answer[0].Header().Ttl},
			Target: m.Answer[0].Header().Name,
		}
		m.Answer = append([]mdns.RR{cname}, m.Answer...)
	}
	m.Question[0].Name = asked
	return msgReply(buf, r, m)
}
