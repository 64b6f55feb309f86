package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
	"github.com/podnet/podnet/e2e/realnode"
)

// nodeLocalDNSState is dnsTestState with kube-dns's trafficDistribution
// PreferSameNode, as deploy/node-local-dns sets it.
func nodeLocalDNSState(t testing.TB) string {
	t.Helper()
	const vip = "    clusterIP: 10.96.0.10\n"
	if strings.Count(dnsTestState, vip) != 1 {
		t.Fatal("dnsTestState: kube-dns's clusterIP line not found once")
	}
	return strings.Replace(dnsTestState, vip, vip+"    trafficDistribution: PreferSameNode\n", 1)
}

// dnsdRequests is the sum of a dnsd's coredns_dns_requests_total.
func dnsdRequests(t testing.TB, p *lab.Pod) float64 {
	t.Helper()
	code, body := httpGetIn(p.NSPath(), "127.0.0.1:9153", "/metrics")
	if code != 200 {
		t.Fatalf("dnsd metrics in %s: %d %s", p.Name, code, body)
	}
	return metricSums(strings.NewReader(body))["coredns_dns_requests_total"]
}

// answerTimes resolves through 10.96.0.10 from a pod with several lookers
// at once, UDP and TCP, a socket and a 250 ms try per lookup, and keeps
// when each answer came: the gap between two answers is how long the pod
// went without DNS.
type answerTimes struct {
	mu       sync.Mutex
	at       []time.Time
	failed   int
	failures []string
}

func (a *answerTimes) run(ctx context.Context, wg *sync.WaitGroup, nsPath string, stop <-chan struct{}) {
	for i := range 4 {
		proto := []string{"udp", "tcp"}[i%2]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				case <-time.After(5 * time.Millisecond):
				}
				err := askVIPWithin(nsPath, proto, 250*time.Millisecond)
				now := time.Now()
				a.mu.Lock()
				if err == nil {
					a.at = append(a.at, now)
				} else {
					a.failed++
					a.failures = append(a.failures, fmt.Sprintf("%s %s: %v", now.Format("15:04:05.000"), proto, err))
				}
				a.mu.Unlock()
			}
		})
	}
}

func (a *answerTimes) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.at)
}

// maxGap is the longest time without an answer from the last answer
// before from on.
func (a *answerTimes) maxGap(from time.Time) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	at := slices.Clone(a.at)
	slices.SortFunc(at, time.Time.Compare)
	var gap time.Duration
	prev := from
	for _, t := range at {
		if t.Before(from) {
			prev = t
			continue
		}
		gap = max(gap, t.Sub(prev))
		prev = t
	}
	return gap
}

