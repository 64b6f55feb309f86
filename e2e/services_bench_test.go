package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
)

// BenchmarkServiceThroughput measures iperf3 TCP throughput from a pod on
// node1 to a pod on node2 through a ClusterIP and to the pod address
// directly, and from the outside through node1's NodePort, and TCP_RR
// (round trips of one byte over one connection, `podnet-lab rr`) from the
// pod through the ClusterIP and to the pod address, with proxyd in
// iptables and in ebpf mode, in one run, the modes alternating by round.
// It runs only with PODNET_BENCH=1, as scripts/bench-services.sh sets it.
func BenchmarkServiceThroughput(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		b.Skip("set PODNET_BENCH=1, as scripts/bench-services.sh does")
	}
	roottest.Require(b)
	if _, err := exec.LookPath("iperf3"); err != nil {
		b.Skip("iperf3 not installed (scripts/deps.sh installs it)")
	}
	secs, rounds := 5, 3
	if s := os.Getenv("PODNET_BENCH_SECONDS"); s != "" {
		fmt.Sscan(s, &secs)
	}
	if s := os.Getenv("PODNET_BENCH_ROUNDS"); s != "" {
		fmt.Sscan(s, &rounds)
	}
	ctx := context.Background()
	l := lab.Start(b, lab.Options{})
	n1, n2 := l.Node("node1"), l.Node("node2")
	procs := map[string]*lab.Proc{}
	switchTo := func(mode string) {
		for _, n := range []*lab.Node{n1, n2} {
			if p := procs[n.Name]; p != nil {
				_ = p.Stop()
			}
			p, err := n.StartProxyd(ctx, "--proxy-mode", mode)
			if err != nil {
				b.Fatal(err)
			}
			procs[n.Name] = p
		}
		time.Sleep(3 * time.Second) // the first sync follows the state's load
	}
	switchTo("iptables")
	src, err := n1.AddPod(ctx, "tsrc")
	if err != nil {
		b.Fatal(err)
	}
	dst, err := n2.AddPod(ctx, "tdst")
	if err != nil {
		b.Fatal(err)
	}
	if err := l.WriteState("svc-iperf.yaml", fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: iperf, namespace: default}
spec: {type: NodePort, clusterIP: 10.96.5.1, clusterIPs: [10.96.5.1], ports: [{name: t, protocol: TCP, port: 5201, targetPort: 5201, nodePort: 30201}, {name: rr, protocol: TCP, port: 5202, targetPort: 5202}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
addressType: IPv4
metadata: {name: iperf-x, namespace: default, labels: {kubernetes.io/service-name: iperf}}
ports: [{name: t, protocol: TCP, port: 5201}, {name: rr, protocol: TCP, port: 5202}]
endpoints: [{addresses: [%s], conditions: {ready: true}, nodeName: node2}]
`, dst.IP)); err != nil {
		b.Fatal(err)
	}
	echo, err := dst.StartEcho(lab.EchoOptions{TCP: []string{":5202"}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = echo.Stop() }()
	nodePort := netip.AddrPortFrom(n1.IP, 30201)
	type path struct{ mode, what string }
	results := map[path][]float64{}
	rr := map[path][]float64{}
	var order, rrOrder []path
	for r := 0; r < rounds; r++ {
		for _, mode := range []string{"iptables", "ebpf"} {
			switchTo(mode)
			for _, p := range []struct {
				what   string
				client benchExec
				addr   string
			}{
				{"pod IP directly", src.Exec, dst.IP.String()},
				{"ClusterIP", src.Exec, "10.96.5.1"},
				{"NodePort from outside", l.OutsideHost.Exec, nodePort.Addr().String()},
			} {
				var extra []string
				if p.what == "NodePort from outside" {
					// iperf3 -c takes the last -p: the NodePort, DNATed to
					// the server's 5201.
					extra = []string{"-p", "30201"}
				}
				k := path{mode, p.what}
				if r == 0 {
					order = append(order, k)
				}
				results[k] = append(results[k], benchIperf(b, secs, podServer(dst), p.client, p.addr, extra...))
			}
			// TCP_RR, ClusterIP and pod address in turns of 250 ms (which
			// goes first flipping every round).
			targets := []struct{ what, addr string }{{"pod IP directly", dst.IP.String() + ":5202"}, {"ClusterIP", "10.96.5.1:5202"}}
			if r%2 == 1 {
				slices.Reverse(targets)
			}
			rates, err := src.RequestRates(ctx, []string{targets[0].addr, targets[1].addr}, time.Duration(secs)*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			for i, t := range targets {
				k := path{mode, t.what}
				if r == 0 {
					rrOrder = append(rrOrder, k)
				}
				rr[k] = append(rr[k], rates[i])
			}
		}
	}
	fmt.Printf("| mode | path | TCP throughput, median of %d × %d s | rounds |\n|---|---|---|---|\n", rounds, secs)
	for _, k := range order {
		fmt.Printf("| %s | %s | %.2f Gbit/s | %s |\n", k.mode, k.what, benchMedian(results[k])/1e9, benchFmt(results[k]))
	}
	fmt.Printf("\n| mode | path | TCP_RR round trips/s, median of %d × %d s | ÷ pod IP, median of the rounds' ratios | rounds |\n|---|---|---|---|---|\n", rounds, secs)
	for _, k := range rrOrder {
		var each []string
		var ratios []float64
		for i, v := range rr[k] {
			each = append(each, fmt.Sprintf("%.0f", v))
			ratios = append(ratios, v/rr[path{k.mode, "pod IP directly"}][i])
		}
		fmt.Printf("| %s | %s | %.0f | %.3f× | %s |\n", k.mode, k.what, benchMedian(rr[k]), benchMedian(ratios), strings.Join(each, " "))
	}
	for _, p := range procs {
		_ = p.Stop()
	}
}
