package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/kube"
	"github.com/podnet/podnet/e2e/apiserver"
)

// kubeRSSChildEnv makes the test binary, re-executed by
// BenchmarkKubeSourceRSS, read the cluster through the kube source (or, with
// mode "full", through plain informers that keep whole objects) and report
// its memory: a process of its own, so nothing of the benchmark's own
// clients is counted.
const kubeRSSChildEnv = "PODNET_KUBE_RSS_CHILD"

// BenchmarkKubeSourceRSS measures the resident memory of the Kubernetes API
// source holding 10,000 Services × 10 endpoints, next to informers that keep
// the whole objects.
func BenchmarkKubeSourceRSS(b *testing.B) {
	cp, srv := kubeAPI(b)
	const services, endpoints = 10000, 10
	admin, err := srv.Client(apiserver.Admin)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := srv.SeedServices(b.Context(), admin, "rss", services, endpoints); err != nil {
		b.Fatal(err)
	}
	b.Logf("seeded %d Services and EndpointSlices in %v", services, time.Since(start).Round(time.Second))
	kubeconfig := filepath.Join(cp.Dir, "rss.kubeconfig")
	if err := srv.WriteKubeconfig(kubeconfig, apiserver.Admin, netipLoopback); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		for _, mode := range []string{"compact", "full"} {
			p, err := cp.Host.Start("rss-"+mode, "env", kubeRSSChildEnv+"="+mode+":"+kubeconfig, os.Args[0])
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
			err = p.Wait(ctx)
			cancel()
			out := strings.TrimSpace(p.Output())
			if err != nil {
				b.Fatalf("%s: %v\n%s", mode, err, out)
			}
			var base, rss, heap, svcs, slices int
			if _, err := fmt.Sscanf(lastLine(out), "base %d rss %d heap %d services %d slices %d", &base, &rss, &heap, &svcs, &slices); err != nil {
				b.Fatalf("%s: parse %q: %v", mode, out, err)
			}
			if svcs < services || slices < services {
				b.Fatalf("%s: saw %d Services and %d EndpointSlices, want %d", mode, svcs, slices, services)
			}
			b.Logf("%s: RSS %d MiB (%d MiB before the first list), Go heap %d MiB", mode, rss>>10, base>>10, heap>>20)
			b.ReportMetric(float64(rss)/1024, mode+"-RSS-MiB")
			b.ReportMetric(float64(heap)/(1<<20), mode+"-heap-MiB")
		}
	}
}

var netipLoopback = netip.MustParseAddr("127.0.0.1")

func lastLine(s string) string {
	lines := strings.Split(s, "\n")
	return lines[len(lines)-1]
}

// kubeRSSChild is the measured process: "base <KiB> rss <KiB> heap <bytes>
// services <n> slices <n>" after the caches are synced and the garbage is
// returned to the OS.
func kubeRSSChild(arg string) int {
	mode, kubeconfig, _ := strings.Cut(arg, ":")
	cfg, err := kube.ClientConfig(kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.QPS = -1
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	debug.FreeOSMemory()
	base := vmRSS()
	var svcs, slices int
	switch mode {
	case "compact":
		store := cluster.NewStore()
		go func() { _ = kube.New(kube.Options{Client: client, Store: store}).Run(ctx) }()
		select {
		case <-store.Synced():
		case <-ctx.Done():
			fmt.Fprintln(os.Stderr, "not synced")
			return 1
		}
		for _, s := range store.Services() {
			svcs++
			slices += len(store.EndpointSlicesFor(s.Key()))
		}
	case "full":
		f := informers.NewSharedInformerFactory(client, 0)
		si := f.Core().V1().Services().Informer()
		ei := f.Discovery().V1().EndpointSlices().Informer()
		f.Core().V1().Nodes().Informer()
		f.Core().V1().Namespaces().Informer()
		f.Start(ctx.Done())
		for _, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				fmt.Fprintln(os.Stderr, "not synced")
				return 1
			}
		}
		svcs, slices = len(si.GetStore().List()), len(ei.GetStore().List())
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", mode)
		return 1
	}
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("base %d rss %d heap %d services %d slices %d\n", base, vmRSS(), ms.HeapInuse, svcs, slices)
	return 0
}

// vmRSS is this process's resident set in KiB.
func vmRSS() int { return procRSS("self") }

// procRSS is the resident set in KiB of process pid ("self" for this
// one), -1 when unknown.
func procRSS(pid string) int {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return -1
}
