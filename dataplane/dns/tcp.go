package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// DefaultTCPMaxConns caps concurrent TCP connections. Each costs a
// goroutine (a few KiB) while idle and, only while one of its messages is
// read and answered, a buffer of that message's size class (at most 64
// KiB): 1,000 connections each in the middle of a 64 KiB message stay near
// 75 MiB, well under the Deployment's 256 Mi limit. Clients retry over UDP
// or on another replica; the cap is far above what resolvers keep open
// (TCP is the fallback for truncated answers).
const DefaultTCPMaxConns = 1000

// msgBufs are pools of TCP message buffers by size class, so a buffer is
// as large as the message it holds (most queries fit the smallest), not
// 64 KiB per connection.
var msgBufs = [...]struct {
	size int
	pool sync.Pool
}{{size: 512}, {size: 4096}, {size: 65535}}

func getMsgBuf(n int) (*[]byte, int) {
	for i := range msgBufs {
		c := &msgBufs[i]
		if n <= c.size {
			if b, ok := c.pool.Get().(*[]byte); ok {
				return b, i
			}
			b := make([]byte, c.size)
			return &b, i
		}
	}
	panic("dns: TCP message longer than 65535 bytes")
}

func putMsgBuf(b *[]byte, class int) { msgBufs[class].pool.Put(b) }

func (s *Server) serveTCP(ctx context.Context, l *net.TCPListener, loop *worker) {
	defer loop.exited.Store(true)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.AcceptTCP()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: don't spin
			continue
		}
		select {
		case s.tcpConns <- struct{}{}:
		default:
			// Over the cap: closed at once (the client sees it and
			// retries) rather than left to wait in the backlog.
			c.SetLinger(0)
			c.Close()
			if s.opts.Metrics != nil {
				s.opts.Metrics.tcpRefused.Inc()
			}
			continue
		}
		wg.Go(func() {
			defer func() { <-s.tcpConns }()
			s.serveConn(ctx, c)
		})
	}
}

// serveConn answers the queries of one TCP connection, in order: the first
// must arrive within TCPReadTimeout, the next ones within TCPIdleTimeout of
// the last answer, and a message once begun within TCPReadTimeout.
func (s *Server) serveConn(ctx context.Context, c *net.TCPConn) {
	defer c.Close()
	conn, forget := s.trackConn(c)
	defer forget()
	var lenBuf [2]byte
	var from netip.AddrPort
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		from = a.AddrPort()
	}
	wait := s.opts.TCPReadTimeout
	for conn.waitQuery() {
		c.SetReadDeadline(time.Now().Add(wait))
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			return
		}
		conn.busy()
		wait = s.opts.TCPIdleTimeout
		n := int(binary.BigEndian.Uint16(lenBuf[:]))
		c.SetReadDeadline(time.Now().Add(s.opts.TCPReadTimeout))
		buf, class := getMsgBuf(n)
		if _, err := io.ReadFull(c, (*buf)[:n]); err != nil {
			putMsgBuf(buf, class)
			return
		}
		if !s.answerTCP(ctx, c, (*buf)[:n], from) {
			putMsgBuf(buf, class)
			return
		}
		putMsgBuf(buf, class)
	}
}

// answerTCP serves one query and writes the answer with its length; false
// ends the connection.
func (s *Server) answerTCP(ctx context.Context, c *net.TCPConn, pkt []byte, from netip.AddrPort) bool {
	s.seen()
	sc := s.pool.Get().(*scratch)
	defer s.pool.Put(sc)
	sc.q.v6 = from.Addr().Is6() && !from.Addr().Is4In6()
	sc.q.from = from
	resp := s.serveAlone(ctx, pkt, sc, true)
	if resp == nil {
		return false
	}
	var prefix [2]byte
	binary.BigEndian.PutUint16(prefix[:], uint16(len(resp)))
	c.SetWriteDeadline(time.Now().Add(s.opts.TCPIdleTimeout))
	bufs := net.Buffers{prefix[:], resp}
	_, err := bufs.WriteTo(c)
	return err == nil
}
