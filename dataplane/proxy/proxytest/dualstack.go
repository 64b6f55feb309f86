package proxytest

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
)

// dsName is the i-th Service of DualStackState.
func dsName(i int) string { return fmt.Sprintf("s%05d", i) }

// DualStackState is n ClusterIP Services × eps endpoints per family, in a
// Store and the State proxyd keeps (IPv4, and with dual IPv6 too): each
// Service has an IPv4 cluster IP and an IPv4 EndpointSlice, and with dual
// an IPv6 cluster IP and an IPv6 EndpointSlice beside them (a
// RequireDualStack Service). Every mode's dual-stack benchmark syncs it.
func DualStackState(n, eps int, dual bool) (*cluster.Store, *proxy.State) {
	ports := []cluster.EndpointPort{EPPort("p80", cluster.TCP, 8080)}
	var objs []cluster.Object
	for i := range n {
		s := Svc(dsName(i), fmt.Sprintf("10.%d.%d.%d", 96+i/65000, i/250%260, i%250+1), []cluster.ServicePort{TCP(80, 0)})
		var e4, e6 []Endpoint
		for j := range eps {
			e4 = append(e4, EP(A(fmt.Sprintf("10.%d.%d.%d", 245+j, i/250, i%250+1)), "node-b", true))
			e6 = append(e6, EP(A(fmt.Sprintf("fd00:10:%x:%x::%x", 0x245+j, i/250, i%250+1)), "node-b", true))
		}
		objs = append(objs, s, Slice(s, ports, e4...))
		if dual {
			s.ClusterIPs = append(s.ClusterIPs, A(fmt.Sprintf("fd00:10:96::%x", i+1)))
			es6 := Slice(s, ports, e6...)
			es6.Name = s.Name + "-v6"
			objs = append(objs, es6)
		}
	}
	st := cluster.NewStore()
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, objs)
	fams := []ipfamily.Family{ipfamily.IPv4}
	if dual {
		fams = append(fams, ipfamily.IPv6)
	}
	state := proxy.NewState(fams...)
	state.Update(st, NodeName, nil, true)
	return st, state
}

// ChangeOneEndpoint replaces the IPv4 EndpointSlice of the Service in the
// middle of DualStackState's n by one endpoint elsewhere, updates state and
// returns the keys whose ports changed (that Service, both its families).
func ChangeOneEndpoint(st *cluster.Store, state *proxy.State, n int) map[cluster.Key]bool {
	key := cluster.Key{Namespace: "default", Name: dsName(n / 2)}
	s := st.Service(key)
	st.Upsert(Slice(s, []cluster.EndpointPort{EPPort("p80", cluster.TCP, 8080)}, EP(A("10.250.250.250"), "node-c", true)))
	return state.Update(st, NodeName, map[cluster.Key]bool{key: true}, false)
}

// portsOf counts state's ports of family f.
func portsOf(state *proxy.State, f ipfamily.Family) int {
	c := 0
	for _, sps := range state.Ports {
		for _, sp := range sps {
			if sp.Family() == f && len(sp.Endpoints) > 0 {
				c++
			}
		}
	}
	return c
}

// DualStackTimes is one round of a mode: first sync wall and CPU time (the
// process's and its children's: iptables-restore runs as a child), and one
// endpoint changed.
type DualStackTimes struct{ Full, FullCPU, Change time.Duration }

func cpuAll() time.Duration {
	var self, kids syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids)
	return time.Duration(self.Utime.Nano() + self.Stime.Nano() + kids.Utime.Nano() + kids.Stime.Nano())
}

// DualStackRound syncs DualStackState(n, 10, dual) for the first time into
// the Backend newBackend gives for a fresh namespace lab's node, then one
// endpoint change, both inside the node's namespace.
func DualStackRound(b *testing.B, tag string, n int, dual bool, newBackend func(l *NetnsLab, dual bool) proxy.Backend) DualStackTimes {
	b.Helper()
	l := NewNetnsLab(b, tag)
	st, state := DualStackState(n, 10, dual)
	if got, want := portsOf(state, ipfamily.IPv6), map[bool]int{false: 0, true: n}[dual]; got != want || portsOf(state, ipfamily.IPv4) != n {
		b.Fatalf("%d IPv4 and %d IPv6 ports for %d Services, dual %v", portsOf(state, ipfamily.IPv4), got, n, dual)
	}
	be := newBackend(l, dual)
	var out DualStackTimes
	runtime.GC()
	err := l.Node.Do(func(ns.NetNS) error {
		start, cpu0 := time.Now(), cpuAll()
		if _, err := be.Sync(state.Ports, nil, true); err != nil {
			return err
		}
		out.Full, out.FullCPU = time.Since(start), cpuAll()-cpu0
		changed := ChangeOneEndpoint(st, state, n)
		start = time.Now()
		_, err := be.Sync(state.Ports, changed, false)
		out.Change = time.Since(start)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// DualStackSize is n of the dual-stack benchmarks: 10,000, or
// PODNET_BENCH_DUALSTACK_SIZE; rounds are 5 or PODNET_BENCH_ROUNDS if more.
func DualStackSize() (n, rounds int) {
	n, rounds = 10000, 5
	if v, err := strconv.Atoi(os.Getenv("PODNET_BENCH_DUALSTACK_SIZE")); err == nil && v > 1 {
		n = v
	}
	if r, err := strconv.Atoi(os.Getenv("PODNET_BENCH_ROUNDS")); err == nil && r > rounds {
		rounds = r
	}
	return n, rounds
}

// BenchDualStack runs mode's single-stack and dual-stack rounds
// alternately (which goes first alternates too) and prints the medians and
// their ratios as a table for BENCHMARKS.md (issue 22's goal: ≤ 2.2×).
func BenchDualStack(b *testing.B, mode string, newBackend func(l *NetnsLab, dual bool) proxy.Backend) {
	n, rounds := DualStackSize()
	var res [2][]DualStackTimes // single, dual
	for r := range rounds {
		for i := range 2 {
			dual := (i+r)%2 == 1
			k := 0
			if dual {
				k = 1
			}
			res[k] = append(res[k], DualStackRound(b, fmt.Sprintf("ds%s%d%d", mode[:2], r, k), n, dual, newBackend))
		}
	}
	med := func(ts []DualStackTimes, f func(DualStackTimes) time.Duration) time.Duration {
		var d []time.Duration
		for _, t := range ts {
			d = append(d, f(t))
		}
		slices.Sort(d)
		return d[len(d)/2]
	}
	full := func(t DualStackTimes) time.Duration { return t.Full }
	cpu := func(t DualStackTimes) time.Duration { return t.FullCPU }
	change := func(t DualStackTimes) time.Duration { return t.Change }
	fmt.Printf("%d interleaved rounds, medians\n\n", rounds)
	fmt.Printf("| %s mode, %d Services × 10 endpoints per family | first sync (CPU) | one endpoint changed |\n|---|---|---|\n", mode, n)
	for i, what := range []string{"single-stack (IPv4)", "dual-stack (IPv4 + IPv6)"} {
		fmt.Printf("| %s | %.3f s (%.3f s) | %.3f ms |\n", what, med(res[i], full).Seconds(), med(res[i], cpu).Seconds(),
			float64(med(res[i], change).Microseconds())/1000)
	}
	ratio := func(f func(DualStackTimes) time.Duration) float64 {
		return float64(med(res[1], f)) / float64(med(res[0], f))
	}
	fmt.Printf("| dual / single (goal ≤ 2.2×) | %.2f× (%.2f×) | %.2f× |\n", ratio(full), ratio(cpu), ratio(change))
}
