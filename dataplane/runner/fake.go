package runner

import (
	"slices"
	"sync"
	"time"
)

// FakeClock is a Clock a test moves with Advance: the channels After
// returns fire only when the time passes theirs. Pending tells what is
// armed, and Asked announces every call of After, so a test can wait for
// the code under test to be waiting before it moves the time on.
type FakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []fakeTimer
	asked  chan struct{}
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

// NewFakeClock returns a FakeClock at an arbitrary fixed time.
func NewFakeClock() *FakeClock {
	return &FakeClock{now: time.Unix(1_000_000, 0), asked: make(chan struct{}, 1024)}
}

// Asked gets a value for every call of After, up to the 1,024 not yet
// received (later ones are not announced, so code that asks often never
// blocks on a test that does not listen).
func (c *FakeClock) Asked() <-chan struct{} { return c.asked }

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
	} else {
		c.timers = append(c.timers, fakeTimer{at: c.now.Add(d), ch: ch})
	}
	select {
	case c.asked <- struct{}{}:
	default:
	}
	return ch
}

// Advance moves the time on by d, firing every channel due by then, and
// returns how many it fired.
func (c *FakeClock) Advance(d time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	fired := 0
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
			continue
		}
		t.ch <- t.at
		fired++
	}
	c.timers = kept
	return fired
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
