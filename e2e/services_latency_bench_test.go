package e2e

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/metricstest"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
)

// BenchmarkClusterIPConnectLockstep compares ClusterIP connect latency at
// 10 and at 10,000 Services connect by connect. BPF maps (and iptables)
// hold one set of Services at a time, so the two sizes live on two lab
// nodes: node1's proxyd reads a state directory of 10 Services, node2's
// one of 10,000 × 10 endpoints (each node its own cgroup and pin dir). On
// each node a client pod connects to the node's own Service, whose one
// endpoint is a server pod on the same node, and to that pod's address
// directly. The two clients are driven in lock-step, one connect at a
// time (node1 ClusterIP, node2 ClusterIP, node1 pod IP, node2 pod IP, the
// order turning with every step), so the load of the shared machine falls
// on all four alike. Before node2 gets its 10,000 Services, the same
// rounds run with 10 on both nodes: the noise floor, and whatever differs
// between the two nodes themselves. It runs only with PODNET_BENCH=1, as
// scripts/bench-services.sh sets it.
//
//	PODNET_BENCH_MODES="ebpf iptables"  proxy modes, in this order
//	PODNET_BENCH_CONNECT_ROUNDS=9       rounds at 10 against 10,000
//	PODNET_BENCH_FLOOR_ROUNDS=5         rounds at 10 against 10
//	PODNET_BENCH_CONNECTS=2000          connects per variant and round
//	PODNET_BENCH_CPUS=LAST              both clients on these CPUs (taskset -c;
//	                                    "any": unpinned). Unpinned, the per-round
//	                                    ratios spread 0.82–1.25 where pinned they
//	                                    spread 0.98–1.04 (5 rounds each, 21:25 UTC)
func BenchmarkClusterIPConnectLockstep(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1, as scripts/bench-services.sh does")
	}
	roottest.Require(b)
	envInt := func(name string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
			return v
		}
		return def
	}
	o := lockstepOptions{
		modes:       strings.Fields(cmp.Or(os.Getenv("PODNET_BENCH_MODES"), "ebpf iptables")),
		small:       10,
		big:         10000,
		endpoints:   10,
		rounds:      envInt("PODNET_BENCH_CONNECT_ROUNDS", 9),
		floorRounds: envInt("PODNET_BENCH_FLOOR_ROUNDS", 5),
		connects:    envInt("PODNET_BENCH_CONNECTS", 2000),
		warmup:      200,
		cpus:        cmp.Or(os.Getenv("PODNET_BENCH_CPUS"), strconv.Itoa(runtime.NumCPU()-1)),
	}
	lab.ProxydReadyTimeout = 2 * time.Minute // reading 20,000 objects
	res := lockstepLatency(b, o)
	res.print(o)
}

// lockstepOptions say what lockstepLatency measures.
type lockstepOptions struct {
	modes                 []string
	small, big, endpoints int // Services on node1 and (later) node2; endpoints of each filler Service
	rounds, floorRounds   int
	connects, warmup      int    // per variant and round
	cpus                  string // where both clients run (taskset -c), "" anywhere
}

// The four variants of a round: a side (node1 with the small set, node2)
// and a target (the ClusterIP, the pod address).
const (
	lsSmallVIP = iota
	lsBigVIP
	lsSmallPod
	lsBigPod
	lsVariants
)

// lockstepRound is one round's p50 and p99 per variant.
type lockstepRound struct {
	p50, p99 [lsVariants]time.Duration
}

// lockstepResults holds the rounds per mode and phase ("floor": the small
// set on both nodes; "scale": the big set on node2).
type lockstepResults struct {
	rounds map[string]map[string][]lockstepRound
	load   map[string][2]string // load average before and after each mode
}

const lsVIP = "10.100.0.10"

