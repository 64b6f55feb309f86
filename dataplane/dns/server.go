package dns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	mdns "github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/runner"
)

// ServerOptions configures a Server.
type ServerOptions struct {
	// Listen addresses, ":53" (every address, both families) by default;
	// each gets UDP and TCP.
	Listen []string
	Zone   *Zone
	// Forwarder answers names outside the cluster; nil refuses them.
	Forwarder *Forwarder
	// Cache holds forwarded answers; nil disables caching.
	Cache   *Cache
	Metrics *Metrics
	// Sockets per UDP listen address (SO_REUSEPORT); GOMAXPROCS by default.
	Sockets int
	// TCPIdleTimeout closes TCP connections idle between queries; 10 s by
	// default, as CoreDNS.
	TCPIdleTimeout time.Duration
	// TCPReadTimeout bounds the wait for a connection's first query and
	// for the rest of a message once its length arrived; 3 s by default.
	TCPReadTimeout time.Duration
	// TCPMaxConns caps concurrent TCP connections; more are closed at
	// once. DefaultTCPMaxConns by default.
	TCPMaxConns int
	// Log configures query and error logging (SetLog changes it).
	Log LogOptions
	// Drain says how the server stops once Run's context ends; the zero
	// value stops at once.
	Drain DrainOptions
	// Autopath, when set, resolves pods' search paths on the server.
	Autopath *AutopathOptions
}

// Server answers DNS over UDP and TCP. Its handler's rcode contract:
//   - packets shorter than a header, or responses (QR set), are dropped;
//   - a header followed by anything but one question and at most an OPT
//     record: FORMERR;
//   - an opcode other than QUERY: NOTIMP; EDNS version above 0: BADVERS;
//   - cluster names: see Zone.answer (NOERROR, NODATA, NXDOMAIN, SERVFAIL
//     before sync, REFUSED for AXFR/IXFR);
//   - other names: the upstream's answer, a cached one, SERVFAIL when no
//     upstream answered within the deadline (a stale cached answer if there
//     is one), REFUSED past the cap on concurrent forwarded queries or when
//     there is no forwarder.
type Server struct {
	opts ServerOptions
	// fwd is the forwarder in use: opts.Forwarder until SetForwarder.
	fwd atomic.Pointer[Forwarder]

	pool sync.Pool // *scratch
	// tcpConns holds a token per open TCP connection.
	tcpConns chan struct{}

	clock        runner.Clock
	draining     atomic.Bool
	lastQuery    atomic.Int64   // Unix nanoseconds of the last query while draining
	drained      DrainReport    // what the last drain saw; set before Run returns
	drainQueries atomic.Int64   // queries that arrived while draining
	inflight     sync.WaitGroup // forwarded UDP queries waiting for an upstream
	connMu       sync.Mutex
	conns        map[*tcpConn]struct{}
	stopping     bool // the listeners are closed: new connections close at once

	qlog     atomic.Pointer[logger] // nil: no query or error logging
	phase    atomic.Int32
	udpStop  atomic.Bool // the UDP workers are to return
	workers  []*worker   // one per UDP socket
	tcpLoops []*worker   // one per TCP listener
	health   healthState
}

// scratch holds the per-query buffers, reused across queries.
type scratch struct {
	resp  []byte
	lower [256]byte
	key   []byte
	r     request
	q     queryInfo // how the current query came in and who answered it
	stats queryStats
}

// NewServer returns a Server; it listens once Run is called.
func NewServer(opts ServerOptions) *Server {
	if len(opts.Listen) == 0 {
		opts.Listen = []string{":53"}
	}
	if opts.Sockets <= 0 {
		opts.Sockets = runtime.GOMAXPROCS(0)
	}
	if opts.TCPIdleTimeout <= 0 {
		opts.TCPIdleTimeout = 10 * time.Second
	}
	if opts.TCPReadTimeout <= 0 {
		opts.TCPReadTimeout = 3 * time.Second
	}
	if opts.TCPMaxConns <= 0 {
		opts.TCPMaxConns = DefaultTCPMaxConns
	}
	s := &Server{opts: opts, tcpConns: make(chan struct{}, opts.TCPMaxConns), clock: opts.Drain.Clock}
	if s.clock == nil {
		s.clock = runner.SystemClock
	}
	s.fwd.Store(opts.Forwarder)
	s.SetLog(opts.Log)
	s.pool.New = func() any { return &scratch{resp: make([]byte, 0, 4096), key: make([]byte, 0, 300)} }
	return s
}

