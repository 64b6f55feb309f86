// Package runner runs one job (a sync, a rebuild) when asked, with bounded
// frequency: never more often than a minimum interval, so a burst of
// requests is served by one run; at least every maximum interval, so
// whatever someone else changed is repaired; and again after a retry
// interval when a run failed. Every debounce loop of podnet's daemons is
// one of these.
package runner

import (
	"context"
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
}

// Runner runs a job within its Options. Trigger is safe to call from any
// goroutine, before Run too.
type Runner struct {
	job  func() error
	o    Options
	kick chan struct{}
}

// New returns a Runner of job. Nothing runs before Run.
func New(job func() error, o Options) *Runner {
	return &Runner{job: job, o: o, kick: make(chan struct{}, 1)}
}

// Trigger asks for a run as soon as MinInterval allows. It never blocks;
// requests that arrive before the run starts are served by it.
func (r *Runner) Trigger() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run runs the job on request, on MaxInterval and after failures until ctx
// ends. The first run waits for a Trigger (or MaxInterval).
func (r *Runner) Run(ctx context.Context) {
	maxTimer := newTimer(r.o.MaxInterval)
	defer maxTimer.Stop()
	retry := newTimer(0)
	defer retry.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-maxTimer.C:
		case <-retry.C:
		}
		if wait := r.o.MinInterval - time.Since(last); !last.IsZero() && wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		// This run serves every request made until now.
		select {
		case <-r.kick:
		default:
		}
		last = time.Now()
		err := r.job()
		retry.Stop()
		if err != nil && r.o.RetryInterval > 0 {
			retry.Reset(r.o.RetryInterval)
		}
		if r.o.MaxInterval > 0 {
			maxTimer.Stop()
			maxTimer.Reset(r.o.MaxInterval)
		}
	}
}

// newTimer returns a timer that fires after d, or a stopped one for d <= 0.
func newTimer(d time.Duration) *time.Timer {
	if d > 0 {
		return time.NewTimer(d)
	}
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}
