package e2e

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The flat-RSS check of the churn scenarios: the same churn twice, each
// time left to settle, and the second settled RSS may not exceed the first
// by more than the noise of the measurement. The first round takes every
// map, buffer and informer cache to the size the churn needs; a leak adds
// to the second what the first left behind.
//
// Settled means once the RSS has stopped falling, and after the daemon's
// next garbage collection from then on (the Go runtime forces one every two
// minutes at the latest): a GC during the churn's last changes leaves them
// in the live heap it reports.

// rssProc is a daemon whose resident memory is watched; metrics returns its
// Prometheus /metrics text (the Go collector's series are read from it).
type rssProc struct {
	name    string
	pid     func() int
	metrics func() string
}

// rssSettled is one settled measurement: the median of the RSS samples
// taken once settled and their spread (max - min), the live heap after the
// last GC, and how long the settling took.
type rssSettled struct {
	median, spread       int // KiB
	liveHeap, heapSpread int // KiB, over the GCs the samples saw
	after                time.Duration
}

func (r rssSettled) String() string {
	return fmt.Sprintf("RSS %.1f MiB (spread %d KiB), live heap %.1f MiB (spread %d KiB), settled in %v",
		float64(r.median)/1024, r.spread, float64(r.liveHeap)/1024, r.heapSpread, r.after.Round(time.Second))
}

// medianSpread returns the median and the spread (max - min) of vs.
func medianSpread(vs []int) [2]int {
	vs = slices.Clone(vs)
	slices.Sort(vs)
	return [2]int{vs[len(vs)/2], vs[len(vs)-1] - vs[0]}
}

const (
	// rssQuiet: settled means no process's RSS fell by more than
	// rssFallKiB over this long, after a GC.
	rssQuiet   = 10 * time.Second
	rssFallKiB = 256
	// rssSamples are taken rssEvery apart once settled.
	rssSamples = 20
	rssEvery   = 500 * time.Millisecond
)

// goGCs and goLiveHeapKiB read the Go collector's series: the number of
// completed GCs, and the live heap the last one left (the heap goal it set
// is twice that at GOGC=100).
func goGCs(metrics string) float64 {
	return metricSums(strings.NewReader(metrics))["go_gc_duration_seconds_count"]
}

func goLiveHeapKiB(metrics string) int {
	return int(metricSums(strings.NewReader(metrics))["go_memstats_next_gc_bytes"] / 2 / 1024)
}

// settleRSS samples the processes' RSS every rssEvery until none fell by
// more than rssFallKiB over the last rssQuiet, then waits for a GC of every
// process that began after that (an idle daemon's, so the live heap it
// leaves holds no churn in flight), at most limit in all, then takes
// rssSamples more and returns each one's median and spread.
func settleRSS(t *testing.T, procs []rssProc, limit time.Duration) []rssSettled {
	t.Helper()
	start := time.Now()
	var hist [][]int // per sample, per process
	window := int(rssQuiet / rssEvery)
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
	sample := func() []int {
		s := make([]int, len(procs))
		for i, p := range procs {
			s[i] = rssKiB(t, p.pid())
		}
		return s
	}
	for !quiet() && time.Since(start) < limit {
		hist = append(hist, sample())
		time.Sleep(rssEvery)
	}
	quietAt := time.Since(start)
	gcs := make([]float64, len(procs))
	for i, p := range procs {
		gcs[i] = goGCs(p.metrics())
	}
	collected := func() bool {
		for i, p := range procs {
			if goGCs(p.metrics()) <= gcs[i] {
				return false
			}
		}
		return true
	}
	for !collected() && time.Since(start) < limit {
		time.Sleep(rssEvery)
	}
	if !quiet() || !collected() {
		t.Errorf("RSS not settled after %v (quiet: %v, a GC after that: %v)", limit, quiet(), collected())
	}
	after := time.Since(start)
	// The trace, every 5 s, shows how the RSS came down.
	for i, p := range procs {
		var trace []string
		for j := 0; j < len(hist); j += int(5 * time.Second / rssEvery) {
			trace = append(trace, fmt.Sprintf("%.1f", float64(hist[j][i])/1024))
		}
		t.Logf("%s: RSS quiet %v after the churn, a GC %v after that; RSS until quiet (MiB, every 5 s): %s",
			p.name, quietAt.Round(time.Second), (after - quietAt).Round(time.Second), strings.Join(trace, " "))
	}
	per, heaps := make([][]int, len(procs)), make([][]int, len(procs))
	for range rssSamples {
		for i, v := range sample() {
			per[i] = append(per[i], v)
			heaps[i] = append(heaps[i], goLiveHeapKiB(procs[i].metrics()))
		}
		time.Sleep(rssEvery)
	}
	out := make([]rssSettled, len(procs))
	for i, vs := range per {
		rss, heap := medianSpread(vs), medianSpread(heaps[i])
		out[i] = rssSettled{median: rss[0], spread: rss[1], liveHeap: heap[0], heapSpread: heap[1], after: after}
		t.Logf("%s settled: %v", procs[i].name, out[i])
	}
	return out
}