// TestDnsdNodeLocal runs node-local DNS as deploy/node-local-dns does, on
// two lab nodes in iptables mode: a dnsd on each node behind 10.96.0.10,
// whose trafficDistribution PreferSameNode keeps a pod's queries on its
// node (at least 99 % of them answered by the dnsd of the client's node,
// by dnsd's own request counters). Then the client node's dnsd dies
// (SIGKILL); the lab stands for the kubelet and the endpoint controller and
// marks its endpoint not ready when the process is gone. The client's
// longest time without an answer must stay within 1 s. A second local dnsd
// then drains (SIGTERM, its endpoint terminating 0.5 s later) while the
// client resolves: no lookup fails.
func TestDnsdNodeLocal(t *testing.T) {
	roottest.Require(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	l := lab.Start(t, lab.Options{Nodes: lab.DefaultNodes()[:2]})
	for _, n := range l.Nodes {
		if _, err := n.StartProxyd(ctx); err != nil {
			t.Fatal(err)
		}
	}
	node1, node2 := l.Nodes[0], l.Nodes[1]
	pods := map[string]*lab.Pod{}
	for _, p := range []struct {
		name string
		node *lab.Node
	}{{"dnslocal", node1}, {"dnsremote", node2}, {"client", node1}, {"dnslocal2", node1}, {"client2", node1}} {
		pod, err := p.node.AddPod(ctx, p.name)
		if err != nil {
			t.Fatal(err)
		}
		pods[p.name] = pod
	}
	local, remote, client, local2 := pods["dnslocal"], pods["dnsremote"], pods["client"], pods["dnslocal2"]
	// The drain is watched from a second client: the first one's TCP
	// connections refused by the killed dnsd stay in conntrack (CLOSE,
	// 10 s) with their DNAT to it, and a SYN from a reused source port
	// reopens such an entry and is refused again: a property of the kill,
	// not of the drain.
	client2 := pods["client2"]
	slice := func(eps ...string) {
		t.Helper()
		if err := l.WriteState("kube-dns-slice.yaml", kubeDNSSlice(eps...)); err != nil {
			t.Fatal(err)
		}
	}
	ep := func(p *lab.Pod, cond string, n *lab.Node) string { return p.IP.String() + " " + cond + " " + n.Name }
	if err := l.WriteState("dns.yaml", nodeLocalDNSState(t)); err != nil {
		t.Fatal(err)
	}
	slice(ep(local, "true true false", node1), ep(remote, "true true false", node2))
	start := func(p *lab.Pod) *lab.Proc {
		d, err := p.Start("dnsd", filepath.Join(l.BinDir, "dnsd"), "--state-dir", l.StateDir(),
			"--upstream", l.OutsideIP.String()+":53", "--drain-quiet=2s", "--drain-max=20s")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	localDnsd, remoteDnsd := start(local), start(remote)
	waitDNSAnswers(t, client, localDnsd, remoteDnsd)

	// Steady state: the client's queries stay on its node.
	l0, r0 := dnsdRequests(t, local), dnsdRequests(t, remote)
	const n = 200
	for i := range n {
		if err := askVIPIn(client.NSPath(), []string{"udp", "tcp"}[i%2]); err != nil {
			t.Fatalf("lookup %d: %v", i, err)
		}
	}
	l1, r1 := dnsdRequests(t, local), dnsdRequests(t, remote)
	share := (l1 - l0) / (l1 - l0 + r1 - r0)
	t.Logf("steady state: %v of %d lookups answered by the client node's dnsd, %v by the other", l1-l0, n, r1-r0)
	if l1-l0 < n || share < 0.99 {
		t.Errorf("node-local share %.3f (local %v, remote %v of %d lookups), want >= 0.99", share, l1-l0, r1-r0, n)
	}

	// The local dnsd dies.
	var answers answerTimes
	stop := make(chan struct{})
	var wg sync.WaitGroup
	answers.run(ctx, &wg, client.NSPath(), stop)
	stopClients := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopClients()
	waitCount(ctx, t, &answers, 50)
	killAt := time.Now()
	if err := syscall.Kill(localDnsd.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-localDnsd.Done()
	slice(ep(local, "false false false", node1), ep(remote, "true true false", node2))
	marked := time.Since(killAt)
	waitCount(ctx, t, &answers, answers.count()+200)
	gap := answers.maxGap(killAt)
	t.Logf("local dnsd killed: endpoint not ready %v later; longest time without an answer %v (%d lookups failed meanwhile)",
		marked.Round(time.Millisecond), gap.Round(time.Millisecond), answers.failed)
	if gap > time.Second {
		t.Errorf("the client went %v without an answer after its node's dnsd died, want <= 1s:\n%s", gap, strings.Join(answers.failures, "\n"))
	}

	stopClients()

	// A new local dnsd comes, then drains: nothing is lost.
	local2Dnsd := start(local2)
	waitReady(ctx, t, local2, local2Dnsd)
	slice(ep(local2, "true true false", node1), ep(remote, "true true false", node2))
	waitLocalAnswers(ctx, t, client2, local2)
	answers = answerTimes{}
	stop = make(chan struct{})
	answers.run(ctx, &wg, client2.NSPath(), stop)
	stopClients = sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopClients()
	waitCount(ctx, t, &answers, 50)
	termAt := time.Now()
	if err := syscall.Kill(local2Dnsd.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the lag of the endpoint controller and the proxies, stood for
	slice(ep(local2, "false false true", node1), ep(remote, "true true false", node2))
	t.Logf("SIGTERM at %s, endpoint terminating at %s", termAt.Format("15:04:05.000"), time.Now().Format("15:04:05.000"))
	select {
	case <-local2Dnsd.Done():
	case <-ctx.Done():
		t.Fatalf("draining dnsd did not exit\n%s", local2Dnsd.Output())
	}
	waitCount(ctx, t, &answers, answers.count()+100)
	stopClients()
	t.Logf("local dnsd drained: %d lookups failed", answers.failed)
	if answers.failed != 0 {
		t.Errorf("%d lookups failed while the local dnsd drained:\n%s\n%s", answers.failed, strings.Join(answers.failures, "\n"), local2Dnsd.Output())
	}
}

// waitDNSAnswers waits until the client gets answers over UDP and TCP.
func waitDNSAnswers(t testing.TB, client *lab.Pod, procs ...*lab.Proc) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for askVIPIn(client.NSPath(), "udp") != nil || askVIPIn(client.NSPath(), "tcp") != nil {
		if time.Now().After(deadline) {
			var out []string
			for _, p := range procs {
				out = append(out, p.Output())
			}
			t.Fatalf("no answer through 10.96.0.10 after 60s\n%s", strings.Join(out, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitReady waits for a dnsd's /ready.
func waitReady(ctx context.Context, t *testing.T, p *lab.Pod, d *lab.Proc) {
	t.Helper()
	for {
		if code, _ := httpGetIn(p.NSPath(), "127.0.0.1:8181", "/ready"); code == 200 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("dnsd in %s not ready\n%s", p.Name, d.Output())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitLocalAnswers waits until the dnsd in p answers the client's lookups
// (proxyd sent them to it).
func waitLocalAnswers(ctx context.Context, t testing.TB, client, p *lab.Pod) {
	t.Helper()
	for {
		before := dnsdRequests(t, p)
		if askVIPIn(client.NSPath(), "udp") == nil && dnsdRequests(t, p) > before {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("lookups not answered by the dnsd in %s", p.Name)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitCount waits until a holds n answers.
func waitCount(ctx context.Context, t *testing.T, a *answerTimes, n int) {
	t.Helper()
	for a.count() < n {
		select {
		case <-ctx.Done():
			t.Fatalf("%d answers, waited for %d; failures:\n%s", a.count(), n, strings.Join(a.failures, "\n"))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestDeployNodeLocalDNS builds deploy/node-local-dns as kubectl apply -k
// does and checks it is the base with dnsd as a DaemonSet on every node
// (same container, rolled one node at a time with the new pod ready before
// the old drains, the drain within the grace period), kube-dns with
// trafficDistribution PreferSameNode, and no budget for pods no drain
// evicts; nothing else differs.
func TestDeployNodeLocalDNS(t *testing.T) {
	bins, err := realnode.FindBinaries()
	if err != nil {
		t.Fatal(err)
	}
	build := func(dir string) []map[string]any { return kustomizeBuild(t, bins.Kubectl, dir) }
	base, nl := build("../deploy"), build("../deploy/node-local-dns")
	var dep appsv1.Deployment
	var ds appsv1.DaemonSet
	var svc corev1.Service
	for _, c := range []struct {
		doc map[string]any
		out any
	}{{findObject(base, "Deployment", "podnet-dns"), &dep}, {findObject(nl, "DaemonSet", "podnet-dns"), &ds}, {findObject(nl, "Service", "kube-dns"), &svc}} {
		if c.doc == nil {
			t.Fatalf("missing object (%T)", c.out)
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(c.doc, c.out); err != nil {
			t.Fatal(err)
		}
	}
	if findObject(nl, "Deployment", "podnet-dns") != nil || findObject(nl, "PodDisruptionBudget", "podnet-dns") != nil {
		t.Error("deploy/node-local-dns still has the podnet-dns Deployment or its PodDisruptionBudget")
	}
	if ds.Namespace != "kube-system" || ds.Spec.Template.Labels["k8s-app"] != "kube-dns" {
		t.Errorf("podnet-dns DaemonSet in %q with labels %v: the kube-dns Service does not select it", ds.Namespace, ds.Spec.Template.Labels)
	}
	if got, want := ds.Spec.Template.Spec.Containers, dep.Spec.Template.Spec.Containers; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("node-local dnsd container differs from the base's:\n%v\n%v", got, want)
	}
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 1 || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("podnet-dns DaemonSet rolls with %+v, want maxSurge 1, maxUnavailable 0", ru)
	}
	if !slices.ContainsFunc(ds.Spec.Template.Spec.Tolerations, func(t corev1.Toleration) bool {
		return t.Key == "" && t.Operator == corev1.TolerationOpExists
	}) {
		t.Errorf("podnet-dns DaemonSet tolerations %v: not every node", ds.Spec.Template.Spec.Tolerations)
	}
	if svc.Spec.TrafficDistribution == nil || *svc.Spec.TrafficDistribution != "PreferSameNode" {
		t.Errorf("kube-dns trafficDistribution %v, want PreferSameNode", svc.Spec.TrafficDistribution)
	}
	checkDnsdDrain(t, []map[string]any{findObject(nl, "DaemonSet", "podnet-dns")})
	names := func(docs []map[string]any) []string {
		var out []string
		for _, d := range docs {
			md, _ := d["metadata"].(map[string]any)
			out = append(out, fmt.Sprintf("%v %v/%v", d["kind"], md["namespace"], md["name"]))
		}
		slices.Sort(out)
		return out
	}
	want := slices.DeleteFunc(names(base), func(s string) bool {
		return s == "Deployment kube-system/podnet-dns" || s == "PodDisruptionBudget kube-system/podnet-dns"
	})
	want = append(want, "DaemonSet kube-system/podnet-dns")
	slices.Sort(want)
	if got := names(nl); !slices.Equal(got, want) {
		t.Errorf("deploy/node-local-dns objects:\n%v\nwant\n%v", got, want)
	}
}

// TestDnsdNodeLocalProbe is TestDnsdNodeLocal's kill with nothing standing
// for the kubelet: the EndpointSlice goes on saying the killed dnsd is
// ready, and proxyd (its default sync periods) must notice by itself, by
// connecting to the local endpoint's TCP port every 100 ms, and move the
// client's queries to the other node's dnsd: the client's longest time
// without an answer stays within 1 s. A new dnsd in the same pod (the
// kubelet's restart) then gets the node's queries back. In iptables and
// nftables mode.
func TestDnsdNodeLocalProbe(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) { testNodeLocalProbe(t, mode) })
	}
}

func testNodeLocalProbe(t *testing.T, mode string) {
	roottest.Require(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	l := lab.Start(t, lab.Options{Nodes: lab.DefaultNodes()[:2]})
	for _, n := range l.Nodes {
		if _, err := n.StartProxyd(ctx, "--proxy-mode", mode); err != nil {
			t.Fatal(err)
		}
	}
	node1, node2 := l.Nodes[0], l.Nodes[1]
	local, err := node1.AddPod(ctx, "dnslocal")
	if err != nil {
		t.Fatal(err)
	}
	remote, err := node2.AddPod(ctx, "dnsremote")
	if err != nil {
		t.Fatal(err)
	}
	client, err := node1.AddPod(ctx, "client")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WriteState("dns.yaml", nodeLocalDNSState(t)); err != nil {
		t.Fatal(err)
	}
	if err := l.WriteState("kube-dns-slice.yaml", kubeDNSSlice(local.IP.String()+" true true false node1", remote.IP.String()+" true true false node2")); err != nil {
		t.Fatal(err)
	}
	start := func(p *lab.Pod, name string) *lab.Proc {
		d, err := p.Start(name, filepath.Join(l.BinDir, "dnsd"), "--state-dir", l.StateDir(), "--upstream", l.OutsideIP.String()+":53")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	localDnsd, remoteDnsd := start(local, "dnsd"), start(remote, "dnsd")
	waitDNSAnswers(t, client, localDnsd, remoteDnsd)
	waitLocalAnswers(ctx, t, client, local)

	var answers answerTimes
	stop := make(chan struct{})
	var wg sync.WaitGroup
	answers.run(ctx, &wg, client.NSPath(), stop)
	stopClients := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopClients()
	waitCount(ctx, t, &answers, 50)
	r0 := dnsdRequests(t, remote)
	killAt := time.Now()
	if err := syscall.Kill(localDnsd.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-localDnsd.Done()
	waitCount(ctx, t, &answers, answers.count()+200)
	gap := answers.maxGap(killAt)
	r1 := dnsdRequests(t, remote)
	t.Logf("%s mode: local dnsd killed, its endpoint left ready: longest time without an answer %v, %d lookups failed, the other node's dnsd answered %v",
		mode, gap.Round(time.Millisecond), answers.failed, r1-r0)
	if gap > time.Second {
		t.Errorf("the client went %v without an answer after its node's dnsd died, want <= 1s:\n%s", gap, strings.Join(answers.failures, "\n"))
	}
	if r1-r0 < 200 {
		t.Errorf("the other node's dnsd answered %v queries after the kill, want the 200 answers since", r1-r0)
	}
	stopClients()

	restartAt := time.Now()
	waitReady(ctx, t, local, start(local, "dnsd2"))
	waitLocalAnswers(ctx, t, client, local)
	t.Logf("%s mode: a new local dnsd answers the node's queries again %v after it started", mode, time.Since(restartAt).Round(time.Millisecond))
}
