package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/dataplane/routing"
	"github.com/podnet/podnet/e2e/lab"
)

// BenchmarkPodThroughputFamilies measures iperf3 TCP throughput pod → pod
// across two nodes of one segment for IPv4 and IPv6 pods on each path:
// host-gw, VXLAN over an IPv4 underlay and VXLAN over an IPv6 underlay,
// host-gw's path built without podnet (the kernel alone: the ceiling of
// podnet's host-gw), and between two bare namespaces joined by a veth pair
// over each family, all in one run, and prints each IPv6 figure against IPv4's on the same
// path and each against the bare veth of its family (issue 22's goal:
// IPv6 ≥ 0.95 × IPv4 on every path). Two dual-stack labs run side by side:
// one IPv4-first (VXLAN runs over the first family of the nodes'
// InternalIPs), one IPv6-first. Run it with scripts/bench-routing.sh; it
// is not part of `make test`.
func BenchmarkPodThroughputFamilies(b *testing.B) {
	roottest.Require(b)
	roottest.Tool(b, "iperf3", "iperf3")
	secs, rounds := 5, 3
	if s := os.Getenv("PODNET_BENCH_SECONDS"); s != "" {
		fmt.Sscan(s, &secs)
	}
	if s := os.Getenv("PODNET_BENCH_ROUNDS"); s != "" {
		fmt.Sscan(s, &rounds)
	}
	load0 := benchLoad()
	bareServer, bareClient := benchBareVeth(b)
	over4 := newFamBenchLab(b, ipfamily.IPv4, ipfamily.IPv6)
	over6 := newFamBenchLab(b, ipfamily.IPv6, ipfamily.IPv4)
	over6.use("vxlan")
	kernServer, kernClient := benchKernelHostGW(b)

	paths := []famBenchPath{
		{name: "bare veth", run: func(f ipfamily.Family) float64 {
			return benchIperf(b, secs, bareServer, bareClient, benchBareAddr[f].String())
		}},
		{name: "host-gw", run: func(f ipfamily.Family) float64 { return over4.iperf(secs, "host-gw", f) }},
		{name: "host-gw without podnet (the kernel alone)", run: func(f ipfamily.Family) float64 {
			return benchIperf(b, secs, kernServer, kernClient, benchKernelAddr[f].String())
		}},
		{name: "VXLAN over IPv4", run: func(f ipfamily.Family) float64 { return over4.iperf(secs, "vxlan", f) }},
		{name: "VXLAN over IPv6", run: func(f ipfamily.Family) float64 { return over6.iperf(secs, "vxlan", f) }},
	}
	for i := range paths {
		paths[i].got = map[ipfamily.Family][]float64{}
	}
	// Rounds interleave every path and family so drift of a shared machine
	// hits them alike; which family goes first alternates by round.
	for r := range rounds {
		fams := []ipfamily.Family{ipfamily.IPv4, ipfamily.IPv6}
		if r%2 == 1 {
			fams[0], fams[1] = fams[1], fams[0]
		}
		for i := range paths {
			for _, f := range fams {
				paths[i].got[f] = append(paths[i].got[f], paths[i].run(f))
			}
		}
	}
	famBenchReport(b, paths, rounds, secs, load0)
	over4.stop()
	over6.stop()
}

// famBenchPath is one path and its rounds' figures per family (bit/s).
type famBenchPath struct {
	name string
	run  func(ipfamily.Family) float64
	got  map[ipfamily.Family][]float64
}

// benchBareAddr is the server's address of the bare veth pair per family.
var benchBareAddr = map[ipfamily.Family]netip.Addr{
	ipfamily.IPv4: netip.MustParseAddr("10.99.0.2"),
	ipfamily.IPv6: netip.MustParseAddr("fd00:99::2"),
}

// benchKernelAddr is the server pod's address of host-gw's path built
// without podnet (benchKernelHostGW) per family.
var benchKernelAddr = map[ipfamily.Family]netip.Addr{
	ipfamily.IPv4: netip.MustParseAddr("10.1.2.2"),
	ipfamily.IPv6: netip.MustParseAddr("fd00:1:2::2"),
}

// benchKernelHostGW builds host-gw's pod path (pod veth, cbr0, node
// forwarding, underlay bridge, the peer node, its cbr0, pod veth) with ip
// commands alone (scripts/bench-hostgw-kernel.sh up), with what a podnet
// node has on the way: br_netfilter's hooks and a MASQUERADE rule per
// family. Measured in the same rounds as podnet's host-gw, it is the
// kernel's own IPv6 / IPv4 for the path: the ceiling of podnet's.
func benchKernelHostGW(b *testing.B) (benchStart, benchExec) {
	b.Helper()
	prefix := fmt.Sprintf("pnkhg%d", os.Getpid()%100000)
	script := func(arg string) *exec.Cmd {
		cmd := exec.Command("bash", "../scripts/bench-hostgw-kernel.sh", arg)
		cmd.Env = append(os.Environ(), "PREFIX="+prefix, "BRNF=1")
		return cmd
	}
	b.Cleanup(func() { _ = script("down").Run() })
	if out, err := script("up").CombinedOutput(); err != nil {
		b.Fatalf("bench-hostgw-kernel.sh up: %v\n%s", err, out)
	}
	return netnsPair(prefix+"-pod2", prefix+"-pod1")
}

