package e2e

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/podnet/podnet/dataplane/metricstest"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/apiserver"
	"github.com/podnet/podnet/e2e/lab"
)

// BenchmarkProxySyncAgainstKubeProxy times kube-proxy (PODNET_KUBE_PROXY,
// in nftables mode) and proxyd in each of its modes side by side, all
// reading the same 10,000 ClusterIP Services × 10 endpoints from one real
// kube-apiserver (seeded into its etcd, apiserver.SeedServices: through
// the API, kube-apiserver v1.36.3 takes minutes of CPU for 10,000): the first full sync after the process starts, and one
// endpoint added to one Service through the API. Each program runs on a
// lab node of its own (a fresh network namespace), one after the other.
// Times are taken from the kernel, the same way for every program that
// writes nftables (kube-proxy, proxyd's nftables and iptables-nft modes):
// the namespace's nftables generation is asked every millisecond (every
// 20 ms during the first sync); the first sync is done at the first
// generation whose table holds a chain for every Service, an endpoint
// change at the first generation after the API server took the update.
// iptables-legacy: the nat table's entry count (IPT_SO_GET_INFO); ebpf:
// the pinned Service maps' frontends for the first sync, and for a change
// proxyd's own sync counter (its maps have no generation). Beside the
// kernel's times, each program's own figure (its
// kubeproxy_sync_proxy_rules_duration_seconds). kube-proxy's nftables mode
// execs nft: PODNET_NFT_ROOT names a root holding usr/sbin/nft and its
// libraries (make nft). It runs only with PODNET_BENCH=1, as
// scripts/bench-services.sh sets it.
//
//	PODNET_BENCH_KP_MODES="kube-proxy nftables iptables-nft iptables-legacy ebpf"
//	PODNET_BENCH_KP_SERVICES=10000  Services (10 endpoints each)
//	PODNET_BENCH_KP_CHANGES=5       endpoint changes per program (medians)
func BenchmarkProxySyncAgainstKubeProxy(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1, as scripts/bench-services.sh does")
	}
	roottest.Require(b)
	o := kpBenchOptions{
		modes:     strings.Fields(cmp.Or(os.Getenv("PODNET_BENCH_KP_MODES"), "kube-proxy nftables iptables-nft iptables-legacy ebpf")),
		services:  envPositive("PODNET_BENCH_KP_SERVICES", 10000),
		endpoints: 10,
		changes:   envPositive("PODNET_BENCH_KP_CHANGES", 5),
		kubeProxy: os.Getenv("PODNET_KUBE_PROXY"),
		nftRoot:   os.Getenv("PODNET_NFT_ROOT"),
	}
	if slices.Contains(o.modes, "kube-proxy") && (o.kubeProxy == "" || o.nftRoot == "") {
		b.Fatal("$PODNET_KUBE_PROXY and $PODNET_NFT_ROOT name kube-proxy and a root with nft: make bench sets them")
	}
	cp, srv := kubeAPI(b)
	var nodes []lab.NodeSpec
	for i := range o.modes {
		nodes = append(nodes, lab.NodeSpec{Name: fmt.Sprintf("node%d", i+1), IP: netip.MustParsePrefix(fmt.Sprintf("192.168.10.%d/24", 11+i))})
	}
	lab.ProxydReadyTimeout = 5 * time.Minute // reading 20,000 objects
	l := lab.Start(b, lab.Options{Nodes: nodes})
	detach, err := l.Attach(cp, kubeAPIAddr)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := detach(); err != nil {
			b.Errorf("detach control plane: %v", err)
		}
	}()
	admin, err := srv.Client(apiserver.Admin)
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	for _, n := range l.Nodes {
		registerNode(b, admin, n)
	}
	start := time.Now()
	if err := srv.SeedServices(ctx, admin, kpBenchNS, o.services, o.endpoints); err != nil {
		b.Fatal(err)
	}
	b.Logf("seeded %d Services and EndpointSlices in %v", o.services, time.Since(start).Round(time.Second))
	var rows []kpResult
	for i, mode := range o.modes {
		n := l.Node(nodes[i].Name)
		kc := filepath.Join(n.Dir, "kubeconfig")
		if err := srv.WriteKubeconfig(kc, apiserver.Admin, kubeAPIAddr.Addr()); err != nil {
			b.Fatal(err)
		}
		rows = append(rows, runKPBench(b, admin, n, kc, mode, o, i))
	}
	printKPResults(o, rows)
}

