package dns

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// stuckAfter is how long a UDP worker may spend on one query before Health
// calls it stuck. A worker never waits for an upstream (those queries move
// to a goroutine of their own), so a query takes microseconds; a second is
// far beyond what a loaded node makes of it.
const stuckAfter = time.Second

// worker is one UDP socket's loop as Health sees it. Only the worker
// writes it; each sits on its own cache lines so workers do not share one.
type worker struct {
	_        [64]byte
	started  atomic.Uint64 // queries taken
	finished atomic.Uint64 // queries done with
	exited   atomic.Bool   // the loop returned
	addr     string
	_        [64]byte
}

// healthState is what Health remembers between calls: a worker seen in
// the middle of a query, since when.
type healthState struct {
	mu    sync.Mutex
	since map[*worker]inQuery
}

type inQuery struct {
	seq uint64
	at  time.Time
}

// Health says whether the server answers: nil while every socket's loop
// runs and none has been on one query for longer than a second (seen by
// two calls of Health); an error naming what is wrong otherwise. Before
// Run has listened and after it returned, the error says so.
func (s *Server) Health() error {
	switch s.phase.Load() {
	case phaseNew:
		return errors.New("not listening yet")
	case phaseStopped:
		return errors.New("stopped")
	}
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	if s.health.since == nil {
		s.health.since = make(map[*worker]inQuery)
	}
	now := s.clock.Now()
	var errs []error
	for _, w := range s.workers {
		if w.exited.Load() && s.phase.Load() == phaseServing {
			errs = append(errs, fmt.Errorf("udp %s: its loop ended", w.addr))
			continue
		}
		started := w.started.Load()
		if started == w.finished.Load() {
			delete(s.health.since, w)
			continue
		}
		q, ok := s.health.since[w]
		if !ok || q.seq != started {
			s.health.since[w] = inQuery{seq: started, at: now}
			continue
		}
		if d := now.Sub(q.at); d >= stuckAfter {
			errs = append(errs, fmt.Errorf("udp %s: one query for more than %v", w.addr, d.Truncate(time.Second)))
		}
	}
	for _, l := range s.tcpLoops {
		if l.exited.Load() && s.phase.Load() == phaseServing {
			errs = append(errs, fmt.Errorf("tcp %s: its accept loop ended", l.addr))
		}
	}
	return errors.Join(errs...)
}

// Server phases, for Health.
const (
	phaseNew int32 = iota
	phaseServing
	phaseClosing // draining or closing: loops end by design
	phaseStopped
)