// lockstepLatency builds a two-node lab and measures, per mode, the floor
// rounds and then the scale rounds.
func lockstepLatency(tb testing.TB, o lockstepOptions) *lockstepResults {
	ctx := context.Background()
	l := lab.Start(tb, lab.Options{Nodes: lab.DefaultNodes()[:2]})
	small, big := l.Node("node1"), l.Node("node2")
	dirs := map[*lab.Node]string{}
	for _, n := range []*lab.Node{small, big} {
		dirs[n] = filepath.Join(tb.TempDir(), n.Name)
		if err := os.MkdirAll(dirs[n], 0o755); err != nil {
			tb.Fatal(err)
		}
		for _, f := range []string{"nodes.yaml", "namespaces.yaml"} {
			data, err := os.ReadFile(filepath.Join(l.StateDir(), f))
			if err != nil {
				tb.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dirs[n], f), data, 0o644); err != nil {
				tb.Fatal(err)
			}
		}
	}
	res := &lockstepResults{rounds: map[string]map[string][]lockstepRound{}, load: map[string][2]string{}}
	var sides [2]*lockstepSide
	for _, mode := range o.modes {
		loadBefore := loadAvg()
		procs := map[*lab.Node]*lab.Proc{}
		for _, n := range []*lab.Node{small, big} {
			writeLockstepServices(tb, dirs[n], "fill.yaml", o.small-1, o.endpoints)
			p, err := n.StartProxyd(ctx, "--proxy-mode", mode, "--state-dir", dirs[n],
				"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "")
			if err != nil {
				tb.Fatal(err)
			}
			procs[n] = p
		}
		if sides[0] == nil { // pods once the nodes have their config
			for i, n := range []*lab.Node{small, big} {
				sides[i] = startLockstepSide(tb, n, dirs[n], o.cpus)
			}
		}
		for _, s := range sides {
			waitServicePorts(tb, s.node, mode, o.small)
			// The target answers through its ClusterIP before rounds start.
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				_, err := s.conn.Connect(0)
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					tb.Fatalf("%s mode: %s:80 from %s: %v", mode, lsVIP, s.node.Name, err)
				}
			}
		}
		conns := [2]*lab.Connector{sides[0].conn, sides[1].conn}
		res.add(mode, "floor", lockstepRounds(tb, conns, o.floorRounds, o))
		writeLockstepServices(tb, dirs[big], "fill.yaml", o.big-1, o.endpoints)
		waitServicePorts(tb, big, mode, o.big)
		time.Sleep(2 * time.Second) // what follows the sync
		res.add(mode, "scale", lockstepRounds(tb, conns, o.rounds, o))
		for _, p := range procs {
			if err := p.Stop(); err != nil {
				tb.Fatal(err)
			}
		}
		res.load[mode] = [2]string{loadBefore, loadAvg()}
	}
	return res
}

// lockstepSide is one node's half: a client pod and the server pod behind
// the node's own ClusterIP, and the client's connect process.
type lockstepSide struct {
	node           *lab.Node
	client, server *lab.Pod
	conn           *lab.Connector
}

// startLockstepSide adds the node's two pods, starts the echo server and
// the client's connect process (on cpus), and writes the measured Service
// into the node's state directory.
func startLockstepSide(tb testing.TB, n *lab.Node, dir, cpus string) *lockstepSide {
	tb.Helper()
	ctx := context.Background()
	s := &lockstepSide{node: n}
	var err error
	if s.server, err = n.AddPod(ctx, "lsrv"); err != nil {
		tb.Fatal(err)
	}
	if s.client, err = n.AddPod(ctx, "lcli"); err != nil {
		tb.Fatal(err)
	}
	echo, err := s.server.StartEcho(lab.EchoOptions{TCP: []string{":8080"}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = echo.Stop() })
	if err := os.WriteFile(filepath.Join(dir, "target.yaml"), []byte(lockstepTarget(s.server, n.Name)), 0o644); err != nil {
		tb.Fatal(err)
	}
	if cpus == "any" {
		cpus = ""
	}
	if s.conn, err = s.client.StartConnector(cpus, lsVIP+":80", s.server.IP.String()+":8080"); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.conn.Close() })
	return s
}

func (r *lockstepResults) add(mode, phase string, rounds []lockstepRound) {
	if r.rounds[mode] == nil {
		r.rounds[mode] = map[string][]lockstepRound{}
	}
	r.rounds[mode][phase] = rounds
}

