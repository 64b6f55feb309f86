package iptables_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/iptables"
	"github.com/podnet/podnet/dataplane/proxy/proxytest"
	"github.com/podnet/podnet/dataplane/roottest"
)

// benchState is n ClusterIP Services × eps endpoints; Service 0 points at
// the lab's real server (10.244.1.5:8080), the rest at addresses that
// never answer.
func benchState(n, eps int) (*cluster.Store, *proxy.State) {
	var objs []cluster.Object
	for i := range n {
		vip := fmt.Sprintf("10.%d.%d.%d", 96+i/65000, i/250%260, i%250+1)
		s := proxytest.Svc(fmt.Sprintf("s%05d", i), vip, []cluster.ServicePort{proxytest.TCP(80, 0)})
		var e []proxytest.Endpoint
		for j := range eps {
			e = append(e, proxytest.EP(proxytest.A(fmt.Sprintf("10.%d.%d.%d", 245+j, i/250, i%250+1)), "node-b", true))
		}
		if i == n-1 {
			e = []proxytest.Endpoint{proxytest.EP(proxytest.A("10.244.1.5"), "node-b", true)}
		}
		objs = append(objs, s, proxytest.Slice(s, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, e...))
	}
	st := cluster.NewStore()
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, objs)
	state := proxy.NewState(ipfamily.IPv4)
	state.Update(st, proxytest.NodeName, nil, true)
	return st, state
}

func lastVIP(n int) string {
	i := n - 1
	return fmt.Sprintf("10.%d.%d.%d:80", 96+i/65000, i/250%260, i%250+1)
}

// childCPU is the CPU time used by finished child processes (the iptables
// commands): on a shared, busy machine it says more than wall time.
func childCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func maxRSSKiB(who int) int64 {
	var ru syscall.Rusage
	syscall.Getrusage(who, &ru)
	return ru.Maxrss
}

// connectTimes returns sorted TCP connect durations to addr from a namespace.
func connectTimes(t testing.TB, from ns.NetNS, addr string, n int) []time.Duration {
	var out []time.Duration
	err := from.Do(func(ns.NetNS) error {
		for range n {
			start := time.Now()
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				return err
			}
			out = append(out, time.Since(start))
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func pct(d []time.Duration, p float64) time.Duration { return d[int(float64(len(d)-1)*p)] }

func median(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	if len(d)%2 == 0 {
		return (d[len(d)/2-1] + d[len(d)/2]) / 2
	}
	return d[len(d)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkServicesAtScale measures sync times, rule counts and first-packet
// latency at scale, once, printing tables for BENCHMARKS.md. It takes
// minutes, so it runs only with PODNET_BENCH=1, as scripts/bench-services.sh
// sets it (not in the `go test -bench .` sweep of make bench).
func BenchmarkServicesAtScale(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1, as scripts/bench-services.sh does")
	}
	var t testing.TB = b
	roottest.Require(t)
	backends := strings.Fields(os.Getenv("PODNET_BENCH_BACKENDS"))
	if len(backends) == 0 {
		backends = []string{iptables.BackendNFT, iptables.BackendLegacy}
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
	fmt.Printf("| backend | Services × endpoints | full sync (iptables CPU) | one endpoint changed (iptables CPU) | nat rules | nat chains | proxy RSS | iptables-restore RSS |\n|---|---|---|---|---|---|---|---|\n")
	for _, backend := range backends {
		for _, n := range sizes {
			// Each figure is the median of rounds, each in a fresh node.
			var full, fullCPU, partial, partialCPU []time.Duration
			var res proxy.SyncResult
			var chains int
			for r := range rounds {
				l := proxytest.NewNetnsLab(t, fmt.Sprintf("b%s%d-%d", backend[:1], n, r))
				st, state := benchState(n, eps)
				p := iptables.NewProxier(defaultCfg, timedRunner{iptables.ExecRunner{Backend: backend}})
				cpu0 := childCPU()
				start := time.Now()
				if err := l.Node.Do(func(ns.NetNS) error {
					var err error
					res, err = p.Sync(state.Ports, nil, true)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				full, fullCPU = append(full, time.Since(start)), append(fullCPU, childCPU()-cpu0)

				// One endpoint of one Service in the middle changes.
				key := cluster.Key{Namespace: "default", Name: fmt.Sprintf("s%05d", n/2)}
				s := st.Service(key)
				st.Upsert(proxytest.Slice(s, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, proxytest.EP(proxytest.A("10.250.250.250"), "node-c", true)))
				changed := state.Update(st, proxytest.NodeName, map[cluster.Key]bool{key: true}, false)
				cpu0 = childCPU()
				start = time.Now()
				if err := l.Node.Do(func(ns.NetNS) error {
					_, err := p.Sync(state.Ports, changed, false)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				partial, partialCPU = append(partial, time.Since(start)), append(partialCPU, childCPU()-cpu0)
				var save []byte
				l.Node.Do(func(ns.NetNS) error {
					save, _ = exec.Command("iptables-"+backend+"-save", "-t", "nat").Output()
					return nil
				})
				chains = len(iptables.ProxyChains(save))
			}
			fmt.Printf("| %s | %d × %d | %.2f s (%.2f s) | %.0f ms (%.0f ms) | %d | %d | %d MiB | %d MiB |\n", backend, n, eps,
				median(full).Seconds(), median(fullCPU).Seconds(), ms(median(partial)), ms(median(partialCPU)), res.Rules["nat"], chains,
				maxRSSKiB(syscall.RUSAGE_SELF)/1024, maxRSSKiB(syscall.RUSAGE_CHILDREN)/1024)
		}
	}

	// First-packet latency: TCP connect through a ClusterIP to a real
	// server, at 10 and at 10,000 Services (the Service probed is the last
	// one, deepest in the dispatch tree).
	fmt.Printf("\n| backend | Services | connect p50 | connect p99 |\n|---|---|---|---|\n")
	for _, backend := range backends {
		for _, n := range []int{10, 10000} {
			l := proxytest.NewNetnsLab(t, fmt.Sprintf("l%s%d", backend[:1], n))
			l.Serve(t, "10.244.1.5:8080")
			_, state := benchState(n, eps)
			p := iptables.NewProxier(defaultCfg, iptables.ExecRunner{Backend: backend})
			if err := l.Node.Do(func(ns.NetNS) error { _, err := p.Sync(state.Ports, nil, true); return err }); err != nil {
				t.Fatal(err)
			}
			connectTimes(t, l.Client, lastVIP(n), 200) // warm up
			d := connectTimes(t, l.Client, lastVIP(n), 2000)
			fmt.Printf("| %s | %d | %d µs | %d µs |\n", backend, n, pct(d, 0.5).Microseconds(), pct(d, 0.99).Microseconds())
		}
	}
}

// timedRunner reports each iptables call when PODNET_BENCH_TRACE is set.
type timedRunner struct{ iptables.ExecRunner }

func (r timedRunner) Restore(data []byte) error {
	start, cpu := time.Now(), childCPU()
	err := r.ExecRunner.Restore(data)
	if os.Getenv("PODNET_BENCH_TRACE") != "" {
		fmt.Printf("  restore %d bytes, %d lines: %v (cpu %v)\n", len(data), strings.Count(string(data), "\n"), time.Since(start), childCPU()-cpu)
	}
	return err
}