// famBenchReport prints the medians as a table for BENCHMARKS.md and
// reports the IPv6 / IPv4 ratios.
func famBenchReport(b *testing.B, paths []famBenchPath, rounds, secs int, load0 string) {
	fmt.Printf("%d rounds × %d s, one iperf3 TCP stream; load average at start %s, at end %s\n\n", rounds, secs, load0, benchLoad())
	// Each round measures a path's two families back to back, so the
	// median of the rounds' own ratios is less exposed to the machine's
	// drift than the ratio of the medians.
	fmt.Println("| path | IPv4 median (of bare IPv4) | IPv6 median (of bare IPv6) | IPv6 / IPv4, medians | IPv6 / IPv4, median of rounds (goal ≥ 0.95) | rounds IPv4; IPv6 (Gbit/s) |")
	fmt.Println("|---|---|---|---|---|---|")
	v4, v6 := ipfamily.IPv4, ipfamily.IPv6
	bare4, bare6 := benchMedian(paths[0].got[v4]), benchMedian(paths[0].got[v6])
	for _, p := range paths {
		m4, m6 := benchMedian(p.got[v4]), benchMedian(p.got[v6])
		var ratios []float64
		for i := range p.got[v4] {
			ratios = append(ratios, p.got[v6][i]/p.got[v4][i])
		}
		mr := benchMedian(ratios)
		fmt.Printf("| %s | %.2f Gbit/s (%.2f) | %.2f Gbit/s (%.2f) | %.2f | **%.2f** | %s; %s |\n", p.name,
			m4/1e9, m4/bare4, m6/1e9, m6/bare6, m6/m4, mr, benchFmt(p.got[v4]), benchFmt(p.got[v6]))
		b.ReportMetric(mr, strings.NewReplacer(" ", "-", "(", "", ")", "").Replace(p.name)+"-v6/v4")
	}
}

// benchLoad is the 1-, 5- and 15-minute load averages.
func benchLoad() string {
	s, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(s))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// famBenchLab is a dual-stack lab of two nodes of one segment whose
// VXLAN runs over the family of the nodes' first InternalIP, with proxyd
// on both and one pod on each.
type famBenchLab struct {
	b        *testing.B
	lab      *lab.Lab
	n1, n2   *lab.Node
	procs    map[*lab.Node]*lab.Proc
	backend  string
	src, dst *lab.Pod
}

func newFamBenchLab(b *testing.B, fams ...ipfamily.Family) *famBenchLab {
	l := lab.Start(b, lab.Options{Nodes: lab.DefaultNodes()[:2], Families: fams})
	return &famBenchLab{b: b, lab: l, n1: l.Node("node1"), n2: l.Node("node2"), procs: map[*lab.Node]*lab.Proc{}}
}

// use restarts proxyd on both nodes with backend unless it runs already,
// waits until node1 routes both of node2's podCIDRs the backend's way,
// and adds the pods the first time (with the MTU of that backend).
func (c *famBenchLab) use(backend string) {
	if c.backend == backend {
		return
	}
	ctx := context.Background()
	var cidrs []string
	for _, p := range c.lab.ClusterCIDRs() {
		cidrs = append(cidrs, p.String())
	}
	for _, n := range []*lab.Node{c.n1, c.n2} {
		if p := c.procs[n]; p != nil {
			_ = p.Stop()
		}
		p, err := n.StartProxyd(ctx, "--cluster-cidr", strings.Join(cidrs, ","), "--backend", backend,
			"--proxy-mode", "none", "--healthz-bind-address", rtHealthAddr, "--metrics-bind-address", "127.0.0.1:10249")
		if err != nil {
			c.b.Fatal(err)
		}
		c.procs[n] = p
	}
	via := map[string]string{"host-gw": "dev eth0", "vxlan": "dev " + routing.DefaultDevice}[backend]
	for _, cidr := range c.n2.PodCIDRs() {
		c.waitRoute(cidr.Addr().Next().String(), via)
	}
	c.backend = backend
	if c.src == nil {
		var err error
		if c.src, err = c.n1.AddPod(ctx, "bsrc"); err != nil {
			c.b.Fatal(err)
		}
		if c.dst, err = c.n2.AddPod(ctx, "bdst"); err != nil {
			c.b.Fatal(err)
		}
	}
}

func (c *famBenchLab) waitRoute(dst, via string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, _ := c.n1.Exec(context.Background(), "ip", "route", "get", dst)
		if strings.Contains(r, via) {
			return
		}
		if time.Now().After(deadline) {
			c.b.Fatalf("%s: route to %s not via %s: %s\n%s", c.backend, dst, via, r, c.procs[c.n1].Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// iperf runs one stream from node1's pod to node2's pod's address of f
// over backend. Over VXLAN the stream uses the MSS a pod created under
// VXLAN would get: the pod MTU (underlay MTU − 50 over IPv4, − 70 over
// IPv6) less the IP and TCP headers of f.
func (c *famBenchLab) iperf(secs int, backend string, f ipfamily.Family) float64 {
	c.use(backend)
	var extra []string
	if backend == "vxlan" {
		mtu := lab.UnderlayMTU - routing.Overhead(c.lab.Families[0])
		hdr := map[ipfamily.Family]int{ipfamily.IPv4: 40, ipfamily.IPv6: 60}[f]
		extra = []string{"-M", fmt.Sprint(mtu - hdr)}
	}
	return benchIperf(c.b, secs, podServer(c.dst), c.src.Exec, c.dst.IPOf(f).String(), extra...)
}

func (c *famBenchLab) stop() {
	for _, p := range c.procs {
		_ = p.Stop()
	}
}