// lockstepTarget is the measured Service: a ClusterIP whose one endpoint
// is the server pod on the client's own node.
func lockstepTarget(server *lab.Pod, node string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: lat, namespace: default}
spec: {clusterIP: %[1]s, clusterIPs: [%[1]s], ports: [{name: p, protocol: TCP, port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
addressType: IPv4
metadata: {name: lat-x, namespace: default, labels: {kubernetes.io/service-name: lat}}
ports: [{name: p, protocol: TCP, port: 8080}]
endpoints: [{addresses: [%[2]s], conditions: {ready: true}, nodeName: %[3]s}]
`, lsVIP, server.IP, node)
}

// writeLockstepServices writes n ClusterIP Services × endpoints (addresses
// nothing answers on, never connected to) into dir/file, atomically. The
// endpoints are on node3, outside the lab, as a real cluster's are mostly on
// other nodes: iptables mode writes a hairpin masquerade rule per local
// endpoint address into nat POSTROUTING, which every first packet of the
// node meets, and 100,000 of them made node2's connects, pod IP too, 5.6×
// slower (21:22 UTC).
func writeLockstepServices(tb testing.TB, dir, file string, n, endpoints int) {
	tb.Helper()
	var y strings.Builder
	for i := range n {
		vip := fmt.Sprintf("10.%d.%d.%d", 96+i/65000, i/250%260, i%250+1)
		fmt.Fprintf(&y, "---\napiVersion: v1\nkind: Service\nmetadata: {name: s%05d, namespace: default}\nspec: {clusterIP: %s, clusterIPs: [%s], ports: [{name: p, protocol: TCP, port: 80, targetPort: 8080}]}\n", i, vip, vip)
		fmt.Fprintf(&y, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata: {name: s%05d-x, namespace: default, labels: {kubernetes.io/service-name: s%05d}}\nports: [{name: p, protocol: TCP, port: 8080}]\nendpoints:\n", i, i)
		for j := range endpoints {
			fmt.Fprintf(&y, "- {addresses: [10.%d.%d.%d], conditions: {ready: true}, nodeName: node3}\n", 245+j, i/250, i%250+1)
		}
	}
	tmp := filepath.Join(dir, "."+file+".tmp")
	if err := os.WriteFile(tmp, []byte(y.String()), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, file)); err != nil {
		tb.Fatal(err)
	}
}

// waitServicePorts waits until the node's proxyd has synced at least want
// Service ports (its metrics on the node's loopback).
func waitServicePorts(tb testing.TB, n *lab.Node, mode string, want int) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		code, body, err := svcHTTPGet(n.NSPath(), "127.0.0.1:10249/metrics")
		if err == nil && code == 200 {
			if v, ok := metricstest.Value(metricstest.Parse(tb, body), "podnet_proxy_service_ports"); ok && v >= float64(want) {
				return
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s mode: proxyd on %s did not sync %d Service ports within 5 minutes", mode, n.Name, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// lockstepRounds runs rounds of o.warmup + o.connects steps; a step is one
// connect of each variant, the order of sides flipping every step and of
// targets every second step.
func lockstepRounds(tb testing.TB, conns [2]*lab.Connector, rounds int, o lockstepOptions) []lockstepRound {
	tb.Helper()
	var out []lockstepRound
	for range rounds {
		var d [lsVariants][]time.Duration
		for step := range o.warmup + o.connects {
			for t := range 2 {
				target := t ^ (step / 2 % 2) // 0 ClusterIP, 1 pod IP
				for s := range 2 {
					side := s ^ (step % 2) // 0 small, 1 big
					took, err := conns[side].Connect(target)
					if err != nil {
						tb.Fatal(err)
					}
					if step >= o.warmup {
						v := target*2 + side
						d[v] = append(d[v], took)
					}
				}
			}
		}
		var r lockstepRound
		for v := range lsVariants {
			slices.Sort(d[v])
			r.p50[v], r.p99[v] = d[v][len(d[v])/2], d[v][len(d[v])*99/100]
		}
		out = append(out, r)
	}
	return out
}

// doubleRatio is the median over rounds of (big ClusterIP / big pod IP) /
// (small ClusterIP / small pod IP), with its range.
func doubleRatio(rounds []lockstepRound, p99 bool) string {
	var rs []float64
	for _, rd := range rounds {
		q := rd.p50
		if p99 {
			q = rd.p99
		}
		rs = append(rs, float64(q[lsBigVIP])/float64(q[lsBigPod])/(float64(q[lsSmallVIP])/float64(q[lsSmallPod])))
	}
	return medianRange(rs)
}

// medianRange formats ratios as "median× (min–max)".
func medianRange(rs []float64) string {
	return fmt.Sprintf("%.3f× (%.2f–%.2f)", benchMedian(rs), slices.Min(rs), slices.Max(rs))
}

// loadAvg is the 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func (r *lockstepResults) print(o lockstepOptions) {
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
	fmt.Printf("| mode | phase | node: Services | to | connect p50 | connect p99 | p50 of each round (µs) |\n|---|---|---|---|---|---|---|\n")
	names := [lsVariants]string{"ClusterIP", "ClusterIP", "pod IP directly", "pod IP directly"}
	for _, mode := range o.modes {
		for _, phase := range []string{"floor", "scale"} {
			rounds := r.rounds[mode][phase]
			for v := range lsVariants {
				services := o.small
				if v%2 == 1 && phase == "scale" {
					services = o.big
				}
				var p50, p99 []float64
				var each []string
				for _, rd := range rounds {
					p50, p99 = append(p50, us(rd.p50[v])), append(p99, us(rd.p99[v]))
					each = append(each, fmt.Sprintf("%.0f", us(rd.p50[v])))
				}
				fmt.Printf("| %s | %s | node%d: %d | %s | %.1f µs | %.1f µs | %s |\n", mode, phase, v%2+1, services, names[v],
					benchMedian(p50), benchMedian(p99), strings.Join(each, " "))
			}
		}
	}
	ratio := func(rounds []lockstepRound, num, den int, p99 bool) string {
		var rs []float64
		for _, rd := range rounds {
			a, c := rd.p50, rd.p50
			if p99 {
				a, c = rd.p99, rd.p99
			}
			rs = append(rs, float64(a[num])/float64(c[den]))
		}
		return medianRange(rs)
	}
	fmt.Printf("\n| mode | phase (node1 / node2 Services) | ratio | p50, median of the rounds' (range) | p99, same | target |\n|---|---|---|---|---|---|\n")
	for _, mode := range o.modes {
		for _, phase := range []string{"floor", "scale"} {
			rounds := r.rounds[mode][phase]
			sizes := fmt.Sprintf("%s, %d rounds (%d / %d)", phase, len(rounds), o.small, o.small)
			target := func(t string) string {
				if phase == "floor" {
					return "—"
				}
				return t
			}
			if phase == "scale" {
				sizes = fmt.Sprintf("%s, %d rounds (%d / %d)", phase, len(rounds), o.small, o.big)
			}
			for _, q := range []struct {
				what, target string
				num, den     int
			}{
				{"ClusterIP node2 / ClusterIP node1", target("≤ 1.05×"), lsBigVIP, lsSmallVIP},
				{"pod IP node2 / pod IP node1", "—", lsBigPod, lsSmallPod},
				{"ClusterIP / pod IP, node1", target("≤ 1.1×"), lsSmallVIP, lsSmallPod},
				{"ClusterIP / pod IP, node2", target("≤ 1.1×"), lsBigVIP, lsBigPod},
			} {
				fmt.Printf("| %s | %s | %s | %s | %s | %s |\n", mode, sizes, q.what, ratio(rounds, q.num, q.den, false), ratio(rounds, q.num, q.den, true), q.target)
			}
			// What node2's Services add to the ClusterIP beyond what they
			// add to the pod address: the two nodes' own difference
			// cancels.
			fmt.Printf("| %s | %s | (ClusterIP / pod IP, node2) / (same, node1) | %s | %s | — |\n", mode, sizes, doubleRatio(rounds, false), doubleRatio(rounds, true))
		}
		fmt.Printf("\nload average %s: before %s, after %s\n\n", mode, r.load[mode][0], r.load[mode][1])
	}
}

// TestClusterIPConnectLockstepSetup runs BenchmarkClusterIPConnectLockstep's
// setup and rounds at a tiny size (3 against 30 Services, 20 connects), in
// ebpf and nftables mode, so the benchmark keeps working between benchmark
// runs.
func TestClusterIPConnectLockstepSetup(t *testing.T) {
	roottest.Require(t)
	modes := []string{"ebpf", "nftables"}
	o := lockstepOptions{modes: modes, small: 3, big: 30, endpoints: 2, rounds: 2, floorRounds: 1, connects: 20, warmup: 2}
	res := lockstepLatency(t, o)
	for _, mode := range modes {
		for _, phase := range []string{"floor", "scale"} {
			rounds := res.rounds[mode][phase]
			if want := map[string]int{"floor": 1, "scale": 2}[phase]; len(rounds) != want {
				t.Fatalf("%s, %s: %d rounds, want %d", mode, phase, len(rounds), want)
			}
			for _, r := range rounds {
				for v := range lsVariants {
					if r.p50[v] <= 0 || r.p99[v] < r.p50[v] || r.p99[v] > 2*time.Second {
						t.Errorf("%s, %s, variant %d: p50 %v, p99 %v: want 0 < p50 <= p99 < 2s", mode, phase, v, r.p50[v], r.p99[v])
					}
				}
			}
		}
	}
}
