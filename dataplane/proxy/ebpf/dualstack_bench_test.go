package ebpf

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/proxy/proxytest"
	"github.com/podnet/podnet/dataplane/roottest"
)

// dsSyncRound loads fresh maps, syncs proxytest.DualStackState's n Services
// into them (full) and then one endpoint change of one Service's IPv4 port
// (partial).
func dsSyncRound(b *testing.B, n int, dual bool) (full, fullCPU, change time.Duration) {
	b.Helper()
	dp, err := load("")
	if err != nil {
		b.Fatal(err)
	}
	defer dp.Close()
	st, state := proxytest.DualStackState(n, 10, dual)
	sy := NewSyncer(dp.Maps, nil)
	runtime.GC()
	start, cpu0 := time.Now(), cpuTime()
	if _, err := sy.Sync(state.Ports, nil, true); err != nil {
		b.Fatal(err)
	}
	full, fullCPU = time.Since(start), cpuTime()-cpu0
	changed := proxytest.ChangeOneEndpoint(st, state, n)
	start = time.Now()
	if _, err := sy.Sync(state.Ports, changed, false); err != nil {
		b.Fatal(err)
	}
	return full, fullCPU, time.Since(start)
}

// BenchmarkDualStackSync measures ebpf mode's first sync and one endpoint
// change for n dual-stack Services × 10 endpoints per family against n
// single-stack ones (n = 10,000, or PODNET_BENCH_DUALSTACK_SIZE), in
// alternating rounds, and prints medians and their ratios for
// BENCHMARKS.md (issue 22's goal: ≤ 2.2×). It runs only with
// PODNET_BENCH=1, as scripts/bench-services.sh sets it.
func BenchmarkDualStackSync(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1, as scripts/bench-services.sh does")
	}
	n, rounds := proxytest.DualStackSize()
	type times struct{ full, fullCPU, change []time.Duration }
	var res [2]times // single, dual
	for r := range rounds {
		for i := range 2 {
			dual := (i+r)%2 == 1 // alternate which goes first
			full, cpu, change := dsSyncRound(b, n, dual)
			t := &res[map[bool]int{false: 0, true: 1}[dual]]
			t.full, t.fullCPU, t.change = append(t.full, full), append(t.fullCPU, cpu), append(t.change, change)
		}
	}
	fmt.Printf("%d interleaved rounds, medians\n\n", rounds)
	fmt.Printf("| ebpf mode, %d Services × 10 endpoints per family | first sync (CPU) | one endpoint changed |\n|---|---|---|\n", n)
	for i, what := range []string{"single-stack (IPv4)", "dual-stack (IPv4 + IPv6)"} {
		fmt.Printf("| %s | %.3f s (%.3f s) | %.3f ms |\n", what, medianOf(res[i].full).Seconds(), medianOf(res[i].fullCPU).Seconds(),
			float64(medianOf(res[i].change).Microseconds())/1000)
	}
	ratio := func(d, s []time.Duration) float64 { return float64(medianOf(d)) / float64(medianOf(s)) }
	fmt.Printf("| dual / single (goal ≤ 2.2×) | %.2f× (%.2f×) | %.2f× |\n", ratio(res[1].full, res[0].full), ratio(res[1].fullCPU, res[0].fullCPU),
		ratio(res[1].change, res[0].change))
}
