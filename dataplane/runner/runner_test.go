package runner

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// job records when it ran and fails while fail > 0.
type job struct {
	mu   sync.Mutex
	runs []time.Time
	fail int
}

func (j *job) run() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.runs = append(j.runs, time.Now())
	if j.fail > 0 {
		j.fail--
		return errors.New("failed")
	}
	return nil
}

func (j *job) count() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.runs)
}

// waitRuns waits until the job ran n times, failing after 5 s.
func (j *job) waitRuns(t *testing.T, n int) []time.Time {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for j.count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("job ran %d times, want %d", j.count(), n)
		}
		time.Sleep(time.Millisecond)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]time.Time(nil), j.runs...)
}

func start(t *testing.T, r *Runner) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func TestBurstIsOneRunAfterMinInterval(t *testing.T) {
	j := &job{}
	r := New(j.run, Options{MinInterval: 100 * time.Millisecond})
	r.Trigger() // before Run: the first run happens at start
	start(t, r)
	j.waitRuns(t, 1)
	for range 10 {
		r.Trigger()
	}
	runs := j.waitRuns(t, 2)
	if gap := runs[1].Sub(runs[0]); gap < 100*time.Millisecond {
		t.Errorf("second run %v after the first, want >= MinInterval", gap)
	}
	time.Sleep(250 * time.Millisecond)
	if n := j.count(); n != 2 {
		t.Errorf("%d runs for one trigger and a burst of 10, want 2", n)
	}
}

func TestNothingRunsUnasked(t *testing.T) {
	j := &job{}
	start(t, New(j.run, Options{MinInterval: time.Millisecond}))
	time.Sleep(50 * time.Millisecond)
	if n := j.count(); n != 0 {
		t.Errorf("%d runs without a trigger or MaxInterval", n)
	}
}

func TestMaxIntervalRunsUnasked(t *testing.T) {
	j := &job{}
	r := New(j.run, Options{MinInterval: time.Millisecond, MaxInterval: 50 * time.Millisecond})
	start(t, r)
	runs := j.waitRuns(t, 3)
	for i := 1; i < len(runs); i++ {
		if gap := runs[i].Sub(runs[i-1]); gap < 50*time.Millisecond {
			t.Errorf("run %d came %v after the previous one, want >= MaxInterval", i, gap)
		}
	}
}

func TestFailedRunIsRetried(t *testing.T) {
	j := &job{fail: 2}
	r := New(j.run, Options{MinInterval: 10 * time.Millisecond, RetryInterval: 30 * time.Millisecond})
	r.Trigger()
	start(t, r)
	runs := j.waitRuns(t, 3) // two failures, then success
	if gap := runs[1].Sub(runs[0]); gap < 30*time.Millisecond {
		t.Errorf("retry %v after the failure, want >= RetryInterval", gap)
	}
	time.Sleep(100 * time.Millisecond)
	if n := j.count(); n != 3 {
		t.Errorf("%d runs, want 3: a successful run is not retried", n)
	}
}

func TestNoRetryWithoutRetryInterval(t *testing.T) {
	j := &job{fail: 1}
	r := New(j.run, Options{MinInterval: time.Millisecond})
	r.Trigger()
	start(t, r)
	j.waitRuns(t, 1)
	time.Sleep(50 * time.Millisecond)
	if n := j.count(); n != 1 {
		t.Errorf("%d runs, want 1", n)
	}
}

func TestRunStopsWithContext(t *testing.T) {
	j := &job{}
	r := New(j.run, Options{MinInterval: time.Hour})
	r.Trigger()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	j.waitRuns(t, 1)
	r.Trigger() // waits out MinInterval: an hour
	time.Sleep(10 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("Run did not return after ctx ended while waiting out MinInterval")
	}
}