// forwarder returns the forwarder in use, nil when names outside the
// cluster are refused.
func (s *Server) forwarder() *Forwarder { return s.fwd.Load() }

// SetForwarder replaces the forwarder for the queries that arrive from now
// on; queries already with the old one finish with it (stop it once they
// have: its Deadline after this call).
func (s *Server) SetForwarder(f *Forwarder) { s.fwd.Store(f) }

// Listening carries the bound addresses, for callers that asked for port 0.
type Listening struct {
	UDP []netip.AddrPort
	TCP []netip.AddrPort
}

// Run listens and serves until ctx ends and the drain it is configured
// with is over; then it closes its sockets and idle TCP connections and
// returns once the queries in flight are answered. ready, if not nil,
// receives the bound addresses once every socket is open.
func (s *Server) Run(ctx context.Context, ready chan<- Listening) error {
	var (
		udp   []*net.UDPConn
		tcp   []*net.TCPListener
		bound Listening
	)
	closeAll := func() {
		for _, c := range udp {
			c.Close()
		}
		for _, l := range tcp {
			l.Close()
		}
	}
	lc := net.ListenConfig{Control: reusePort}
	for _, addr := range s.opts.Listen {
		u, l, err := s.listen(ctx, lc, addr)
		if err != nil {
			closeAll()
			return err
		}
		udp = append(udp, u...)
		tcp = append(tcp, l)
		bound.UDP = append(bound.UDP, u[0].LocalAddr().(*net.UDPAddr).AddrPort())
		bound.TCP = append(bound.TCP, l.Addr().(*net.TCPAddr).AddrPort())
	}
	if ready != nil {
		ready <- bound
	}
	qctx := s.queryContext(ctx)
	for _, c := range udp {
		s.workers = append(s.workers, &worker{addr: c.LocalAddr().String()})
	}
	for _, l := range tcp {
		s.tcpLoops = append(s.tcpLoops, &worker{addr: l.Addr().String()})
	}
	s.phase.Store(phaseServing)
	defer s.phase.Store(phaseStopped)
	var wg sync.WaitGroup
	if c := s.opts.Cache; c != nil {
		cctx, stopClock := context.WithCancel(context.WithoutCancel(ctx))
		defer stopClock()
		go c.runClock(cctx)
	}
	for i, c := range udp {
		wg.Go(func() { s.serveUDP(qctx, c, s.workers[i]) })
	}
	for i, l := range tcp {
		wg.Go(func() { s.serveTCP(qctx, l, s.tcpLoops[i]) })
	}
	<-ctx.Done()
	s.phase.Store(phaseClosing)
	s.drain()
	// The UDP workers stop reading, but their sockets stay open until the
	// forwarded queries in flight have sent their answers through them.
	s.udpStop.Store(true)
	for _, c := range udp {
		c.SetReadDeadline(time.Unix(1, 0))
	}
	for _, l := range tcp {
		l.Close()
	}
	s.closeConns()
	wg.Wait()
	s.inflight.Wait()
	for _, c := range udp {
		s.drained.Unread += unreadDatagrams(c)
		c.Close()
	}
	return nil
}

// portTries bounds the ports listen tries for an address of port 0.
const portTries = 20

// listen opens addr's UDP sockets (Sockets of them on one port) and its TCP
// listener on the same port. The first UDP socket decides the port: for
// port 0 the kernel picks a free UDP port whose TCP port may be taken, and
// then another port is tried.
func (s *Server) listen(ctx context.Context, lc net.ListenConfig, addr string) ([]*net.UDPConn, *net.TCPListener, error) {
	for try := 1; ; try++ {
		udp, l, err := s.listenOnce(ctx, lc, addr)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || try == portTries {
			return udp, l, err
		}
		if _, p, perr := net.SplitHostPort(addr); perr != nil || p != "0" {
			return udp, l, err
		}
	}
}

