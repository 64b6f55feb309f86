package policy

import (
	"context"
	"maps"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
	"github.com/podnet/podnet/dataplane/policy/policybench"
)

// apiPod is pod i of the benchmarks' world.
func apiPod(i int) *v1.Pod { return policybench.Pod(i) }

// BenchmarkPodMemoryPer1000 is what proxyd holds for 1,000 Pods in its
// Store once each is reduced (labels, addresses, named ports): the cost of
// watching every Pod for NetworkPolicy peers.
func BenchmarkPodMemoryPer1000(b *testing.B) {
	for range b.N {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		store := cluster.NewStore()
		for i := range 1000 {
			p, err := convert.FromV1Pod(apiPod(i))
			if err != nil {
				b.Fatal(err)
			}
			store.Upsert(p)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/1024, "KiB/1000pods")
		runtime.KeepAlive(store)
	}
}

// benchWorld is the benchmarks' cluster (policybench): 5,000 pods in 100
// namespaces over 50 nodes, 1,000 policies (10 a namespace: a default deny,
// and ingress from a namespace and pod selector on a port).
func benchWorld(b testing.TB) ([]*cluster.Pod, []*cluster.Namespace, []*cluster.NetworkPolicy) {
	var pods []*cluster.Pod
	for i := range policybench.Pods {
		p, err := convert.FromV1Pod(policybench.Pod(i))
		if err != nil {
			b.Fatal(err)
		}
		pods = append(pods, p)
	}
	var nss []*cluster.Namespace
	for n := range policybench.Namespaces {
		ns, err := convert.FromV1Namespace(policybench.Namespace(n))
		if err != nil {
			b.Fatal(err)
		}
		nss = append(nss, ns)
	}
	return pods, nss, mustPolicies(b, policybench.PolicyDocs()...)
}

// BenchmarkCompile is the whole model's compile for node1.
func BenchmarkCompile(b *testing.B) {
	pods, nss, pols := benchWorld(b)
	b.ResetTimer()
	for range b.N {
		prog := NewModel(pods, nss, pols).Compile(onNode("node1"))
		if len(prog.Policies) == 0 {
			b.Fatal("no policy selects node1's pods")
		}
	}
}

// benchChanges are the two changes the issue times, alternated so each
// iteration changes something: a pod of node1 appearing (and leaving), and
// one of node1's pods relabelled (tier web <-> db, which moves it in and out
// of the peers of 100 policies).
func benchChanges(b *testing.B, pods []*cluster.Pod) (added, relabelled func(i int, c *Compiler)) {
	extra, err := convert.FromV1Pod(apiPod(5001))
	if err != nil {
		b.Fatal(err)
	}
	target := pods[1]
	if target.NodeName != "node1" || extra.NodeName != "node1" {
		b.Fatal("the benchmark's pods are not node1's")
	}
	added = func(i int, c *Compiler) {
		if i%2 == 0 {
			c.UpsertPod(extra)
		} else {
			c.DeletePod(extra.Key())
		}
	}
	relabelled = func(i int, c *Compiler) {
		p := *target
		p.Labels = maps.Clone(target.Labels)
		p.Labels["tier"] = []string{"db", "web"}[i%2]
		c.UpsertPod(&p)
	}
	return added, relabelled
}

// BenchmarkIncremental is what one change costs the Compiler (the program
// for node1, without the kernel), against BenchmarkCompile's whole compile.
func BenchmarkIncremental(b *testing.B) {
	pods, nss, pols := benchWorld(b)
	added, relabelled := benchChanges(b, pods)
	for _, bc := range []struct {
		name   string
		change func(int, *Compiler)
	}{{"PodAdded", added}, {"LabelChanged", relabelled}} {
		b.Run(bc.name, func(b *testing.B) {
			c := NewCompiler(NewModel(pods, nss, pols), onNode("node1"))
			b.ResetTimer()
			for i := range b.N {
				bc.change(i, c)
				if len(c.Program().Policies) == 0 {
					b.Fatal("no policy selects node1's pods")
				}
			}
		})
	}
}

// BenchmarkWorldHeap is the live heap (after a GC) that the benchmark's
// world adds to a process: its 5,100 Pods and Namespaces and 1,000 policies
// in a Store, and a Controller for node1 synced over them (its model and
// program; the table is a fake). A stand-in for proxyd's RSS growth (goal
// <= 30 MiB), which BenchmarkProxydPolicyRSS measures on a real proxyd:
// RSS is about twice the live heap once the collector has run (see
// BENCHMARKS.md, Memory).
func BenchmarkWorldHeap(b *testing.B) {
	for range b.N {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		pods, nss, pols := benchWorld(b)
		store := cluster.NewStore()
		for _, n := range nss {
			store.Upsert(n)
		}
		for _, np := range pols {
			store.Upsert(np)
		}
		for _, p := range pods {
			store.Upsert(p)
		}
		store.MarkSynced()
		f := &fakeApplier{applied: make(chan *Program, 1)}
		c := NewController(ControllerOptions{NodeName: "node1", Store: store, Table: f})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { c.Run(ctx); close(done) }()
		prog := <-f.applied
		for c.Synced() == 0 {
			runtime.Gosched()
		}
		pods, nss, pols = nil, nil, nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MiB")
		b.ReportMetric(float64(len(prog.Policies)), "policies")
		cancel()
		<-done
		runtime.KeepAlive(store)
	}
}
