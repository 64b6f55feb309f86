package runner

import (
	"slices"
	"sync"
	"time"
)

// FakeClock is a Clock a test moves with Advance: the channels After
// returns fire only when the time passes theirs. Pending tells what is
// armed, so a test can wait for a Runner to be waiting before it moves the
// time on.
type FakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []fakeTimer
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

// NewFakeClock returns a FakeClock at an arbitrary fixed time.
func NewFakeClock() *FakeClock { return &FakeClock{now: time.Unix(1_000_000, 0)} }

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that gets the time once Advance has moved it d
// on (at once for d <= 0).
func (c *FakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.timers = append(c.timers, fakeTimer{at: c.now.Add(d), ch: ch})
	return ch
}

// Advance moves the time on by d, firing every channel due by then.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
			continue
		}
		t.ch <- t.at
	}
	c.timers = kept
}

// Pending returns the times of the channels not fired yet, earliest first.
func (c *FakeClock) Pending() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]time.Time, len(c.timers))
	for i, t := range c.timers {
		out[i] = t.at
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}