func (s *Server) listenOnce(ctx context.Context, lc net.ListenConfig, addr string) ([]*net.UDPConn, *net.TCPListener, error) {
	var udp []*net.UDPConn
	fail := func(err error) ([]*net.UDPConn, *net.TCPListener, error) {
		for _, c := range udp {
			c.Close()
		}
		return nil, nil, err
	}
	first, err := lc.ListenPacket(ctx, "udp", addr)
	if err != nil {
		return fail(fmt.Errorf("listen udp %s: %w", addr, err))
	}
	udp = append(udp, first.(*net.UDPConn))
	port := first.LocalAddr().(*net.UDPAddr).AddrPort()
	joined := net.JoinHostPort(port.Addr().String(), fmt.Sprint(port.Port()))
	if ap, err := netip.ParseAddrPort(addr); err == nil && ap.Addr().IsUnspecified() {
		joined = net.JoinHostPort(ap.Addr().String(), fmt.Sprint(port.Port()))
	}
	for i := 1; i < s.opts.Sockets; i++ {
		pc, err := lc.ListenPacket(ctx, "udp", joined)
		if err != nil {
			return fail(fmt.Errorf("listen udp %s: %w", joined, err))
		}
		udp = append(udp, pc.(*net.UDPConn))
	}
	l, err := lc.Listen(ctx, "tcp", joined)
	if err != nil {
		return fail(fmt.Errorf("listen tcp %s: %w", joined, err))
	}
	return udp, l.(*net.TCPListener), nil
}

func reusePort(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

// serveUDP answers datagrams one at a time. Batching with recvmmsg and
// sendmmsg was measured and did not lower the CPU per query (the kernel's
// loopback delivery dominates), while it allocated an address per datagram;
// this loop allocates nothing. The worker's run of queries between waits
// is what its metrics time (queryStats).
func (s *Server) serveUDP(ctx context.Context, c *net.UDPConn, w *worker) {
	defer w.exited.Store(true)
	pkt := make([]byte, 65535)
	sc := s.pool.New().(*scratch)
	src := newSourceAddr(c)
	// Without control messages to read or send, recvfrom and sendto do
	// the same as recvmsg and sendmsg with less copying in the kernel.
	plain := src.out == nil
	m := s.opts.Metrics
	var idle func()
	if m != nil {
		idle = func() { m.idle(&sc.stats) }
		m.wake(&sc.stats)
	}
	rd, err := newUDPReader(c, pkt, src.oob, idle)
	if err != nil {
		return
	}
	for {
		n, oobn, from, waited, err := rd.read()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) || s.udpStop.Load() {
				return
			}
			continue
		}
		if waited && m != nil {
			m.wake(&sc.stats)
		}
		s.seen()
		w.started.Add(1)
		sc.q.v6 = from.Addr().Is6() && !from.Addr().Is4In6()
		sc.q.from = from
		resp, async := s.serve(ctx, pkt[:n], sc, false, false)
		reply := src.reply(oobn)
		if async {
			resp = s.serveLater(ctx, c, pkt[:n], from, reply, sc)
		}
		switch {
		case resp == nil:
		case plain:
			c.WriteToUDPAddrPort(resp, from)
		default:
			c.WriteMsgUDPAddrPort(resp, reply, from)
		}
		if m != nil {
			m.answered(&sc.stats)
		}
		w.finished.Add(1)
	}
}

// sourceAddr makes a socket bound to a wildcard address answer from the
// address each query was sent to (IP_PKTINFO, IPV6_PKTINFO), as a client
// that asked one of several addresses of the host expects. For sockets bound
// to one address it does nothing.
type sourceAddr struct {
	v6  bool
	oob []byte // control messages received with the datagram
	out []byte // the IP_PKTINFO/IPV6_PKTINFO message to send with the answer
}

func newSourceAddr(c *net.UDPConn) *sourceAddr {
	a, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok || !a.IP.IsUnspecified() {
		return &sourceAddr{}
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return &sourceAddr{}
	}
	src := &sourceAddr{v6: a.IP.To4() == nil, oob: make([]byte, 128)}
	var serr error
	rc.Control(func(fd uintptr) {
		if src.v6 {
			// IPv4 datagrams reaching a v6 wildcard socket keep the
			// kernel's choice of source.
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
		}
	})
	if serr != nil {
		return &sourceAddr{}
	}
	src.out = make([]byte, unix.CmsgSpace(unix.SizeofInet6Pktinfo))
	return src
}

