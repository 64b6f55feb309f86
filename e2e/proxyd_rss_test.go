package e2e

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/metricstest"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
)

// BenchmarkProxydRSS measures the resident memory of a real proxyd holding
// 10,000 ClusterIP Services × 10 endpoints from the state directory, in
// each proxy mode side by side, single-stack and dual-stack (issue 22: a
// second cluster IP and 10 more endpoints per Service, IPv6, the addresses
// of proxytest.DualStackState), on node1 of a lab: 2 s after the
// first full sync, and again after five more full syncs (run every
// 5 s here, 30 s by default), where the garbage of the periodic syncs has
// had time to build up. It runs only with PODNET_BENCH=1, as
// scripts/bench-services.sh sets it.
//
//	PODNET_BENCH_MODES="ebpf nftables iptables"  the modes, in this order
//	PODNET_BENCH_STACKS="single dual"   Services single-stack (IPv4) or
//	                                    dual-stack (proxyd given both
//	                                    families' cluster CIDRs)
//	PODNET_BENCH_RSS_BINS="DIR..."      proxyd binaries to compare (the
//	                                    directories holding them), alternating
//	                                    within each round; default the lab's
//	PODNET_BENCH_ROUNDS=1               rounds; medians are printed
func BenchmarkProxydRSS(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1, as scripts/bench-services.sh does")
	}
	roottest.Require(b)
	const services, endpoints, laterSyncs = 10000, 10, 5
	// ebpf first: it leaves nothing in iptables, while the 100,000 rules
	// iptables mode leaves make every iptables-save of the next proxyd's
	// node agent (and ebpf mode's removal of them) take seconds.
	modes := strings.Fields(cmp.Or(os.Getenv("PODNET_BENCH_MODES"), "ebpf nftables iptables"))
	stacks := strings.Fields(cmp.Or(os.Getenv("PODNET_BENCH_STACKS"), "single dual"))
	rounds, _ := strconv.Atoi(os.Getenv("PODNET_BENCH_ROUNDS"))
	rounds = max(rounds, 1)
	lab.ProxydReadyTimeout = 2 * time.Minute // reading 20,000 objects
	l := lab.Start(b, lab.Options{Families: []ipfamily.Family{ipfamily.IPv4, ipfamily.IPv6}})
	bins := strings.Fields(cmp.Or(os.Getenv("PODNET_BENCH_RSS_BINS"), l.BinDir))
	defer func(dir string) { l.BinDir = dir }(l.BinDir)
	var cidrs []string
	for _, p := range l.ClusterCIDRs() {
		cidrs = append(cidrs, p.String())
	}
	clusterCIDR := map[string]string{"single": cidrs[0], "dual": strings.Join(cidrs, ",")}
	serviceCIDR := map[string]string{"single": "10.96.0.0/12", "dual": "10.96.0.0/12,fd00:10:96::/112"}
	n := l.Node("node1")
	// metric waits until the sample name reaches at least want, asking
	// every interval. Each scrape leaves proxyd ~0.1 MB of garbage: asked
	// ten times a second over the 25 s of the later syncs, the benchmark's
	// own scrapes were most of what proxyd allocated then, so that phase
	// asks once a second (Prometheus scrapes every 15–60 s).
	metric := func(mode, name string, want float64, interval time.Duration) {
		deadline := time.Now().Add(5 * time.Minute)
		for {
			code, body, err := svcHTTPGet(n.NSPath(), "127.0.0.1:10249/metrics")
			if err == nil && code == 200 {
				if v, ok := metricstest.Value(metricstest.Parse(b, body), name); ok && v >= want {
					return
				}
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s mode: %s did not reach %v within 5 minutes", mode, name, want)
			}
			time.Sleep(interval)
		}
	}
	type variant struct{ stack, mode, bin string }
	type reading struct{ first, later, took []float64 }
	got := map[variant]*reading{}
	for _, stack := range stacks {
		if err := l.WriteState("rss-services.yaml", rssServicesYAML(services, endpoints, stack == "dual")); err != nil {
			b.Fatal(err)
		}
		for r := 0; r < rounds; r++ {
			for _, mode := range modes {
				order := slices.Clone(bins)
				if r%2 == 1 {
					slices.Reverse(order)
				}
				for _, bin := range order {
					l.BinDir = bin
					start := time.Now()
					p, err := n.StartProxyd(b.Context(), "--proxy-mode", mode, "--sync-period", "5s", "--cluster-cidr", clusterCIDR[stack], "--service-cluster-ip-range", serviceCIDR[stack],
						"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "")
					if err != nil {
						b.Fatal(err)
					}
					metric(mode, "podnet_proxy_service_ports", services, 100*time.Millisecond)
					took := time.Since(start)
					// What follows the sync (conntrack, returning the start-up
					// garbage) is done.
					time.Sleep(2 * time.Second)
					pid := strconv.Itoa(p.Pid())
					first := procRSS(pid)
					metric(mode, "kubeproxy_sync_full_proxy_rules_duration_seconds", 1+laterSyncs, time.Second)
					later := procRSS(pid)
					if err := p.Stop(); err != nil {
						b.Fatal(err)
					}
					v := variant{stack, mode, bin}
					if got[v] == nil {
						got[v] = &reading{}
					}
					got[v].first = append(got[v].first, float64(first>>10))
					got[v].later = append(got[v].later, float64(later>>10))
					got[v].took = append(got[v].took, took.Seconds())
				}
			}
		}
	}
	fmt.Printf("| mode | stack | proxyd | Services × endpoints per family | RSS after the first full sync | after %d more full syncs | first sync after start | rounds (MiB, first / later) |\n|---|---|---|---|---|---|---|---|\n", laterSyncs)
	for _, stack := range stacks {
		for _, mode := range modes {
			for _, bin := range bins {
				g := got[variant{stack, mode, bin}]
				fmt.Printf("| %s | %s | %s | %d × %d | %.0f MiB | %.0f MiB | %.1f s | %s / %s |\n", mode, stack, filepath.Base(filepath.Dir(bin))+"/"+filepath.Base(bin),
					services, endpoints, benchMedian(g.first), benchMedian(g.later), benchMedian(g.took), rssEach(g.first), rssEach(g.later))
			}
		}
	}
}

