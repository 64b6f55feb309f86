package runner

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// The tests run in a synctest bubble: time is fake and moves only when
// every goroutine of the test waits, so "nothing ran for 250 ms" is a
// statement about the runner's timers, not about the machine's load.
// synctest.Wait returns once the runner has done all it can do now.

// job records when it ran and fails while fail > 0. (synctest.Wait
// orders nothing for the race detector, hence the lock.)
type job struct {
	mu    sync.Mutex
	times []time.Time
	fail  int
}

func (j *job) run() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.times = append(j.times, time.Now())
	if j.fail > 0 {
		j.fail--
		return errors.New("failed")
	}
	return nil
}

// runs are the times the job ran.
func (j *job) runs() []time.Time {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]time.Time(nil), j.times...)
}

// start runs r until the test ends.
func start(t *testing.T, r *Runner) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// after lets d pass and the runner do whatever it does by then.
func after(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

func TestBurstIsOneRunAfterMinInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &job{}
		r := New(j.run, Options{MinInterval: 100 * time.Millisecond})
		r.Trigger() // before Run: the first run happens at start
		start(t, r)
		synctest.Wait()
		if len(j.runs()) != 1 {
			t.Fatalf("%d runs after a trigger before Run, want 1 at once", len(j.runs()))
		}
		for range 10 {
			r.Trigger()
		}
		after(99 * time.Millisecond)
		if len(j.runs()) != 1 {
			t.Fatalf("%d runs 99 ms after the first, want the burst held back by MinInterval", len(j.runs()))
		}
		after(time.Millisecond)
		if len(j.runs()) != 2 {
			t.Fatalf("%d runs at MinInterval after the first, want the burst served", len(j.runs()))
		}
		after(time.Hour)
		if len(j.runs()) != 2 {
			t.Errorf("%d runs for one trigger and a burst of 10, want 2", len(j.runs()))
		}
	})
}

func TestNothingRunsUnasked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &job{}
		start(t, New(j.run, Options{MinInterval: time.Millisecond}))
		after(24 * time.Hour)
		if len(j.runs()) != 0 {
			t.Errorf("%d runs without a trigger or MaxInterval", len(j.runs()))
		}
	})
}

func TestMaxIntervalRunsUnasked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &job{}
		start(t, New(j.run, Options{MinInterval: time.Millisecond, MaxInterval: 50 * time.Millisecond}))
		after(49 * time.Millisecond)
		if len(j.runs()) != 0 {
			t.Fatalf("%d runs before MaxInterval", len(j.runs()))
		}
		after(time.Millisecond + 2*50*time.Millisecond)
		if len(j.runs()) != 3 {
			t.Fatalf("%d runs after three MaxIntervals, want 3", len(j.runs()))
		}
		runs := j.runs()
		for i := 1; i < len(runs); i++ {
			if gap := runs[i].Sub(runs[i-1]); gap != 50*time.Millisecond {
				t.Errorf("run %d came %v after the previous one, want MaxInterval", i, gap)
			}
		}
	})
}

// TestTriggerPostponesMaxInterval: MaxInterval counts from the end of the
// last run, asked for or not.
func TestTriggerPostponesMaxInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &job{}
		r := New(j.run, Options{MaxInterval: 50 * time.Millisecond})
		start(t, r)
		after(30 * time.Millisecond)
		r.Trigger()
		after(49 * time.Millisecond)
		if len(j.runs()) != 1 {
			t.Fatalf("%d runs 49 ms after a triggered one, want 1", len(j.runs()))
		}
		after(time.Millisecond)
		if len(j.runs()) != 2 {
			t.Fatalf("%d runs MaxInterval after a triggered one, want 2", len(j.runs()))
		}
	})
}

func TestFailedRunIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &job{fail: 2}
		r := New(j.run, Options{MinInterval: 10 * time.Millisecond, RetryInterval: 30 * time.Millisecond})
		r.Trigger()
		start(t, r)
		after(29 * time.Millisecond)
		if len(j.runs()) != 1 {
			t.Fatalf("%d runs before RetryInterval after a failure, want 1", len(j.runs()))
		}
		after(time.Millisecond + 30*time.Millisecond) // two failures, then success
		if len(j.runs()) != 3 {
			t.Fatalf("%d runs, want 3: two failures, each retried", len(j.runs()))
		}
		after(time.Hour)
		if len(j.runs()) != 3 {
			t.Errorf("%d runs, want 3: a successful run is not retried", len(j.runs()))
		}
	})
}

func TestNoRetryWithoutRetryInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &job{fail: 1}
		r := New(j.run, Options{MinInterval: time.Millisecond})
		r.Trigger()
		start(t, r)
		after(time.Hour)
		if len(j.runs()) != 1 {
			t.Errorf("%d runs, want 1", len(j.runs()))
		}
	})
}

func TestRunStopsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &job{}
		r := New(j.run, Options{MinInterval: time.Hour})
		r.Trigger()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { r.Run(ctx); close(done) }()
		synctest.Wait()
		r.Trigger() // waits out MinInterval: an hour
		synctest.Wait()
		cancel()
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("Run did not return after ctx ended while waiting out MinInterval")
		}
		if len(j.runs()) != 1 {
			t.Errorf("%d runs, want the first only", len(j.runs()))
		}
	})
}

// TestDelayServesABurstOnce: Triggers wait Delay, and those made
// meanwhile are served by the same run.
func TestDelayServesABurstOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &job{}
		r := New(j.run, Options{Delay: 100 * time.Millisecond})
		start(t, r)
		r.Trigger()
		after(60 * time.Millisecond)
		r.Trigger() // within the delay: served by the same run
		r.Trigger()
		after(39 * time.Millisecond)
		if n := len(j.runs()); n != 0 {
			t.Fatalf("%d runs before the delay passed", n)
		}
		after(time.Millisecond)
		if n := len(j.runs()); n != 1 {
			t.Fatalf("%d runs once the delay passed, want 1", n)
		}
		after(time.Hour)
		if n := len(j.runs()); n != 1 {
			t.Errorf("%d runs an hour later, want 1: one for the burst", n)
		}
	})
}

// TestTriggerAfterRunsAtItsTime: a run asked for later is not served by
// an earlier one.
func TestTriggerAfterRunsAtItsTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &job{}
		r := New(j.run, Options{})
		start(t, r)
		r.TriggerAfter(2 * time.Second)
		r.Trigger()
		synctest.Wait()
		if n := len(j.runs()); n != 1 {
			t.Fatalf("%d runs after a Trigger, want 1 at once", n)
		}
		after(2*time.Second - time.Millisecond)
		if n := len(j.runs()); n != 1 {
			t.Fatalf("%d runs before the time asked for, want 1", n)
		}
		after(time.Millisecond)
		if n := len(j.runs()); n != 2 {
			t.Fatalf("%d runs at the time asked for, want 2", n)
		}
	})
}

// TestInjectedClock: a Runner on a FakeClock waits for that clock, not
// the system's (the state directory's watcher cannot run in a synctest
// bubble: it blocks in a system call).
func TestInjectedClock(t *testing.T) {
	c := NewFakeClock()
	ran := make(chan struct{}, 10)
	r := New(func() error { ran <- struct{}{}; return nil }, Options{Delay: time.Second, Clock: c})
	start(t, r)
	r.Trigger()
	at := c.Now().Add(time.Second)
	for !slices.ContainsFunc(c.Pending(), at.Equal) {
		select { // the runner arms its timer: an event, not a duration
		case <-ran:
			t.Fatal("ran before the fake clock moved")
		case <-time.After(time.Millisecond):
		}
	}
	c.Advance(time.Second)
	<-ran
}

func TestTriggerNowSkipsMinIntervalAndDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &job{}
		r := New(j.run, Options{MinInterval: time.Second, Delay: 50 * time.Millisecond})
		r.TriggerNow()
		start(t, r)
		synctest.Wait()
		if len(j.runs()) != 1 {
			t.Fatalf("%d runs after TriggerNow, want 1 at once (no Delay)", len(j.runs()))
		}
		after(100 * time.Millisecond)
		r.Trigger()
		r.TriggerNow()
		synctest.Wait()
		if len(j.runs()) != 2 {
			t.Fatalf("%d runs after TriggerNow 100 ms after a run, want 2: MinInterval does not hold it", len(j.runs()))
		}
		r.Trigger()
		after(999 * time.Millisecond)
		if len(j.runs()) != 2 {
			t.Fatalf("%d runs: a Trigger after the urgent run must wait for MinInterval again", len(j.runs()))
		}
		after(time.Millisecond)
		if len(j.runs()) != 3 {
			t.Fatalf("%d runs at MinInterval after the urgent run, want 3", len(j.runs()))
		}
	})
}
