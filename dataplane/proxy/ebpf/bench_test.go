package ebpf

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/roottest"
)

// benchPorts is n ClusterIP Services × eps endpoints; the last one points
// at the test server (10.244.1.2:8080).
func benchPorts(n, eps int) map[cluster.Key][]*proxy.ServicePort {
	out := make(map[cluster.Key][]*proxy.ServicePort, n)
	for i := range n {
		var e []proxy.Endpoint
		for j := range eps {
			e = append(e, ep(fmt.Sprintf("10.%d.%d.%d", 245+j, i/250, i%250+1), 8080, false))
		}
		if i == n-1 {
			e = []proxy.Endpoint{ep("10.244.1.2", 8080, true)}
		}
		name := fmt.Sprintf("s%05d", i)
		out[key(name)] = []*proxy.ServicePort{clusterIPPort(name, benchVIP(i), 80, cluster.TCP, e...)}
	}
	return out
}

func benchVIP(i int) string { return fmt.Sprintf("10.%d.%d.%d", 96+i/65000, i/250%260, i%250+1) }

// memlock sums the kernel memory of the maps (fdinfo's memlock).
func memlock(maps ...*ebpf.Map) (int64, error) {
	var sum int64
	for _, m := range maps {
		f, err := os.Open(fmt.Sprintf("/proc/self/fdinfo/%d", m.FD()))
		if err != nil {
			return 0, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "memlock:"); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				sum += n
			}
		}
		f.Close()
	}
	return sum, nil
}

// cpuTime is the CPU this process used, kernel time (the map updates)
// included: steadier than wall time on a shared machine.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func medianOf(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

// BenchmarkServicesAtScale measures ebpf mode's sync times, map memory and
// connect latency at scale, once, printing tables for BENCHMARKS.md. It
// runs only with PODNET_BENCH=1, as scripts/bench-services.sh sets it.
func BenchmarkServicesAtScale(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1, as scripts/bench-services.sh does")
	}
	sizes := []int{1000, 5000, 10000}
	if s := os.Getenv("PODNET_BENCH_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Fields(s) {
			n, _ := strconv.Atoi(f)
			sizes = append(sizes, n)
		}
	}
	rounds := 1
	if r, err := strconv.Atoi(os.Getenv("PODNET_BENCH_ROUNDS")); err == nil && r > 0 {
		rounds = r
	}
	const eps = 10
	fmt.Printf("| mode | Services × endpoints | full load into empty maps (CPU) | the same entries, bare batch updates (CPU) | one endpoint changed | full resync, nothing changed | services entries | backends | map memory |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, n := range sizes {
		var full, fullCPU, bare, bareCPU, partial, resync []time.Duration
		var res proxy.SyncResult
		var mem int64
		for range rounds {
			dp, err := load("")
			if err != nil {
				b.Fatal(err)
			}
			ports := benchPorts(n, eps)
			sy := NewSyncer(dp.Maps, nil)
			start, cpu0 := time.Now(), cpuTime()
			if res, err = sy.Sync(ports, nil, true); err != nil {
				b.Fatal(err)
			}
			full, fullCPU = append(full, time.Since(start)), append(fullCPU, cpuTime()-cpu0)

			k := key(fmt.Sprintf("s%05d", n/2))
			sp := *ports[k][0]
			sp.ClusterEndpoints = append(slices.Clone(sp.ClusterEndpoints[1:]), ep("10.250.250.250", 8080, false))
			ports[k] = []*proxy.ServicePort{&sp}
			start = time.Now()
			if _, err := sy.Sync(ports, map[cluster.Key]bool{k: true}, false); err != nil {
				b.Fatal(err)
			}
			partial = append(partial, time.Since(start))

			start = time.Now()
			if _, err := sy.Sync(ports, nil, true); err != nil {
				b.Fatal(err)
			}
			resync = append(resync, time.Since(start))
			var ms []*ebpf.Map
			for _, m := range dp.coll.Maps {
				ms = append(ms, m)
			}
			for name, m := range dp.np.Maps {
				if dp.coll.Maps[name] == nil {
					ms = append(ms, m)
				}
			}
			if mem, err = memlock(ms...); err != nil {
				b.Fatal(err)
			}
			wall, cpu := bareLoad(b, dp)
			bare, bareCPU = append(bare, wall), append(bareCPU, cpu)
			dp.Close()
		}
		fmt.Printf("| ebpf | %d × %d | %.3f s (%.3f s) | %.3f s (%.3f s) | %.3f ms | %.3f s | %d | %d | %.1f MiB |\n", n, eps,
			medianOf(full).Seconds(), medianOf(fullCPU).Seconds(), medianOf(bare).Seconds(), medianOf(bareCPU).Seconds(),
			float64(medianOf(partial).Microseconds())/1000, medianOf(resync).Seconds(),
			res.Rules["services"], res.Rules["backends"], float64(mem)/(1<<20))
	}

	connectLatencyRounds(b)
}

// bareLoad writes what dp's services and backends maps hold into empty
// maps of a fresh load with nothing but the batch updates the syncer
// makes: the floor of a full load, the kernel's share of it.
func bareLoad(b *testing.B, dp *Datapath) (wall, cpu time.Duration) {
	b.Helper()
	svcs, err := dp.Maps.Services.Dump()
	if err != nil {
		b.Fatal(err)
	}
	bes, err := dp.Maps.Backends.Dump()
	if err != nil {
		b.Fatal(err)
	}
	sk, sv := make([]svcKey, 0, len(svcs)), make([]svcVal, 0, len(svcs))
	for k, v := range svcs {
		sk, sv = append(sk, k), append(sv, v)
	}
	bk, bv := make([]uint32, 0, len(bes)), make([]backend, 0, len(bes))
	for k, v := range bes {
		bk, bv = append(bk, k), append(bv, v)
	}
	empty, err := load("")
	if err != nil {
		b.Fatal(err)
	}
	defer empty.Close()
	start, cpu0 := time.Now(), cpuTime()
	if err := empty.Maps.Backends.Put(bk, bv); err != nil {
		b.Fatal(err)
	}
	if err := empty.Maps.Services.Put(sk, sv); err != nil {
		b.Fatal(err)
	}
	return time.Since(start), cpuTime() - cpu0
}

