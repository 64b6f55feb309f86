package dns

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/podnet/podnet/dataplane/runner"
)

// drainServer runs a Server on loopback that drains on cancel.
type drainServer struct {
	clock  *runner.FakeClock
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // what Run returned
	udp    string
	tcp    string
}

func startDrainServer(t *testing.T, o DrainOptions) *drainServer {
	t.Helper()
	z := NewZone(testState(), ZoneOptions{ShortNames: true})
	z.Flush()
	clock := runner.NewFakeClock()
	o.Clock = clock
	srv := NewServer(ServerOptions{Listen: []string{"127.0.0.1:0"}, Zone: z, Sockets: 2, Drain: o})
	ctx, cancel := context.WithCancel(context.Background())
	d := &drainServer{clock: clock, cancel: cancel, done: make(chan struct{})}
	ready := make(chan Listening, 1)
	go func() {
		d.err = srv.Run(ctx, ready)
		close(d.done)
	}()
	t.Cleanup(func() {
		cancel()
		for {
			clock.Advance(time.Hour)
			select {
			case <-d.done:
				return
			case <-clock.Asked():
			}
		}
	})
	select {
	case l := <-ready:
		d.udp, d.tcp = l.UDP[0].String(), l.TCP[0].String()
	case <-d.done:
		t.Fatal(d.err)
	}
	return d
}

// step advances the clock and, when that woke the drain, waits until it
// either waits again (true) or the server returned (false).
func (d *drainServer) step(t *testing.T, by time.Duration) bool {
	t.Helper()
	for len(d.clock.Asked()) > 0 {
		<-d.clock.Asked()
	}
	if d.clock.Advance(by) == 0 {
		return true
	}
	select {
	case <-d.clock.Asked():
		return true
	case <-d.done:
		return false
	case <-time.After(10 * time.Second):
		t.Fatal("the drain neither waits again nor returned 10s after its timer fired")
		return false
	}
}

func (d *drainServer) waitStopped(t *testing.T) {
	t.Helper()
	select {
	case <-d.done:
		if d.err != nil {
			t.Fatal(d.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return 10s after the drain ended")
	}
}

// ask sends one query for kubernetes.default. on a new socket (as glibc
// does) and says whether its answer came.
func ask(proto, addr string) error {
	c := &mdns.Client{Net: proto, Timeout: 3 * time.Second}
	q := new(mdns.Msg)
	q.SetQuestion("kubernetes.default.", mdns.TypeA)
	m, _, err := c.Exchange(q, addr)
	if err != nil {
		return err
	}
	if m.Rcode != mdns.RcodeSuccess || len(m.Answer) != 1 {
		return errors.New("wrong answer: " + m.String())
	}
	return nil
}

// sender asks continuously over one protocol until stop is closed,
// counting answers and losses.
type sender struct {
	answered, lost atomic.Int64
	lastErr        atomic.Value
}

func (s *sender) run(wg *sync.WaitGroup, stop <-chan struct{}, ask func() error) {
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := ask(); err != nil {
				s.lost.Add(1)
				s.lastErr.Store(err.Error())
			} else {
				s.answered.Add(1)
			}
		}
	})
}

