// Package runner runs one job (a sync, a rebuild, a scan) when asked, with
// bounded frequency: never more often than a minimum interval, so a burst
// of requests is served by one run; at least every maximum interval, so
// whatever someone else changed is repaired; and again after a retry
// interval when a run failed. A request may also wait a delay first (a
// debounce: a file written in several steps is read once, after the last)
// or be made for a later time. Every debounce loop of podnet's daemons is
// one of these; its clock is injected, so tests drive time instead of
// sleeping.
package runner

import (
	"context"
	"sync"
	"time"
)

// Options bound how often the job runs. Zero values turn a bound off.
type Options struct {
	// MinInterval is the least time between the starts of two runs.
	// Requests in between wait and are all served by the next run.
	MinInterval time.Duration
	// MaxInterval is the most time from the end of one run to the start
	// of the next, requested or not.
	MaxInterval time.Duration
	// RetryInterval is the time after a failed run when the job runs
	// again (MinInterval still applies).
	RetryInterval time.Duration
	// Delay is how long a Trigger waits before the run it asks for;
	// Triggers meanwhile are served by the same run.
	Delay time.Duration
	// Clock tells the time; nil: the system's.
	Clock Clock
}

// Clock is the time source of a Runner, so a test can drive it (FakeClock).
type Clock interface {
	Now() time.Time
	// After sends the time on the channel once d has passed.
	After(d time.Duration) <-chan time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// SystemClock is the real time.
var SystemClock Clock = systemClock{}

// Runner runs a job within its Options. Trigger and TriggerAfter are safe
// to call from any goroutine (the job's included), before Run too.
type Runner struct {
	job   func() error
	o     Options
	clock Clock
	kick  chan struct{}

	mu sync.Mutex
	// requested is when the oldest Trigger not yet served came; zero:
	// none waits.
	requested time.Time
	// timed are the times TriggerAfter asked for, not yet served.
	timed []time.Time
	// urgent is set by TriggerNow until the run it asked for starts.
	urgent bool
}

// New returns a Runner of job. Nothing runs before Run.
func New(job func() error, o Options) *Runner {
	c := o.Clock
	if c == nil {
		c = SystemClock
	}
	return &Runner{job: job, o: o, clock: c, kick: make(chan struct{}, 1)}
}

// Trigger asks for a run after Delay, as soon as MinInterval allows. It
// never blocks; requests that arrive before the run starts are served by
// it.
func (r *Runner) Trigger() {
	r.mu.Lock()
	if r.requested.IsZero() {
		r.requested = r.clock.Now()
	}
	r.mu.Unlock()
	r.wake()
}

// TriggerNow asks for a run at once, neither held back by MinInterval nor
// delayed by Delay: for the rare change that cannot wait (a proxy's local
// endpoint found dead while the last sync is under MinInterval old).
func (r *Runner) TriggerNow() {
	r.mu.Lock()
	r.urgent = true
	if r.requested.IsZero() {
		r.requested = r.clock.Now()
	}
	r.mu.Unlock()
	r.wake()
}

// TriggerAfter asks for a run once d has passed (not before MinInterval
// allows; Delay does not apply). A run that starts earlier for another
// reason does not serve it.
func (r *Runner) TriggerAfter(d time.Duration) {
	r.mu.Lock()
	r.timed = append(r.timed, r.clock.Now().Add(d))
	r.mu.Unlock()
	r.wake()
}

func (r *Runner) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run runs the job on request, on MaxInterval and after failures until ctx
// ends. The first run waits for a Trigger (or MaxInterval).
func (r *Runner) Run(ctx context.Context) {
	var lastStart, retryAt time.Time
	lastEnd := r.clock.Now()
	for {
		now := r.clock.Now()
		at := r.due(lastStart, lastEnd, retryAt)
		if at.IsZero() || at.After(now) {
			var timer <-chan time.Time
			if !at.IsZero() {
				timer = r.clock.After(at.Sub(now))
			}
			select {
			case <-ctx.Done():
				return
			case <-r.kick:
			case <-timer:
			}
			continue
		}
		if ctx.Err() != nil {
			return
		}
		r.serve(now)
		lastStart = now
		err := r.job()
		lastEnd = r.clock.Now()
		retryAt = time.Time{}
		if err != nil && r.o.RetryInterval > 0 {
			retryAt = lastEnd.Add(r.o.RetryInterval)
		}
	}
}

// due returns when the next run is due: the earliest of what asks for one,
// held back to MinInterval after the last start; zero when nothing does.
func (r *Runner) due(lastStart, lastEnd, retryAt time.Time) time.Time {
	var at time.Time
	earliest := func(t time.Time) {
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	r.mu.Lock()
	if r.urgent {
		at := r.requested
		r.mu.Unlock()
		return at
	}
	if !r.requested.IsZero() {
		earliest(r.requested.Add(r.o.Delay))
	}
	for _, t := range r.timed {
		earliest(t)
	}
	r.mu.Unlock()
	earliest(retryAt)
	if r.o.MaxInterval > 0 {
		earliest(lastEnd.Add(r.o.MaxInterval))
	}
	if next := lastStart.Add(r.o.MinInterval); !at.IsZero() && !lastStart.IsZero() && at.Before(next) {
		at = next
	}
	return at
}

// serve marks the requests a run starting now serves: every Trigger made
// until now, every TriggerAfter due by now.
func (r *Runner) serve(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requested, r.urgent = time.Time{}, false
	kept := r.timed[:0]
	for _, t := range r.timed {
		if t.After(now) {
			kept = append(kept, t)
		}
	}
	r.timed = kept
}