func rssEach(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, fmt.Sprintf("%.0f", x))
	}
	return strings.Join(s, " ")
}

// rssServicesYAML is proxytest.DualStackState's Services in the state
// directory's YAML: services ClusterIP Services of endpoints IPv4
// endpoints on node2, and with dual an IPv6 cluster IP (RequireDualStack)
// and an IPv6 EndpointSlice of endpoints more, the same addresses.
func rssServicesYAML(services, endpoints int, dual bool) string {
	var y strings.Builder
	for i := range services {
		vip := fmt.Sprintf("10.%d.%d.%d", 96+i/65000, i/250%260, i%250+1)
		if dual {
			vip6 := fmt.Sprintf("fd00:10:96::%x", i+1)
			fmt.Fprintf(&y, "---\napiVersion: v1\nkind: Service\nmetadata: {name: s%05d, namespace: default}\nspec: {clusterIP: %s, clusterIPs: [%s, %s], ipFamilies: [IPv4, IPv6], ipFamilyPolicy: RequireDualStack, ports: [{name: p, protocol: TCP, port: 80, targetPort: 8080}]}\n", i, vip, vip, vip6)
		} else {
			fmt.Fprintf(&y, "---\napiVersion: v1\nkind: Service\nmetadata: {name: s%05d, namespace: default}\nspec: {clusterIP: %s, clusterIPs: [%s], ports: [{name: p, protocol: TCP, port: 80, targetPort: 8080}]}\n", i, vip, vip)
		}
		fmt.Fprintf(&y, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata: {name: s%05d-x, namespace: default, labels: {kubernetes.io/service-name: s%05d}}\nports: [{name: p, protocol: TCP, port: 8080}]\nendpoints:\n", i, i)
		for j := range endpoints {
			fmt.Fprintf(&y, "- {addresses: [10.%d.%d.%d], conditions: {ready: true}, nodeName: node2}\n", 245+j, i/250, i%250+1)
		}
		if !dual {
			continue
		}
		fmt.Fprintf(&y, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv6\nmetadata: {name: s%05d-v6, namespace: default, labels: {kubernetes.io/service-name: s%05d}}\nports: [{name: p, protocol: TCP, port: 8080}]\nendpoints:\n", i, i)
		for j := range endpoints {
			fmt.Fprintf(&y, "- {addresses: [\"fd00:10:%x:%x::%x\"], conditions: {ready: true}, nodeName: node2}\n", 0x245+j, i/250, i%250+1)
		}
	}
	return y.String()
}