// waitAnswers waits until s has answered n more queries than at from; with
// n = 2, the last of them was sent after waitAnswers was called.
func (s *sender) waitAnswers(t *testing.T, from int64, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for s.answered.Load() < from+n {
		if time.Now().After(deadline) || s.lost.Load() > 0 {
			t.Fatalf("answered %d, lost %d (%v), want %d more answers", s.answered.Load(), s.lost.Load(), s.lastErr.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestDrainAnswersUntilQuiet: queries sent continuously over UDP, TCP (a
// connection each) and one kept TCP connection, through the server's
// context ending, are all answered; the server keeps going while they
// arrive, longer than the quiet interval, and returns exactly one quiet
// interval after the last one; then an idle kept connection is closed.
func TestDrainAnswersUntilQuiet(t *testing.T) {
	const quiet = 2 * time.Second
	d := startDrainServer(t, DrainOptions{Quiet: quiet, Max: time.Minute})
	kept, err := (&mdns.Client{Net: "tcp", Timeout: 3 * time.Second}).Dial(d.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()
	keptAsk := func() error {
		q := new(mdns.Msg)
		q.SetQuestion("kubernetes.default.", mdns.TypeA)
		_, _, err := (&mdns.Client{Net: "tcp", Timeout: 3 * time.Second}).ExchangeWithConn(q, kept)
		return err
	}
	idle, err := net.Dial("tcp", d.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()

	var udp, tcp, keep sender
	stop := make(chan struct{})
	var wg sync.WaitGroup
	udp.run(&wg, stop, func() error { return ask("udp", d.udp) })
	tcp.run(&wg, stop, func() error { return ask("tcp", d.tcp) })
	keep.run(&wg, stop, keptAsk)
	senders := []*sender{&udp, &tcp, &keep}
	for _, s := range senders {
		s.waitAnswers(t, 0, 3)
	}

	d.cancel()
	<-d.clock.Asked() // the drain began
	for i := range 10 {
		for _, s := range senders {
			s.waitAnswers(t, s.answered.Load(), 2)
		}
		if !d.step(t, quiet/4) {
			t.Fatalf("server stopped %v into the drain while queries kept coming", time.Duration(i+1)*quiet/4)
		}
	}
	// Queries at the last step's time: a second answer after it is to a
	// query sent after the first, so received after the step. Without
	// this, the last query could predate last by a step (CI, once).
	for _, s := range senders {
		s.waitAnswers(t, s.answered.Load(), 2)
	}
	close(stop)
	wg.Wait()
	last := d.clock.Now() // no query can carry a later time
	for _, s := range senders {
		if n := s.lost.Load(); n != 0 {
			t.Errorf("%d queries lost (%v), %d answered", n, s.lastErr.Load(), s.answered.Load())
		}
	}
	t.Logf("answered: udp %d, tcp %d, kept tcp %d", udp.answered.Load(), tcp.answered.Load(), keep.answered.Load())

	if !d.step(t, quiet-time.Millisecond) {
		t.Fatal("server stopped before a quiet interval had passed since the last query")
	}
	if d.clock.Now().Sub(last) != quiet-time.Millisecond {
		t.Fatal("clock moved unexpectedly")
	}
	if d.step(t, time.Millisecond) {
		t.Fatal("server still draining a quiet interval after the last query")
	}
	d.waitStopped(t)
	idle.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := idle.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("idle TCP connection after the drain: read %v, want EOF", err)
	}
	if err := ask("udp", d.udp); err == nil {
		t.Error("a query after the drain was answered: the socket is still open")
	}
}

// TestDrainEndsAtMax: queries that never stop do not hold the server past
// DrainOptions.Max.
func TestDrainEndsAtMax(t *testing.T) {
	const quiet, maxDrain = 2 * time.Second, 5 * time.Second
	d := startDrainServer(t, DrainOptions{Quiet: quiet, Max: maxDrain})
	var udp sender
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	udp.run(&wg, stop, func() error { return ask("udp", d.udp) })
	udp.waitAnswers(t, 0, 1)
	d.cancel()
	<-d.clock.Asked()
	start := d.clock.Now()
	for d.clock.Now().Sub(start) < maxDrain {
		udp.waitAnswers(t, udp.answered.Load(), 2)
		if !d.step(t, time.Second) && d.clock.Now().Sub(start) < maxDrain {
			t.Fatalf("stopped %v into the drain, before Max", d.clock.Now().Sub(start))
		}
	}
	d.waitStopped(t)
}

// TestNoDrainStopsAtOnce: without DrainOptions the server returns when its
// context ends, as before.
func TestNoDrainStopsAtOnce(t *testing.T) {
	z := NewZone(testState(), ZoneOptions{})
	srv := NewServer(ServerOptions{Listen: []string{"127.0.0.1:0"}, Zone: z, Sockets: 1})
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan Listening, 1)
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Run(ctx, ready) }()
	l := <-ready
	c, err := net.Dial("tcp", netip.AddrPortFrom(l.TCP[0].Addr(), l.TCP[0].Port()).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cancel()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still running 10s after its context ended, with an idle TCP connection")
	}
}

// TestHealth: Health is nil while the server answers, names a UDP loop
// that has been on one query for a second (seen twice), and one whose
// loop ended; it says "stopped" once Run returned.
func TestHealth(t *testing.T) {
	z := NewZone(testState(), ZoneOptions{ShortNames: true})
	z.Flush()
	clock := runner.NewFakeClock()
	srv := NewServer(ServerOptions{Listen: []string{"127.0.0.1:0"}, Zone: z, Sockets: 2, Drain: DrainOptions{Clock: clock}})
	if err := srv.Health(); err == nil || err.Error() != "not listening yet" {
		t.Errorf("before Run: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan Listening, 1)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ready) }()
	l := <-ready
	if err := ask("udp", l.UDP[0].String()); err != nil {
		t.Fatal(err)
	}
	// The answer reaches the client before its worker counts the query
	// finished: wait for that, or the worker's count would land in the
	// middle of the counts the test sets below.
	waitWorkersIdle(t, srv)
	if err := srv.Health(); err != nil {
		t.Errorf("serving: %v", err)
	}
	// A worker in the middle of a query: healthy until the same query is
	// seen a second later.
	w := srv.workers[1]
	w.started.Add(1)
	if err := srv.Health(); err != nil {
		t.Errorf("a query just begun: %v", err)
	}
	clock.Advance(stuckAfter - time.Millisecond)
	if err := srv.Health(); err != nil {
		t.Errorf("a query %v on: %v", stuckAfter-time.Millisecond, err)
	}
	clock.Advance(time.Millisecond)
	if err := srv.Health(); err == nil || !strings.Contains(err.Error(), "udp "+w.addr+": one query for more than 1s") {
		t.Errorf("a query stuck for %v: %v", stuckAfter, err)
	}
	w.finished.Add(1)
	if err := srv.Health(); err != nil {
		t.Errorf("the query done: %v", err)
	}
	srv.tcpLoops[0].exited.Store(true)
	if err := srv.Health(); err == nil || !strings.Contains(err.Error(), "tcp "+srv.tcpLoops[0].addr+": its accept loop ended") {
		t.Errorf("accept loop ended: %v", err)
	}
	srv.tcpLoops[0].exited.Store(false)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := srv.Health(); err == nil || err.Error() != "stopped" {
		t.Errorf("after Run: %v", err)
	}
}

// waitWorkersIdle waits until every UDP worker of srv has finished each
// query it started.
func waitWorkersIdle(t *testing.T, srv *Server) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, w := range srv.workers {
		for w.started.Load() != w.finished.Load() {
			if time.Now().After(deadline) {
				t.Fatalf("udp %s: a query still unfinished after 10s", w.addr)
			}
			runtime.Gosched()
		}
	}
}

// TestDrainFinishesQueriesInFlight: forwarded queries (one over TCP, one
// over UDP) still waiting for their upstream when the drain ends are
// answered: the sockets and idle connections close, Run waits for them.
func TestDrainFinishesQueriesInFlight(t *testing.T) {
	release := make(chan struct{})
	asked := make(chan struct{}, 2)
	up := startGoUpstream(t, func(w mdns.ResponseWriter, r *mdns.Msg, _ bool) {
		asked <- struct{}{}
		<-release
		answerA(w, r, 60, "192.0.2.1")
	})
	fwd, err := NewForwarder(ForwardOptions{Upstreams: []netip.AddrPort{up.addr}, TryTimeout: 20 * time.Second, Deadline: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	z := NewZone(testState(), ZoneOptions{})
	z.Flush()
	clock := runner.NewFakeClock()
	srv := NewServer(ServerOptions{Listen: []string{"127.0.0.1:0"}, Zone: z, Forwarder: fwd, Sockets: 1,
		Drain: DrainOptions{Quiet: time.Second, Clock: clock}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan Listening, 1)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ready) }()
	l := <-ready
	answers := make(chan error, 2)
	for _, proto := range []string{"tcp", "udp"} {
		addr := l.TCP[0].String()
		if proto == "udp" {
			addr = l.UDP[0].String()
		}
		go func() {
			q := new(mdns.Msg)
			q.SetQuestion("www.example.test.", mdns.TypeA)
			m, _, err := (&mdns.Client{Net: proto, Timeout: 30 * time.Second}).Exchange(q, addr)
			if err == nil && len(m.Answer) != 1 {
				err = errors.New(proto + ": no answer record")
			}
			answers <- err
		}()
		<-asked // the query waits at the upstream
	}
	cancel()
	<-clock.Asked()
	clock.Advance(time.Second) // a quiet interval: the drain ends
	deadline := time.Now().Add(10 * time.Second)
	for {
		srv.connMu.Lock()
		stopping := srv.stopping
		srv.connMu.Unlock()
		if stopping {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the drain did not end 10s after its quiet interval")
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	for range 2 {
		if err := <-answers; err != nil {
			t.Errorf("query in flight when the drain ended: %v", err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return once its queries in flight were answered")
	}
}