const kpBenchNS = "kpbench"

type kpBenchOptions struct {
	modes                        []string
	services, endpoints, changes int
	kubeProxy, nftRoot           string
}

type kpResult struct {
	mode, load   string
	first        time.Duration
	firstSelf    float64   // seconds, the sum of its syncs by then
	firstSyncs   float64   // how many
	rssMiB       int       // resident memory once the first sync is in the kernel
	change, self []float64 // seconds, each change
}

func envPositive(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// registerNode creates n's Node as a kubelet would register it: its
// InternalIP, Ready.
func registerNode(b *testing.B, admin kubernetes.Interface, n *lab.Node) {
	ctx := b.Context()
	node, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{"kubernetes.io/hostname": n.Name}},
		Spec: corev1.NodeSpec{PodCIDR: n.PodCIDR.String(), PodCIDRs: []string{n.PodCIDR.String()}}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IP.String()}, {Type: corev1.NodeHostName, Address: n.Name}}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastTransitionTime: metav1.Now()}}
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
}

// kpStart starts mode's program on n, reading the API server through
// kubeconfig, with no periodic resync during the run (an hour) and the
// same minimum of 1 s between syncs.
func kpStart(b *testing.B, n *lab.Node, kubeconfig, mode string, o kpBenchOptions) *lab.Proc {
	if mode == "kube-proxy" {
		cfg := filepath.Join(n.Dir, "kube-proxy.yaml")
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %s}
hostnameOverride: %s
mode: nftables
clusterCIDR: 10.244.0.0/16
detectLocalMode: ClusterCIDR
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
oomScoreAdj: 0
nftables: {syncPeriod: 1h, minSyncPeriod: 1s}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
`, kubeconfig, n.Name)), 0o644); err != nil {
			b.Fatal(err)
		}
		p, err := n.Start("kube-proxy", "env", "PATH="+filepath.Join(o.nftRoot, "usr/sbin")+":"+os.Getenv("PATH"),
			"LD_LIBRARY_PATH="+filepath.Join(o.nftRoot, "usr/lib/x86_64-linux-gnu"), o.kubeProxy, "--config="+cfg, "--v=1")
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	proxyMode := mode
	if strings.HasPrefix(mode, "iptables-") {
		proxyMode = "iptables"
		// proxyd picks the backend holding more rules, as kube-proxy's
		// iptables-wrapper: one rule in the wanted one.
		ipt := strings.TrimPrefix(mode, "iptables-")
		if out, err := n.Exec(b.Context(), "sh", "-c", fmt.Sprintf("iptables-%[1]s -w -t mangle -N BENCH-BACKEND && iptables-%[1]s -w -t mangle -A BENCH-BACKEND -j RETURN", ipt)); err != nil {
			b.Fatalf("%v\n%s", err, out)
		}
	}
	p, err := n.StartProxyd(b.Context(), "--state-dir=", "--kubeconfig", kubeconfig, "--proxy-mode", proxyMode,
		"--network-policy=false", "--sync-period", "1h", "--min-sync-period", "1s",
		"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "")
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// kpHolds says whether the kernel holds mode's rules for all services:
// a chain a Service (kube-proxy's and proxyd's nftables tables), a rule
// or an entry an endpoint (iptables' nat table, nft or legacy), a frontend
// a Service (ebpf's maps).
func kpHolds(k *kernelProbe, n *lab.Node, mode string, services int) (bool, error) {
	var got int
	var err error
	switch mode {
	case "kube-proxy":
		got, err = k.NFTChains(nftables.TableFamilyIPv4, "kube-proxy")
	case "nftables":
		got, err = k.NFTChains(nftables.TableFamilyINet, "podnet")
	case "iptables-nft": // a rule an endpoint, in chains by destination prefix
		got, err = k.NFTRules(nftables.TableFamilyIPv4, "nat")
		got /= 10
	case "iptables-legacy":
		got, err = k.LegacyNATEntries()
		got /= 10
	case "ebpf":
		got, err = ebpfFrontends(n.BPFPinDir())
		if errors.Is(err, fs.ErrNotExist) { // not pinned yet
			return false, nil
		}
	}
	return got >= services, err
}

// runKPBench runs one program: its first sync, then o.changes endpoint
// changes, each after the kernel was quiet for 2 s (past both programs'
// minimum sync period).
func runKPBench(b *testing.B, admin kubernetes.Interface, n *lab.Node, kubeconfig, mode string, o kpBenchOptions, round int) kpResult {
	k, err := newKernelProbe(n.NSPath())
	if err != nil {
		b.Fatal(err)
	}
	defer k.Close()
	res := kpResult{mode: mode, load: loadAvg()}
	gen0, err := k.Generation()
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	p := kpStart(b, n, kubeconfig, mode, o)
	defer func() {
		if err := p.Stop(); err != nil {
			b.Errorf("%s: stop: %v", mode, err)
		}
	}()
	seen := gen0
	for deadline := start.Add(10 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("%s: the kernel did not hold %d Services within 10 minutes\n%s", mode, o.services, p.Output())
		}
		at := time.Since(start)
		if nftMode(mode) {
			g, err := k.Generation()
			if err != nil {
				b.Fatal(err)
			}
			if g == seen {
				continue
			}
			seen = g
		}
		ok, err := kpHolds(k, n, mode, o.services)
		if err != nil {
			b.Fatalf("%s: %v", mode, err)
		}
		if ok {
			res.first = at
			b.Logf("%s on %s: the kernel holds %d Services after %v", mode, n.Name, o.services, at.Round(time.Millisecond))
			break
		}
	}
	waitSelfSync(b, n, 1)
	m := selfMetrics(b, n)
	res.firstSelf, res.firstSyncs = m[selfSyncMetric+"_sum"], m[selfSyncMetric+"_count"]
	res.rssMiB = procRSS(strconv.Itoa(p.Pid())) >> 10 // env execs kube-proxy: the same pid
	for c := range o.changes {
		kpQuiet(b, k, mode, 2*time.Second)
		before := selfSyncCount(b, n)
		sum0 := selfSyncSum(b, n)
		ip := fmt.Sprintf("10.250.%d.%d", round, c+1)
		d := kpChange(b, admin, k, n, mode, apiserver.ServiceName(o.services/(o.changes+1)*(c+1)), ip, before)
		res.change = append(res.change, d.Seconds())
		b.Logf("%s: endpoint %s added to %s: in the kernel after %v", mode, ip, apiserver.ServiceName(o.services/(o.changes+1)*(c+1)), d)
		// the program's own figure: its sync counter moved past before
		waitSelfSync(b, n, before+1)
		res.self = append(res.self, selfSyncSum(b, n)-sum0)
	}
	return res
}

func nftMode(mode string) bool {
	return mode == "kube-proxy" || mode == "nftables" || mode == "iptables-nft"
}

// kpQuiet waits until neither the nftables generation nor the legacy nat
// table changed for quiet.
func kpQuiet(b *testing.B, k *kernelProbe, mode string, quiet time.Duration) {
	last, since := "", time.Now()
	for deadline := time.Now().Add(5 * time.Minute); time.Since(since) < quiet; time.Sleep(50 * time.Millisecond) {
		g, err := k.Generation()
		if err != nil {
			b.Fatal(err)
		}
		e, err := k.LegacyNATEntries()
		if err != nil {
			b.Fatal(err)
		}
		if s := fmt.Sprint(g, e); s != last {
			last, since = s, time.Now()
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: the kernel's rules kept changing for 5 minutes (last generation and legacy nat entries %s)", mode, last)
		}
	}
}

// kpChange adds endpoint ip to Service svc's EndpointSlice through the API
// and returns how long after the request was sent the kernel had it:
// the next nftables generation, the next change of the legacy nat table's
// entries, or (ebpf) proxyd's sync counter passing syncsBefore.
func kpChange(b *testing.B, admin kubernetes.Interface, k *kernelProbe, n *lab.Node, mode, svc, ip string, syncsBefore float64) time.Duration {
	ctx := b.Context()
	es, err := admin.DiscoveryV1().EndpointSlices(kpBenchNS).Get(ctx, svc+"-abcde", metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(false)}, NodeName: new("node-x")})
	gen0, err := k.Generation()
	if err != nil {
		b.Fatal(err)
	}
	entries0, err := k.LegacyNATEntries()
	if err != nil {
		b.Fatal(err)
	}
	// From before the request: the watch event can reach the program
	// before the API server's answer reaches the benchmark.
	start := time.Now()
	if _, err := admin.DiscoveryV1().EndpointSlices(kpBenchNS).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
	interval := time.Millisecond
	if mode == "ebpf" {
		interval = 5 * time.Millisecond // a scrape of proxyd's metrics each time
	}
	for deadline := start.Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(interval) {
		switch {
		case nftMode(mode):
			if g, err := k.Generation(); err != nil || g != gen0 {
				return time.Since(start)
			}
		case mode == "iptables-legacy":
			if e, err := k.LegacyNATEntries(); err != nil || e != entries0 {
				return time.Since(start)
			}
		default:
			if selfSyncCount(b, n) > syncsBefore {
				return time.Since(start)
			}
		}
	}
	b.Fatalf("%s: endpoint %s of %s not applied within 2 minutes", mode, ip, svc)
	return 0
}

// The program's own sync figures from its metrics on 127.0.0.1:10249
// (kube-proxy's and proxyd's share the name).
const selfSyncMetric = "kubeproxy_sync_proxy_rules_duration_seconds"

// selfMetrics returns the count and sum of the program's IPv4 sync
// histogram (kube-proxy labels its families; proxyd here runs IPv4 only).
func selfMetrics(b *testing.B, n *lab.Node) map[string]float64 {
	code, body, err := svcHTTPGet(n.NSPath(), "127.0.0.1:10249/metrics")
	if err != nil || code != 200 {
		return nil
	}
	out := map[string]float64{}
	f, ok := metricstest.Parse(b, body)[selfSyncMetric]
	if !ok {
		return out
	}
	for _, m := range f.Metric {
		if h := m.GetHistogram(); h != nil && !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
			return l.GetName() == "ip_family" && l.GetValue() != "IPv4"
		}) {
			out[selfSyncMetric+"_count"] += float64(h.GetSampleCount())
			out[selfSyncMetric+"_sum"] += h.GetSampleSum()
		}
	}
	return out
}

func selfSyncCount(b *testing.B, n *lab.Node) float64 {
	return selfMetrics(b, n)[selfSyncMetric+"_count"]
}
func selfSyncSum(b *testing.B, n *lab.Node) float64 { return selfMetrics(b, n)[selfSyncMetric+"_sum"] }

func waitSelfSync(b *testing.B, n *lab.Node, count float64) {
	for deadline := time.Now().Add(2 * time.Minute); selfSyncCount(b, n) < count; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			code, body, err := svcHTTPGet(n.NSPath(), "127.0.0.1:10249/metrics")
			var sync []string
			for l := range strings.Lines(body) {
				if strings.Contains(l, "sync") {
					sync = append(sync, l)
				}
			}
			b.Fatalf("%s: %s_count did not reach %v (%d, %v):\n%s", n.Name, selfSyncMetric, count, code, err, strings.Join(sync, ""))
		}
	}
}

func printKPResults(o kpBenchOptions, rows []kpResult) {
	fmt.Printf("| program, %d Services × %d endpoints | first full sync, in the kernel | its own first-sync figure | one endpoint added, in the kernel (median) | its own figure (median) | changes (ms, kernel) | RSS after the first sync | load before |\n|---|---|---|---|---|---|---|---|\n", o.services, o.endpoints)
	for _, r := range rows {
		name := "proxyd " + r.mode
		if r.mode == "kube-proxy" {
			name = "kube-proxy v1.36.3 nftables"
		}
		var each []string
		for _, c := range r.change {
			each = append(each, fmt.Sprintf("%.1f", c*1000))
		}
		fmt.Printf("| %s | %.2f s | %.2f s (%.0f syncs) | %.1f ms | %.1f ms | %s | %d MiB | %s |\n", name, r.first.Seconds(), r.firstSelf, r.firstSyncs,
			benchMedian(r.change)*1000, benchMedian(r.self)*1000, strings.Join(each, " "), r.rssMiB, r.load)
	}
}