// connectLatencyRounds measures connect latency through socket LB against
// the pod address itself, from a client process in the cgroup (loopback
// inside one namespace: what is measured is the connect path, hooks
// included), at 10 and at 10,000 Services; the Service asked is the last
// of the set. ClusterIP and pod IP alternate connect by connect; the two
// sizes alternate in rounds (their order flipping each round), so the load
// of a shared machine hits all four variants alike; it prints the median over rounds of each
// round's p50 and p99, and the median of the per-round ratios, which pair
// variants measured seconds apart.
func connectLatencyRounds(b *testing.B) {
	rounds := 5
	if r, err := strconv.Atoi(os.Getenv("PODNET_BENCH_CONNECT_ROUNDS")); err == nil && r > 0 {
		rounds = r
	}
	const eps, connects = 10, 2000
	e := newSockEnv(b)
	dp, err := Open(e.pinDir, e.cgroup)
	if err != nil {
		b.Fatal(err)
	}
	defer dp.Close()
	sy := NewSyncer(dp.Maps, nil)
	type variant struct {
		services int
		cluster  bool
	}
	lat := map[variant][][2]time.Duration{} // per round: p50, p99
	for r := range rounds {
		sizes := []int{10, 10000}
		if r%2 == 1 {
			slices.Reverse(sizes)
		}
		for _, n := range sizes {
			if _, err := sy.Sync(benchPorts(n, eps), nil, true); err != nil {
				b.Fatal(err)
			}
			// The sync's garbage collected and a pause, so that what the
			// load left behind (in this process and the kernel) is not
			// measured with the larger size only.
			runtime.GC()
			time.Sleep(2 * time.Second)
			vip, pod := benchVIP(n-1)+":80", "10.244.1.2:8080"
			order := []string{vip, pod}
			if r%2 == 1 {
				slices.Reverse(order)
			}
			both := strings.Join(order, ",")
			out := e.client(true, "lat "+both+" 200", fmt.Sprintf("lat %s %d", both, connects)) // warm-up, then the measured run
			if len(out) != 4 {
				b.Fatalf("latency client: %v", out)
			}
			for i, to := range order {
				f := strings.Fields(out[2+i])
				if len(f) != 3 || f[0] != "ok" {
					b.Fatalf("latency client: %v", out)
				}
				p50, err1 := time.ParseDuration(f[1])
				p99, err2 := time.ParseDuration(f[2])
				if err1 != nil || err2 != nil {
					b.Fatalf("latency client: %v", f)
				}
				v := variant{n, to == vip}
				lat[v] = append(lat[v], [2]time.Duration{p50, p99})
			}
		}
	}
	at := func(v variant, q int) []time.Duration {
		var d []time.Duration
		for _, l := range lat[v] {
			d = append(d, l[q])
		}
		return d
	}
	us := func(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d.Nanoseconds())/1000) }
	fmt.Printf("\n%d interleaved rounds of %d connects (after 200 warm-up) per variant\n\n", rounds, connects)
	fmt.Printf("| mode | Services | to | connect p50 | connect p99 | p50 of each round |\n|---|---|---|---|---|---|\n")
	for _, v := range []variant{{10, true}, {10, false}, {10000, true}, {10000, false}} {
		what := "ClusterIP"
		if !v.cluster {
			what = "pod IP directly"
		}
		var each []string
		for _, d := range at(v, 0) {
			each = append(each, fmt.Sprintf("%.0f", float64(d.Nanoseconds())/1000))
		}
		fmt.Printf("| ebpf | %d | %s | %s | %s | %s |\n", v.services, what, us(medianOf(at(v, 0))), us(medianOf(at(v, 1))), strings.Join(each, " "))
	}
	ratio := func(num, den variant, q int) string {
		a, c := at(num, q), at(den, q)
		var rs []float64
		for i := range a {
			rs = append(rs, float64(a[i])/float64(c[i]))
		}
		slices.Sort(rs)
		return fmt.Sprintf("%.3f× (rounds %.2f–%.2f)", rs[len(rs)/2], rs[0], rs[len(rs)-1])
	}
	fmt.Printf("\n| ratio (median of the rounds' ratios) | p50 | p99 | target |\n|---|---|---|---|\n")
	fmt.Printf("| ClusterIP at 10,000 / ClusterIP at 10 | %s | %s | ≤ 1.05× |\n", ratio(variant{10000, true}, variant{10, true}, 0), ratio(variant{10000, true}, variant{10, true}, 1))
	fmt.Printf("| ClusterIP at 10,000 / pod IP at 10,000 | %s | %s | ≤ 1.1× |\n", ratio(variant{10000, true}, variant{10000, false}, 0), ratio(variant{10000, true}, variant{10000, false}, 1))
	fmt.Printf("| pod IP at 10,000 / pod IP at 10 (the noise floor) | %s | %s | — |\n", ratio(variant{10000, false}, variant{10, false}, 0), ratio(variant{10000, false}, variant{10, false}, 1))
}
