package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// The flat-RSS check of the churn scenarios: the same churn twice, each
// time left to settle, and the second settled RSS may not exceed the first
// by more than the noise of the measurement. The first round takes every
// map, buffer and informer cache to the size the churn needs; a leak adds
// to the second what the first left behind.

// rssProc is a process whose resident memory is watched.
type rssProc struct {
	name string
	pid  func() int
}

// rssSettled is one settled measurement: the median of the samples taken
// once the RSS stopped falling, their spread (max - min), and how long the
// settling took.
type rssSettled struct {
	median, spread int // KiB
	after          time.Duration
}

func (r rssSettled) String() string {
	return fmt.Sprintf("%.1f MiB (spread %d KiB, settled in %v)", float64(r.median)/1024, r.spread, r.after.Round(time.Second))
}

const (
	// rssQuiet: settled means no process's RSS fell by more than
	// rssFallKiB over this long. The Go runtime's scavenger returns freed
	// pages in the background, a few hundred KiB a second at most.
	rssQuiet   = 10 * time.Second
	rssFallKiB = 256
	// rssSamples are taken rssEvery apart once settled.
	rssSamples = 10
	rssEvery   = 500 * time.Millisecond
)

// settleRSS samples the processes' RSS every rssEvery until none fell by
// more than rssFallKiB over the last rssQuiet (at most limit), then takes
// rssSamples more and returns each one's median and spread.
func settleRSS(t *testing.T, procs []rssProc, limit time.Duration) []rssSettled {
	t.Helper()
	start := time.Now()
	var hist [][]int // per sample, per process
	window := int(rssQuiet / rssEvery)
	sample := func() []int {
		s := make([]int, len(procs))
		for i, p := range procs {
			s[i] = rssKiB(t, p.pid())
		}
		return s
	}
	quiet := func() bool {
		if len(hist) <= window {
			return false
		}
		for i := range procs {
			old := hist[len(hist)-1-window][i]
			low := old
			for _, s := range hist[len(hist)-window:] {
				low = min(low, s[i])
			}
			if old-low > rssFallKiB {
				return false
			}
		}
		return true
	}
	for !quiet() && time.Since(start) < limit {
		hist = append(hist, sample())
		time.Sleep(rssEvery)
	}
	if !quiet() {
		t.Logf("RSS still falling after %v; measuring anyway", limit)
	}
	after := time.Since(start)
	// The trace, every 5 s, shows how the RSS came down.
	for i, p := range procs {
		var trace []string
		for j := 0; j < len(hist); j += int(5 * time.Second / rssEvery) {
			trace = append(trace, fmt.Sprintf("%.1f", float64(hist[j][i])/1024))
		}
		t.Logf("%s RSS while settling (MiB, every 5 s): %s", p.name, strings.Join(trace, " "))
	}
	per := make([][]int, len(procs))
	for range rssSamples {
		for i, v := range sample() {
			per[i] = append(per[i], v)
		}
		time.Sleep(rssEvery)
	}
	out := make([]rssSettled, len(procs))
	for i, vs := range per {
		slices.Sort(vs)
		out[i] = rssSettled{median: vs[len(vs)/2], spread: vs[len(vs)-1] - vs[0], after: after}
	}
	return out
}

// rssNoiseKiB is how far a settled RSS may move with no leak: twice the
// larger spread seen within the two measurements, and at least rssFloorKiB.
// The floor is the run-to-run variation measured with no churn in between
// (see BENCHMARKS.md, Soak): the heap's free pages the scavenger has not
// returned yet, and the GC cycle's timing.
func rssNoiseKiB(a, b rssSettled) int { return max(2*max(a.spread, b.spread), rssFloorKiB) }

const rssFloorKiB = 1024

// rssFlat fails the test when a process's second settled RSS exceeds its
// first by more than the noise; it returns one "name a → b MiB" per
// process for the table.
func rssFlat(t *testing.T, procs []rssProc, first, second []rssSettled) string {
	t.Helper()
	var parts []string
	for i, p := range procs {
		a, b := first[i], second[i]
		noise := rssNoiseKiB(a, b)
		t.Logf("%s RSS settled after round 1: %v; after round 2: %v; allowed growth %d KiB", p.name, a, b, noise)
		if b.median > a.median+noise {
			t.Errorf("%s RSS grew from %.1f to %.1f MiB between two equal churn rounds (allowed: %d KiB of noise)",
				p.name, float64(a.median)/1024, float64(b.median)/1024, noise)
		}
		parts = append(parts, fmt.Sprintf("%s %.1f → %.1f MiB (±%d KiB)", p.name, float64(a.median)/1024, float64(b.median)/1024, noise))
	}
	return strings.Join(parts, ", ")
}

// churnSettle is settleRSS when the churn runs its two full rounds; make
// test's one short round is not left to settle, its RSS only sampled.
func churnSettle(t *testing.T, procs []rssProc, rounds int) []rssSettled {
	t.Helper()
	if rounds < 2 {
		out := make([]rssSettled, len(procs))
		for i, p := range procs {
			out[i].median = rssKiB(t, p.pid())
		}
		return out
	}
	return settleRSS(t, procs, 3*time.Minute)
}
