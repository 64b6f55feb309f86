package policy

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/nftmsg"
	"github.com/podnet/podnet/dataplane/policy/policybench"
	"github.com/podnet/podnet/dataplane/roottest"
)

// benchLocals are the two nodes the root benchmarks program: node1 as the
// world places it (its 100 pods are in two namespaces, so ~20 policies
// select them), and a node holding every pod but the client of
// BenchmarkFirstPacket, where all 1,000 policies are in the table (the
// worst case).
var benchLocals = []struct {
	name  string
	local func(*cluster.Pod) bool
}{
	{"Node1", onNode("node1")},
	{"AllPolicies", func(p *cluster.Pod) bool { return p.Name != benchClient }},
}

// BenchmarkProgramFull is the full programming of the benchmark's world
// (1,000 policies over 5,000 pods in 100 namespaces): the whole model built
// and compiled, and the table written in one transaction into an empty
// network namespace, as proxyd's first sync does. Goal (issue 24): <= 1 s.
// Wall and CPU time are reported for each half.
func BenchmarkProgramFull(b *testing.B) {
	_, h := roottest.NetNS(b, "podnet-polfull")
	conn, err := nftables.New(nftables.WithNetNSFd(int(h.Fd())), nftmsg.Buffers())
	if err != nil {
		b.Fatal(err)
	}
	pods, nss, pols := benchWorld(b)
	for _, bl := range benchLocals {
		b.Run(bl.name, func(b *testing.B) {
			var policies, elems int
			var compile, apply, compileCPU, applyCPU []float64
			for range b.N {
				b.StopTimer()
				tbl := NewTable(conn, Options{Families: ipfamily.All, LogGroup: 24})
				if err := tbl.Remove(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start, startCPU := time.Now(), cpuTime(b)
				prog := NewModel(pods, nss, pols).Compile(bl.local)
				compiled, compiledCPU := time.Now(), cpuTime(b)
				if err := tbl.Apply(prog); err != nil {
					b.Fatal(err)
				}
				compile, compileCPU = append(compile, ms(compiled.Sub(start))), append(compileCPU, ms(compiledCPU-startCPU))
				apply, applyCPU = append(apply, ms(time.Since(compiled))), append(applyCPU, ms(cpuTime(b)-compiledCPU))
				policies, elems = len(prog.Policies), tableElems(tbl)
			}
			b.ReportMetric(median(compile), "compile-ms")
			b.ReportMetric(median(apply), "apply-ms")
			b.ReportMetric(median(compileCPU), "compile-cpu-ms")
			b.ReportMetric(median(applyCPU), "apply-cpu-ms")
			b.ReportMetric(float64(policies), "policies")
			b.ReportMetric(float64(elems), "set-elements")
		})
	}
	NewTable(conn, Options{}).Remove()
}

// cpuTime is the process's user and system CPU time so far: the figure
// that holds on a loaded machine, where wall time is mostly waiting for a
// core. The kernel's work on an nftables batch runs in the sending thread
// and counts as system time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// tableElems counts the elements the applied program put in sets.
func tableElems(t *Table) int {
	n := 0
	for _, elems := range tableSets(t) {
		n += len(elems)
	}
	return n
}

// benchClient and benchServer are the pods of the world at the test node's
// addresses (10.244.1.3 and .2, pods 259 and 258; their IPv6 addresses
// set to the node's fd00:10:244:1::3 and ::2), moved so the world's
// policies allow the one to connect to the other: the server (ns58, as
// app8, tier web) on the programmed node, selected by ns58's deny and
// allow0; the client in ns0 (team t0) as tier web, on another node, so
// allow0 lets it in on the named port http.
var (
	benchClient = policybench.Pod(259).Name
	benchServer = policybench.Pod(258).Name
)

const benchPort = 8080

func firstPacketWorld(b testing.TB) ([]*cluster.Pod, []*cluster.Namespace, []*cluster.NetworkPolicy) {
	pods, nss, pols := benchWorld(b)
	for i, p := range pods {
		switch p.Name {
		case benchServer:
			c := *p
			c.NodeName = "node1"
			c.Labels = map[string]string{"app": "app8", "tier": "web"}
			c.IPs = []netip.Addr{netip.MustParseAddr(ips["r/web"]), netip.MustParseAddr(ips["r/web6"])}
			pods[i] = &c
		case benchClient:
			c := *p
			c.Namespace, c.NodeName = "ns0", "node0"
			c.Labels = map[string]string{"app": "app9", "tier": "web"}
			c.IPs = []netip.Addr{netip.MustParseAddr(ips["r/b"]), netip.MustParseAddr(ips["r/b6"])}
			pods[i] = &c
		}
	}
	return pods, nss, pols
}

// BenchmarkFirstPacket is the latency of a TCP connect (the SYN is the
// connection's first packet, judged by the whole chain path; the
// connection is reset after, so none is left behind) from a client pod to
// a server pod through the bridge of a node, both families, with the
// policy table of the benchmark's world loaded and with no table, side by
// side: each round applies the table, times the connects, removes it and
// times them again. Reported: the medians over rounds of each side's median,
// the median of the rounds' ratios, and the rules a first packet to the
// server meets at most (rulesMet). Each round also times the connects with
// only conntrack on (conntrackOnly): the ratio-conntrack metrics are
// against that. Goal (issue 24): within 1.05x.
func BenchmarkFirstPacket(b *testing.B) {
	const rounds, connects, warmup = 7, 1000, 100
	n := newTestNode(b)
	n.serve("a/web", benchPort)
	pods, nss, pols := firstPacketWorld(b)
	tbl := n.table()
	b.Cleanup(func() { tbl.Remove() })
	for _, bl := range benchLocals {
		prog := NewModel(pods, nss, pols).Compile(bl.local)
		for _, ends := range [][2]string{{"r/b", "r/web"}, {"r/b6", "r/web6"}} {
			src, dst := netip.MustParseAddr(ips[ends[0]]), netip.MustParseAddr(ips[ends[1]])
			if !prog.Allows(Flow{Src: src, Dst: dst, Protocol: cluster.TCP, Port: benchPort}) || prog.Allows(Flow{Src: src, Dst: dst, Protocol: cluster.TCP, Port: 81}) {
				b.Fatalf("%s: the program does not judge %s -> %s: want port %d allowed, 81 denied", bl.name, src, dst, benchPort)
			}
		}
		b.Run(bl.name, func(b *testing.B) {
			dst := map[ipfamily.Family]string{ipfamily.IPv4: "r/web", ipfamily.IPv6: "r/web6"}
			with, without, ratios := map[ipfamily.Family][]float64{}, map[ipfamily.Family][]float64{}, map[ipfamily.Family][]float64{}
			ct, ctRatios := map[ipfamily.Family][]float64{}, map[ipfamily.Family][]float64{}
			met := map[ipfamily.Family]int{}
			for range rounds {
				if err := tbl.Apply(prog); err != nil {
					b.Fatal(err)
				}
				for _, f := range ipfamily.All {
					with[f] = append(with[f], n.connectMedian(b, dst[f], warmup, connects))
					met[f], _ = rulesMet(b, tbl.conn, Ingress, netip.MustParseAddr(ips[dst[f]]))
				}
				if err := tbl.Remove(); err != nil {
					b.Fatal(err)
				}
				for _, f := range ipfamily.All {
					wo := n.connectMedian(b, dst[f], warmup, connects)
					without[f], ratios[f] = append(without[f], wo), append(ratios[f], with[f][len(with[f])-1]/wo)
				}
				removeCT := conntrackOnly(b, tbl.conn)
				for _, f := range ipfamily.All {
					c := n.connectMedian(b, dst[f], warmup, connects)
					ct[f], ctRatios[f] = append(ct[f], c), append(ctRatios[f], with[f][len(with[f])-1]/c)
				}
				removeCT()
			}
			for _, f := range ipfamily.All {
				fs := famSuffix(f)
				b.ReportMetric(median(with[f]), "v"+fs+"-policies-µs")
				b.ReportMetric(median(without[f]), "v"+fs+"-none-µs")
				b.ReportMetric(median(ratios[f]), "v"+fs+"-ratio")
				b.ReportMetric(float64(met[f]), "v"+fs+"-rules-met")
				b.ReportMetric(median(ct[f]), "v"+fs+"-conntrack-µs")
				b.ReportMetric(median(ctRatios[f]), "v"+fs+"-ratio-conntrack")
			}
			b.ReportMetric(float64(len(prog.Policies)), "policies")
		})
	}
}

// conntrackOnly adds a table whose one rule (ct state established,related
// accept on forward) turns conntrack on in the node's namespace, as the
// Service proxy's NAT does on a real node, and returns what removes it. The
// policy table turns conntrack on too, so against no table at all its
// ratio holds conntrack's cost for every packet of the connection as well
// as its own; against this one, its own.
func conntrackOnly(b testing.TB, conn *nftables.Conn) (remove func()) {
	t := &nftables.Table{Name: "podnet-bench-ct", Family: nftables.TableFamilyINet}
	prio, accept := nftables.ChainPriority(0), nftables.ChainPolicyAccept
	conn.AddTable(t)
	ch := conn.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: &prio, Policy: &accept})
	conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: ctEstablished()})
	if err := conn.Flush(); err != nil {
		b.Fatal(err)
	}
	return func() {
		conn.DelTable(t)
		if err := conn.Flush(); err != nil {
			b.Fatal(err)
		}
	}
}

// connectMedian connects from b/client to dst's benchPort warmup times,
// then connects more times, and returns the median connect in µs.
func (n *testNode) connectMedian(b *testing.B, dst string, warmup, connects int) float64 {
	addr := netip.AddrPortFrom(netip.MustParseAddr(ips[dst]), benchPort).String()
	var took []float64
	err := n.pods["b/client"].Do(func(ns.NetNS) error {
		for i := range warmup + connects {
			start := time.Now()
			c, err := net.DialTimeout("tcp", addr, time.Second)
			d := time.Since(start)
			if err != nil {
				return fmt.Errorf("connect %d to %s: %w", i, addr, err)
			}
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
			if i >= warmup {
				took = append(took, float64(d)/float64(time.Microsecond))
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return median(took)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