// rssNoiseKiB is how far a settled RSS may move with no leak: twice the
// larger spread seen within the two measurements, and at least rssFloorKiB.
func rssNoiseKiB(a, b rssSettled) int { return max(2*max(a.spread, b.spread), rssFloorKiB) }

// rssFloorKiB is the least noise allowed between two settled RSS
// measurements. Measured (make soak, 1,000 Services, eight runs through the
// API server and the state directory): between equal rounds the settled
// RSS moved by -1.4 to +2.4 MiB (dnsd reading the state directory) while
// the live heap showed no trend: the RSS keeps what the round's peak heap
// took, and the peak depends on where the GC cycle was when the churn
// ended. This bound alone would miss a leak of one round's objects; the
// live heap's below would not.
const rssFloorKiB = 3072

// liveHeapNoiseKiB is the least growth of the live heap (the median over
// the GCs the settled samples saw) allowed between two rounds; twice the
// larger spread of those GCs' readings is allowed when more. Through the
// API server, where idle daemons collect rarely, the live heap moved by
// -0.1 to +0.0 MiB between rounds; dnsd reading the state directory
// collects every few seconds (its rescan) and read 3.9 to 4.9 MiB at single
// GCs in successive rounds with no trend over four. A leak of what one
// round of 1,000 Services leaves in dnsd's index and the cluster store
// (about 1.5 KB a Service, BENCHMARKS.md at 10,000) would add about 1.5 MiB.
const liveHeapNoiseKiB = 512

// rssFlat fails the test when a process's second settled RSS exceeds its
// first by more than the noise, or its live heap after a GC grew by more
// than its own noise; it returns one "name a → b MiB" per process for
// the table.
func rssFlat(t *testing.T, procs []rssProc, first, second []rssSettled) string {
	t.Helper()
	mib := func(kib int) float64 { return float64(kib) / 1024 }
	var parts []string
	for i, p := range procs {
		a, b := first[i], second[i]
		noise := rssNoiseKiB(a, b)
		t.Logf("%s settled after round 1: %v; after round 2: %v; allowed RSS growth %d KiB", p.name, a, b, noise)
		if b.median > a.median+noise {
			t.Errorf("%s RSS grew from %.1f to %.1f MiB between two equal churn rounds (allowed: %d KiB of noise)",
				p.name, mib(a.median), mib(b.median), noise)
		}
		heapNoise := max(2*max(a.heapSpread, b.heapSpread), liveHeapNoiseKiB)
		if b.liveHeap > a.liveHeap+heapNoise {
			t.Errorf("%s live heap after a GC grew from %.1f to %.1f MiB between two equal churn rounds (allowed: %d KiB)",
				p.name, mib(a.liveHeap), mib(b.liveHeap), heapNoise)
		}
		parts = append(parts, fmt.Sprintf("%s RSS %.1f → %.1f MiB (allowed +%.1f), live heap %.1f → %.1f MiB (allowed +%.1f)", p.name,
			mib(a.median), mib(b.median), mib(noise), mib(a.liveHeap), mib(b.liveHeap), mib(heapNoise)))
	}
	return strings.Join(parts, "; ")
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
	return settleRSS(t, procs, 4*time.Minute)
}

// churnRun is what runChurnUnderLoad measured.
type churnRun struct {
	perRound                  time.Duration // the churn's mean time per round
	stableTotal, stableFailed int64
	memory                    string // churnMemory's figure
}

// runChurnUnderLoad is scenario 2's frame, the same through the state
// directory and the API server: settle procs, hammer the stable Service
// with probe while churn runs rounds times (each followed by a settle),
// then fail the test on any failed probe and show the memory around the
// rounds.
func runChurnUnderLoad(t *testing.T, procs []rssProc, rounds int, probe func() error, churn func()) churnRun {
	t.Helper()
	before := churnSettle(t, procs, rounds)
	stable := &soakLoad{name: "stable Service"}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { stable.run(stop, 1000000, probe) })
	// Also on a churn's t.Fatal, so the client does not outlive the lab.
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopLoad()
	var settled [][]rssSettled
	var took time.Duration
	for range rounds {
		began := time.Now()
		churn()
		took += time.Since(began)
		settled = append(settled, churnSettle(t, procs, rounds))
	}
	stopLoad()
	var r churnRun
	r.perRound = (took / time.Duration(rounds)).Round(time.Second)
	// 20 requests at least show the load ran through the churn; a loaded
	// 2-core machine managed 48 in a 6 s round, so more would measure speed.
	r.stableTotal, r.stableFailed, _ = soakSummary(t, []*soakLoad{stable}, 20)
	r.memory = churnMemory(t, procs, before, settled)
	return r
}
