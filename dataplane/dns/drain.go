package dns

import (
	"context"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/podnet/podnet/dataplane/runner"
)

// Draining: a dnsd told to stop (SIGTERM) still receives queries until
// every proxy has taken its endpoint out of the kube-dns Service, and each
// query it refuses costs a glibc client a 5 s timeout. So once its context
// ends, a Server with DrainOptions keeps answering on every socket and
// exits only when no query has reached it for Quiet (the proxies have moved
// on), or after Max at most. Then it closes its sockets and its idle TCP
// connections; queries in flight (a TCP query being answered, a forwarded
// UDP query waiting for its upstream) finish first.

// DrainOptions say how a Server stops once its context ends.
type DrainOptions struct {
	// Quiet is how long no query must have arrived before the server
	// stops; 0 stops at once.
	Quiet time.Duration
	// Max bounds the drain; 0: no bound but Quiet.
	Max time.Duration
	// Clock tells the time, so a test can drive the drain
	// (runner.FakeClock); nil: the system's.
	Clock runner.Clock
}

// DrainReport is what a Server's drain saw, for its log.
type DrainReport struct {
	// Began is when the drain began; LastQuery when the last query
	// arrived during it (Began if none did); Queries how many did.
	Began, LastQuery time.Time
	Queries          int64
	// Unread counts the UDP queries that arrived after the server stopped
	// reading and were never answered (their clients time out).
	Unread int
}

// Drained reports the drain once Run has returned; zero without one.
func (s *Server) Drained() DrainReport { return s.drained }

// unreadDatagrams reads and counts what waits in c's receive queue.
func unreadDatagrams(c *net.UDPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	c.SetReadDeadline(time.Time{})
	n := 0
	buf := make([]byte, 1)
	rc.Read(func(fd uintptr) bool {
		for {
			if _, _, err := syscall.Recvfrom(int(fd), buf, syscall.MSG_DONTWAIT|syscall.MSG_TRUNC); err != nil {
				return true
			}
			n++
		}
	})
	return n
}

// seen records a query's arrival while the server drains. Outside a drain
// it costs one read of a flag that does not change, so the query path
// shares no written cache line between workers.
func (s *Server) seen() {
	if s.draining.Load() {
		s.lastQuery.Store(s.clock.Now().UnixNano())
		s.drainQueries.Add(1)
	}
}

// Draining says whether the server's context has ended and it is waiting
// for its queries to stop.
func (s *Server) Draining() bool { return s.draining.Load() }

// drain waits, once ctx has ended, until no query has arrived for
// Quiet or Max has passed since the drain began.
func (s *Server) drain() {
	o := s.opts.Drain
	if o.Quiet <= 0 {
		return
	}
	start := s.clock.Now()
	s.lastQuery.Store(start.UnixNano())
	s.draining.Store(true)
	for {
		now := s.clock.Now()
		last := time.Unix(0, s.lastQuery.Load())
		until := last.Add(o.Quiet)
		if o.Max > 0 && start.Add(o.Max).Before(until) {
			until = start.Add(o.Max)
		}
		if !now.Before(until) {
			s.drained = DrainReport{Began: start, LastQuery: last, Queries: s.drainQueries.Load()}
			return
		}
		<-s.clock.After(until.Sub(now))
	}
}

// tcpConn is an open TCP connection as the server's stop sees it: idle
// (waiting for a query's first byte, closed at once on stop) or busy (a
// query being read or answered, closed when it is done).
type tcpConn struct {
	c       *net.TCPConn
	mu      sync.Mutex
	idle    bool
	closing bool
}

// waitQuery marks the connection idle before it waits for a query; false
// when the server stops and the connection is to be closed instead.
func (t *tcpConn) waitQuery() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.idle = !t.closing
	return !t.closing
}

// busy marks that a query's bytes arrived.
func (t *tcpConn) busy() {
	t.mu.Lock()
	t.idle = false
	t.mu.Unlock()
}

// stop closes the connection if it is idle, or has it close after the
// query it is busy with.
func (t *tcpConn) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closing = true
	if t.idle {
		t.c.Close()
	}
}

// trackConn registers c so that closeConns reaches it; the returned func
// forgets it.
func (s *Server) trackConn(c *net.TCPConn) (*tcpConn, func()) {
	t := &tcpConn{c: c}
	s.connMu.Lock()
	if s.conns == nil {
		s.conns = make(map[*tcpConn]struct{})
	}
	s.conns[t] = struct{}{}
	stopping := s.stopping
	s.connMu.Unlock()
	if stopping {
		t.stop()
	}
	return t, func() {
		s.connMu.Lock()
		delete(s.conns, t)
		s.connMu.Unlock()
	}
}

// closeConns closes every idle TCP connection and has the busy ones close
// after their query.
func (s *Server) closeConns() {
	s.connMu.Lock()
	s.stopping = true
	conns := make([]*tcpConn, 0, len(s.conns))
	for t := range s.conns {
		conns = append(conns, t)
	}
	s.connMu.Unlock()
	for _, t := range conns {
		t.stop()
	}
}

// queryContext is the context queries are answered under: without a
// drain, ctx (queries end with the server); with one, a context that
// outlives ctx, so queries that arrive while draining reach upstreams.
func (s *Server) queryContext(ctx context.Context) context.Context {
	if s.opts.Drain.Quiet > 0 {
		return context.WithoutCancel(ctx)
	}
	return ctx
}
