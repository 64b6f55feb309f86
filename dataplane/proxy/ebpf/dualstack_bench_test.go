package ebpf

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/roottest"
)

// dsBenchPorts is n ClusterIP Services × eps endpoints per family: an
// IPv4 port each, and with dual an IPv6 port of the same name beside it
// (a dual-stack Service as proxy.BuildServicePorts gives one Backend of
// every family).
func dsBenchPorts(n, eps int, dual bool) map[cluster.Key][]*proxy.ServicePort {
	out := make(map[cluster.Key][]*proxy.ServicePort, n)
	for i := range n {
		name := fmt.Sprintf("s%05d", i)
		var e4, e6 []proxy.Endpoint
		for j := range eps {
			e4 = append(e4, ep(fmt.Sprintf("10.%d.%d.%d", 245+j, i/250, i%250+1), 8080, false))
			e6 = append(e6, ep(fmt.Sprintf("fd00:10:%x:%x::%x", 0x245+j, i/250, i%250+1), 8080, false))
		}
		out[key(name)] = []*proxy.ServicePort{clusterIPPort(name, benchVIP(i), 80, cluster.TCP, e4...)}
		if dual {
			out[key(name)] = append(out[key(name)], clusterIPPort(name, fmt.Sprintf("fd00:10:96::%x", i+1), 80, cluster.TCP, e6...))
		}
	}
	return out
}

// dsSyncRound loads fresh maps, syncs n Services into them (full) and then
// one endpoint change of one Service's IPv4 port (partial).
func dsSyncRound(b *testing.B, n int, dual bool) (full, fullCPU, change time.Duration) {
	b.Helper()
	dp, err := load("")
	if err != nil {
		b.Fatal(err)
	}
	defer dp.Close()
	ports := dsBenchPorts(n, 10, dual)
	sy := NewSyncer(dp.Maps, nil)
	runtime.GC()
	start, cpu0 := time.Now(), cpuTime()
	if _, err := sy.Sync(ports, nil, true); err != nil {
		b.Fatal(err)
	}
	full, fullCPU = time.Since(start), cpuTime()-cpu0
	k := key(fmt.Sprintf("s%05d", n/2))
	sp := *ports[k][0]
	sp.ClusterEndpoints = append(slices.Clone(sp.ClusterEndpoints[1:]), ep("10.250.250.250", 8080, false))
	ports[k] = append([]*proxy.ServicePort{&sp}, ports[k][1:]...)
	start = time.Now()
	if _, err := sy.Sync(ports, map[cluster.Key]bool{k: true}, false); err != nil {
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
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("PODNET_BENCH_DUALSTACK_SIZE")); err == nil && v > 1 {
		n = v
	}
	rounds := 5
	if r, err := strconv.Atoi(os.Getenv("PODNET_BENCH_ROUNDS")); err == nil && r > rounds {
		rounds = r
	}
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
