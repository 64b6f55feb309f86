package proxytest_test

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
	"github.com/podnet/podnet/dataplane/proxy/iptables"
	"github.com/podnet/podnet/dataplane/proxy/nftables"
	"github.com/podnet/podnet/dataplane/proxy/proxytest"
	"github.com/podnet/podnet/dataplane/roottest"
)

// cpu is the CPU time of the process and of its finished children (the
// iptables commands): the kernel runs a netlink batch, and iptables-restore
// its own work, in the system calls of the one who asks.
func cpu() time.Duration {
	var self, kids syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids)
	return time.Duration(self.Utime.Nano() + self.Stime.Nano() + kids.Utime.Nano() + kids.Stime.Nano())
}

type modeFigures struct{ full, fullCPU, change, changeCPU []time.Duration }

func medianOf(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	if len(d)%2 == 0 {
		return (d[len(d)/2-1] + d[len(d)/2]) / 2
	}
	return d[len(d)/2]
}

// BenchmarkModesAtScale: podnet's nftables and iptables-nft modes side by
// side at 10,000 ClusterIP Services × 10 endpoints: the first full sync and
// one endpoint changed, each round a fresh namespace per mode, the modes'
// order alternating; medians of PODNET_BENCH_ROUNDS rounds (3). CPU time
// (process and children) is the figure on a shared machine, wall time
// beside it. PODNET_BENCH=1 only (root).
func BenchmarkModesAtScale(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1")
	}
	roottest.Require(b)
	const n, eps = 10000, 10
	rounds := 3
	if r, err := strconv.Atoi(os.Getenv("PODNET_BENCH_ROUNDS")); err == nil && r > 0 {
		rounds = r
	}
	modes := []string{"nftables", "iptables-nft"}
	figs := map[string]*modeFigures{}
	for _, m := range modes {
		figs[m] = &modeFigures{}
	}
	for r := range rounds {
		order := modes
		if r%2 == 1 {
			order = []string{modes[1], modes[0]}
		}
		for _, m := range order {
			modeRound(b, m, n, eps, r, figs[m])
			runtime.GC()
		}
	}
	f := func(d []time.Duration) string { return fmt.Sprintf("%.2f s", medianOf(d).Seconds()) }
	g := func(d []time.Duration) string {
		return fmt.Sprintf("%.1f ms", float64(medianOf(d).Microseconds())/1000)
	}
	fmt.Printf("| mode (%d × %d, median of %d rounds) | first full sync: CPU (wall) | one endpoint changed: CPU (wall) |\n|---|---|---|\n", n, eps, rounds)
	for _, m := range modes {
		fmt.Printf("| %s | %s (%s) | %s (%s) |\n", m, f(figs[m].fullCPU), f(figs[m].full), g(figs[m].changeCPU), g(figs[m].change))
	}
	a, c := figs["nftables"], figs["iptables-nft"]
	fmt.Printf("| nftables / iptables-nft | %.2f× (%.2f×) | %.2f× (%.2f×) |\n",
		ratio(a.fullCPU, c.fullCPU), ratio(a.full, c.full), ratio(a.changeCPU, c.changeCPU), ratio(a.change, c.change))
}

func ratio(a, b []time.Duration) float64 { return float64(medianOf(a)) / float64(medianOf(b)) }

func modeRound(b *testing.B, mode string, n, eps, round int, out *modeFigures) {
	st, state := proxytest.DualStackState(n, eps, false)
	l := proxytest.NewNetnsLab(b, fmt.Sprintf("m%s%d", mode[:2], round))
	var backend proxy.Backend
	if mode == "nftables" {
		backend = nftables.NewProxier(nftables.Config{Family: ipfamily.IPv4, ClusterCIDR: proxytest.ClusterCIDR}, nftables.Netlink{NetNS: int(l.Node.Fd())})
	} else {
		backend = iptables.NewProxier(iptables.Config{ClusterCIDR: proxytest.ClusterCIDR}, iptables.ExecRunner{Backend: iptables.BackendNFT})
	}
	sync := func(changed map[cluster.Key]bool, full bool) (wall, used time.Duration) {
		c0, w0 := cpu(), time.Now()
		if err := l.Node.Do(func(ns.NetNS) error {
			_, err := backend.Sync(state.Ports, changed, full)
			return err
		}); err != nil {
			b.Fatalf("%s: %v", mode, err)
		}
		return time.Since(w0), cpu() - c0
	}
	w, c := sync(nil, true)
	out.full, out.fullCPU = append(out.full, w), append(out.fullCPU, c)
	key := cluster.Key{Namespace: "default", Name: fmt.Sprintf("s%05d", n/2)}
	s := st.Service(key)
	st.Upsert(proxytest.Slice(s, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, proxytest.EP(proxytest.A("10.250.250.250"), "node-c", true)))
	changed := state.Update(st, proxytest.NodeName, map[cluster.Key]bool{key: true}, false)
	w, c = sync(changed, false)
	out.change, out.changeCPU = append(out.change, w), append(out.changeCPU, c)
}