// reply returns the control message that makes the answer leave from the
// query's destination address, or nil.
func (s *sourceAddr) reply(oobn int) []byte {
	if s.out == nil {
		return nil
	}
	b := s.oob[:oobn]
	for len(b) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(b) {
			return nil
		}
		data := b[unix.CmsgLen(0):l]
		switch {
		case !s.v6 && h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			in := (*unix.Inet4Pktinfo)(unsafe.Pointer(&data[0]))
			out := s.out[:unix.CmsgSpace(unix.SizeofInet4Pktinfo)]
			clear(out)
			oh := (*unix.Cmsghdr)(unsafe.Pointer(&out[0]))
			oh.Level, oh.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
			oh.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
			op := (*unix.Inet4Pktinfo)(unsafe.Pointer(&out[unix.CmsgLen(0)]))
			op.Spec_dst = in.Addr
			return out
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			in := (*unix.Inet6Pktinfo)(unsafe.Pointer(&data[0]))
			out := s.out[:unix.CmsgSpace(unix.SizeofInet6Pktinfo)]
			clear(out)
			oh := (*unix.Cmsghdr)(unsafe.Pointer(&out[0]))
			oh.Level, oh.Type = unix.IPPROTO_IPV6, unix.IPV6_PKTINFO
			oh.SetLen(unix.CmsgLen(unix.SizeofInet6Pktinfo))
			op := (*unix.Inet6Pktinfo)(unsafe.Pointer(&out[unix.CmsgLen(0)]))
			op.Addr = in.Addr
			op.Ifindex = in.Ifindex // a link-local address needs its interface
			return out
		}
		next := unix.CmsgSpace(l - unix.CmsgLen(0))
		if next > len(b) {
			return nil
		}
		b = b[next:]
	}
	return nil
}

// serveLater answers a query that needs an upstream on its own goroutine,
// or REFUSED at once when too many are in flight.
func (s *Server) serveLater(ctx context.Context, c *net.UDPConn, pkt []byte, to netip.AddrPort, oob []byte, sc *scratch) []byte {
	if f := s.forwarder(); f != nil && !f.roomFor() {
		return s.refuse(pkt, sc)
	}
	q := append([]byte(nil), pkt...)
	oob = append([]byte(nil), oob...)
	v6 := sc.q.v6
	s.inflight.Go(func() {
		sc := s.pool.Get().(*scratch)
		sc.q.v6, sc.q.from = v6, to
		if resp := s.serveAlone(ctx, q, sc, false); resp != nil {
			c.WriteMsgUDPAddrPort(resp, oob, to)
		}
		s.pool.Put(sc)
	})
	return nil
}

// refuse answers REFUSED to a query the fast path could not serve.
func (s *Server) refuse(pkt []byte, sc *scratch) []byte {
	r := &sc.r
	if err := parseRequest(pkt, sc.lower[:], r); err != nil {
		return nil
	}
	if s.opts.Metrics != nil {
		s.opts.Metrics.forwardRefused.Inc()
	}
	return errorReply(sc.resp, r, rcodeRefused)
}

// Handle answers one query packet as if it came over UDP (tcp false) or TCP,
// blocking for upstreams if needed. It returns nil for packets that get no
// answer. Tests and the fuzzer use it; the listeners use serve.
func (s *Server) Handle(ctx context.Context, pkt []byte, tcp bool) []byte {
	return s.handleFrom(ctx, pkt, netip.AddrPort{}, tcp)
}

// handleFrom is Handle for a query from the client at from.
func (s *Server) handleFrom(ctx context.Context, pkt []byte, from netip.AddrPort, tcp bool) []byte {
	sc := s.pool.Get().(*scratch)
	defer s.pool.Put(sc)
	sc.q.v6, sc.q.from = from.Addr().Is6() && !from.Addr().Is4In6(), from
	resp := s.serveAlone(ctx, pkt, sc, tcp)
	if resp == nil {
		return nil
	}
	return append([]byte(nil), resp...)
}

