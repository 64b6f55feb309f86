package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
)

// apiPod is a v1.Pod as a ReplicaSet makes it: three labels, one
// container with a named port, an address per family.
func apiPod(i int) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%100), Name: fmt.Sprintf("app%d-7d4b9c8f6-%05d", i%50, i),
			Labels: map[string]string{"app": fmt.Sprintf("app%d", i%50), "pod-template-hash": "7d4b9c8f6", "tier": []string{"web", "db"}[i%2]}},
		Spec: v1.PodSpec{NodeName: fmt.Sprintf("node%d", i%50), Containers: []v1.Container{{Name: "main", Image: "registry.example/app:1",
			Ports: []v1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: v1.ProtocolTCP}}}}},
		Status: v1.PodStatus{PodIPs: []v1.PodIP{
			{IP: netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}).String()},
			{IP: netip.AddrFrom16([16]byte{0xfd, 0, 0x10, 0, 0x2, 0x44, 0, 0, 0, 0, 0, 0, 0, 0, byte(i >> 8), byte(i)}).String()}}},
	}
}

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

// benchWorld is the benchmark's cluster: 5,000 pods in 100 namespaces over
// 50 nodes, 1,000 policies (10 a namespace: a default deny, and ingress
// from a namespace and pod selector on a port).
func benchWorld(b *testing.B) ([]*cluster.Pod, []*cluster.Namespace, []*cluster.NetworkPolicy) {
	var pods []*cluster.Pod
	for i := range 5000 {
		p, err := convert.FromV1Pod(apiPod(i))
		if err != nil {
			b.Fatal(err)
		}
		pods = append(pods, p)
	}
	var nss []*cluster.Namespace
	var docs []string
	for n := range 100 {
		nss = append(nss, &cluster.Namespace{Name: fmt.Sprintf("ns%d", n), Labels: map[string]string{"team": fmt.Sprintf("t%d", n%10)}})
		docs = append(docs, fmt.Sprintf("metadata: {namespace: ns%d, name: deny}\nspec: {podSelector: {}, policyTypes: [Ingress, Egress]}", n))
		for k := range 9 {
			docs = append(docs, fmt.Sprintf(`metadata: {namespace: ns%d, name: allow%d}
spec:
  podSelector: {matchLabels: {app: app%d}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {team: t%d}}, podSelector: {matchLabels: {tier: web}}}], ports: [{port: http}, {port: 9000, endPort: 9100}]}]
  egress: [{to: [{podSelector: {matchLabels: {app: app%d}}}]}]`, n, k, (n+k)%50, k, (n+k+1)%50))
		}
	}
	return pods, nss, mustPolicies(b, docs...)
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
