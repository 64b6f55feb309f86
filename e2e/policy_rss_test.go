package e2e

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/agent"
	"github.com/podnet/podnet/dataplane/policy"
	"github.com/podnet/podnet/dataplane/policy/policybench"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
)

// statedirRacyWindow is dataplane/cluster/statedir's racyWindow.
const statedirRacyWindow = 3 * time.Second

// BenchmarkProxydPolicyRSS is the resident memory proxyd --network-policy
// (on by default) gains from the NetworkPolicy benchmark's world: 100
// namespaces, 5,000 pods and 1,000 policies (policybench) in the state
// directory, on node1 of a lab, in iptables mode. Each round starts proxyd
// without them and reads its RSS once the policy controller has synced,
// then starts it again with them and reads RSS once its status shows
// node1's 100 pods selected (the objects read, compiled and programmed) and
// after five more syncs (every 2 s). Goal (issue 24):
// growth <= 30 MiB. Only with PODNET_BENCH=1 (scripts/bench.sh's policy
// part sets it).
//
//	PODNET_BENCH_ROUNDS=3   rounds (a fresh proxyd each); medians printed
func BenchmarkProxydPolicyRSS(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1, as scripts/bench.sh's policy part does")
	}
	roottest.Require(b)
	rounds, _ := strconv.Atoi(cmp.Or(os.Getenv("PODNET_BENCH_ROUNDS"), "3"))
	world, err := policybench.StateYAML()
	if err != nil {
		b.Fatal(err)
	}
	l := lab.Start(b, lab.Options{})
	n := l.Node("node1")
	const file, laterSyncs = "policy-world.yaml", 5
	// status is the policy section of proxyd's /status.
	status := func() (policy.Status, bool) {
		code, body, err := svcHTTPGet(n.NSPath(), "127.0.0.1:10249/status")
		if err != nil || code != 200 {
			return policy.Status{}, false
		}
		var r map[string]json.RawMessage
		var st policy.Status
		if json.Unmarshal([]byte(body), &r) != nil || json.Unmarshal(r[agent.StatusPolicy], &st) != nil {
			return policy.Status{}, false
		}
		return st, true
	}
	// await fails after 10 minutes with proxyd's goroutines (SIGQUIT)
	// in full: the lab's log keeps only its tail.
	await := func(p *lab.Proc, what string, ok func(policy.Status) bool) policy.Status {
		deadline := time.Now().Add(10 * time.Minute)
		var last policy.Status
		for {
			st, got := status()
			if got && ok(st) {
				return st
			}
			if got {
				last = st
			}
			if time.Now().After(deadline) {
				_ = syscall.Kill(p.Pid(), syscall.SIGQUIT)
				<-p.Done()
				b.Fatalf("proxyd's policy status: no %s within 10 minutes; the last: %d syncs (last %v), error %q, %d pods selected; proxyd's output:\n%s",
					what, last.Syncs, last.LastSync, last.Error, len(last.Pods), p.Output())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	start := func() (*lab.Proc, string) {
		p, err := n.StartProxyd(b.Context(), "--proxy-mode", "iptables", "--sync-period", "2s",
			"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "")
		if err != nil {
			b.Fatal(err)
		}
		return p, strconv.Itoa(p.Pid())
	}
	var before, after, later, took []float64
	for range rounds {
		// Without the world: the policy controller synced, nothing to
		// program.
		if err := l.RemoveState(file); err != nil {
			b.Fatal(err)
		}
		p, pid := start()
		await(p, "first sync", func(s policy.Status) bool { return s.Syncs >= 1 })
		before = append(before, float64(procRSS(pid))/1024)
		if err := p.Stop(); err != nil {
			b.Fatal(err)
		}
		// With it, from the start, as after a restart.
		if err := l.WriteState(file, world); err != nil {
			b.Fatal(err)
		}
		// As after a restart, the file is older than the state
		// directory's racy window (3 s, statedir's racyWindow) when
		// proxyd reads it, so its first read is trusted: a file written
		// just before would be read and parsed whole again at the first
		// rescan, garbage the later RSS would count.
		time.Sleep(statedirRacyWindow + time.Second)
		t0 := time.Now()
		p, pid = start()
		st := await(p, "sync selecting node1's 100 pods", func(s policy.Status) bool { return len(s.Pods) == 100 })
		took = append(took, time.Since(t0).Seconds())
		after = append(after, float64(procRSS(pid))/1024)
		await(p, fmt.Sprintf("%d more syncs", laterSyncs), func(s policy.Status) bool { return s.Syncs >= st.Syncs+laterSyncs })
		later = append(later, float64(procRSS(pid))/1024)
		if err := p.Stop(); err != nil {
			b.Fatal(err)
		}
	}
	growth := func(v []float64) []float64 {
		out := make([]float64, len(v))
		for i := range v {
			out[i] = v[i] - before[i]
		}
		return out
	}
	b.ReportMetric(benchMedian(before), "before-MiB")
	b.ReportMetric(benchMedian(growth(after)), "growth-MiB")
	b.ReportMetric(benchMedian(growth(later)), "growth-later-MiB")
	b.ReportMetric(benchMedian(took), "start-to-programmed-s")
	fmt.Printf("| proxyd (iptables mode) | RSS without the objects | with them, programmed | after %d more syncs | growth | start to programmed | rounds (MiB before / after / later) |\n|---|---|---|---|---|---|---|\n", laterSyncs)
	fmt.Printf("| 5,000 pods, 100 namespaces, 1,000 policies | %.1f MiB | %.1f MiB | %.1f MiB | %.1f MiB (later %.1f) | %.2f s | %v / %v / %v |\n",
		benchMedian(before), benchMedian(after), benchMedian(later), benchMedian(growth(after)), benchMedian(growth(later)), benchMedian(took), before, after, later)
}