// serve answers pkt into sc.resp. With block false it never waits: a query
// that needs an upstream returns async true and the caller retries it with
// block true on another goroutine.
func (s *Server) serve(ctx context.Context, pkt []byte, sc *scratch, tcp, block bool) (resp []byte, async bool) {
	defer s.recoverPanic(&resp, &async)
	sc.q.tcp, sc.q.plugin, sc.q.size = tcp, pluginNone, len(pkt)
	ql := s.qlog.Load()
	if ql != nil {
		sc.q.start = time.Now()
	}
	r := &sc.r
	err := parseRequest(pkt, sc.lower[:], r)
	sc.q.do = r.do
	switch {
	case errors.Is(err, errMalformed):
		return nil, false
	case err != nil:
		resp = headerOnlyReply(sc.resp, pkt, rcodeFormErr)
		s.observe(0, sc, resp)
		return resp, false
	}
	switch {
	case r.opcode() != 0:
		resp = errorReply(sc.resp, r, rcodeNotImp)
	case r.edns && r.ednsVer != 0:
		resp = errorReply(sc.resp, r, rcodeBadVers)
	case s.forwarder() != nil && s.forwarder().isProbe(r.lower):
		resp = errorReply(sc.resp, r, rcodeServFail)
	default:
		if resp, async = s.answerQuery(ctx, pkt, r, sc, block); async {
			return nil, true
		}
	}
	if resp == nil {
		return nil, false
	}
	if !tcp {
		resp = truncate(resp, r)
	}
	sc.resp = resp[:0]
	s.observe(r.qtype, sc, resp)
	if ql != nil && ql.o.Queries != 0 && !sc.q.inner {
		ql.logQuery(&sc.q, r, resp)
	}
	return resp, false
}

// answerQuery answers a well-formed query: from the cluster zone, else
// from the forwarder, with an ExternalName's CNAME chased and autopath's
// walk done when the zone says so. With block false it returns async true
// for what needs an upstream.
func (s *Server) answerQuery(ctx context.Context, pkt []byte, r *request, sc *scratch, block bool) (resp []byte, async bool) {
	resp, n, res := s.opts.Zone.answer(sc.resp, r)
	sc.q.plugin = pluginKubernetes
	switch res {
	case needsCNAME:
		if !block {
			return nil, true
		}
		resp = s.externalName(ctx, pkt, r, n, sc)
	case notOurs:
		return s.forward(ctx, pkt, r, sc, block)
	case answered:
		if base, ok := s.autopathBase(r, resp, sc); ok {
			if !block {
				return nil, true
			}
			if ap := s.autopath(ctx, r, base, sc); ap != nil {
				resp = ap
			}
		}
	}
	return resp, false
}

// recoverPanic turns a panic while answering one query into no answer
// (the client retries) and counts it, so one bad query cannot take the
// server down.
func (s *Server) recoverPanic(resp *[]byte, async *bool) {
	if r := recover(); r != nil {
		*resp, *async = nil, false
		if s.opts.Metrics != nil {
			s.opts.Metrics.panics.Inc()
		}
	}
}

func (s *Server) observe(qtype uint16, sc *scratch, resp []byte) {
	if s.opts.Metrics != nil && !sc.q.inner {
		sc.stats.count(qtype, &sc.q, resp)
	}
}

// serveAlone answers one query that is not part of a UDP worker's run of
// queries (TCP, a query waiting for an upstream, Handle): it is timed on
// its own and counted in the totals at once.
func (s *Server) serveAlone(ctx context.Context, pkt []byte, sc *scratch, tcp bool) []byte {
	m := s.opts.Metrics
	if m != nil {
		m.wake(&sc.stats)
	}
	resp, _ := s.serve(ctx, pkt, sc, tcp, true)
	if m != nil {
		m.idle(&sc.stats)
	}
	return resp
}

// udpLimit is the largest UDP response the client accepts.
func (r *request) udpLimit() int {
	if r.edns {
		return int(min(r.udpSize, 4096))
	}
	return minUDPSize
}

// truncate makes resp fit the client's UDP limit: whole records are dropped
// from the end and TC is set when answers were lost (RFC 2181 9), so a
// client without EDNS0 gets a correct 512-byte answer and retries over TCP.
func truncate(resp []byte, r *request) []byte {
	limit := r.udpLimit()
	if len(resp) <= limit {
		return resp
	}
	var m mdns.Msg
	if err := m.Unpack(resp); err != nil {
		out := errorReply(resp[:0], r, rcodeServFail)
		return out
	}
	m.Compress = true
	m.Truncate(limit)
	out, err := m.Pack()
	if err != nil {
		return errorReply(resp[:0], r, rcodeServFail)
	}
	return out
}
