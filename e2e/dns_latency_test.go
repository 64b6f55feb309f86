package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	mdns "github.com/miekg/dns"

	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
)

// timedLookup asks 10.96.0.10 once over UDP from a new socket in the pod's
// namespace, as glibc does, and returns how long the answer took: from the
// query's send to its answer, the socket's creation left out (entering the
// namespace is the test's cost, not the lookup's).
func timedLookup(nsPath string) (time.Duration, error) {
	c := &mdns.Client{Net: "udp", Timeout: 2 * time.Second}
	var conn *mdns.Conn
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		conn, err = c.Dial("10.96.0.10:53")
		return err
	})
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	q := new(mdns.Msg)
	q.SetQuestion("kubernetes.default.svc.cluster.local.", mdns.TypeA)
	start := time.Now()
	m, _, err := c.ExchangeWithConn(q, conn)
	took := time.Since(start)
	if err != nil {
		return 0, err
	}
	if m.Rcode != mdns.RcodeSuccess || len(m.Answer) != 1 {
		return 0, fmt.Errorf("rcode %s, %d answers", mdns.RcodeToString[m.Rcode], len(m.Answer))
	}
	return took, nil
}

// quantile is the q-quantile (0..1) of sorted durations.
func quantile(sorted []time.Duration, q float64) time.Duration {
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// BenchmarkDNSNodeLocalLatency: lookup latency of a pod on node1 through
// 10.96.0.10 (trafficDistribution PreferSameNode) with a dnsd on its own
// node (node-local, deploy/node-local-dns) against one on node2 only (the
// central Deployment), in alternating rounds of the same run: each round
// rewrites kube-dns's EndpointSlice, waits until proxyd sends the client's
// queries to the dnsd meant and asks 300 times one at a time; over all
// rounds, both dnsd's metrics must show at least 99 % of a layout's lookups
// answered where meant. Reports the
// median and p99 over all rounds of each layout, in µs. The lab's nodes
// are namespaces of one host, so the other node is a veth and bridge hop
// away, not a network's: the difference is the floor of what a cluster
// sees.
func BenchmarkDNSNodeLocalLatency(b *testing.B) {
	roottest.Require(b)
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Minute)
	defer cancel()
	l := lab.Start(b, lab.Options{Nodes: lab.DefaultNodes()[:2]})
	for _, n := range l.Nodes {
		if _, err := n.StartProxyd(ctx); err != nil {
			b.Fatal(err)
		}
	}
	node1, node2 := l.Nodes[0], l.Nodes[1]
	local, err := node1.AddPod(ctx, "dnslocal")
	if err != nil {
		b.Fatal(err)
	}
	remote, err := node2.AddPod(ctx, "dnsremote")
	if err != nil {
		b.Fatal(err)
	}
	client, err := node1.AddPod(ctx, "client")
	if err != nil {
		b.Fatal(err)
	}
	if err := l.WriteState("dns.yaml", nodeLocalDNSState(b)); err != nil {
		b.Fatal(err)
	}
	localEP := local.IP.String() + " true true false " + node1.Name
	remoteEP := remote.IP.String() + " true true false " + node2.Name
	layouts := []struct {
		name      string
		endpoints []string
		answerer  *lab.Pod
	}{
		{"nodelocal", []string{localEP, remoteEP}, local},
		{"central", []string{remoteEP}, remote},
	}
	if err := l.WriteState("kube-dns-slice.yaml", kubeDNSSlice(layouts[0].endpoints...)); err != nil {
		b.Fatal(err)
	}
	var procs []*lab.Proc
	for _, p := range []*lab.Pod{local, remote} {
		d, err := p.Start("dnsd", filepath.Join(l.BinDir, "dnsd"), "--state-dir", l.StateDir(), "--upstream", l.OutsideIP.String()+":53")
		if err != nil {
			b.Fatal(err)
		}
		procs = append(procs, d)
	}
	waitDNSAnswers(b, client, procs...)

	const perRound, rounds = 300, 5
	took := map[string][]time.Duration{}
	answered := map[string]*float64{}
	for _, lay := range layouts {
		answered[lay.name] = new(float64)
	}
	for b.Loop() {
		for range rounds {
			for _, lay := range layouts {
				d := latencyRound(ctx, b, l, client, lay.endpoints, lay.answerer, []*lab.Pod{local, remote}, perRound, answered[lay.name])
				took[lay.name] = append(took[lay.name], d...)
			}
		}
	}
	for _, lay := range layouts {
		d := took[lay.name]
		slices.Sort(d)
		share := *answered[lay.name] / float64(len(d))
		b.ReportMetric(float64(quantile(d, 0.5).Microseconds()), lay.name+"-p50-µs")
		b.ReportMetric(float64(quantile(d, 0.99).Microseconds()), lay.name+"-p99-µs")
		b.Logf("%s: %d lookups, median %v, p99 %v, %.4f answered by the dnsd in %s", lay.name, len(d), quantile(d, 0.5), quantile(d, 0.99), share, lay.answerer.Name)
		if share < 0.99 {
			b.Errorf("%s: %.4f of the lookups answered by the dnsd in %s, want >= 0.99: the latency is not that layout's", lay.name, share, lay.answerer.Name)
		}
	}
}

// latencyRound points kube-dns at endpoints, waits until answerer gets the
// client's queries, times n lookups, and adds to where how many of them
// answerer answered (the dnsd of pods counting them).
func latencyRound(ctx context.Context, b *testing.B, l *lab.Lab, client *lab.Pod, endpoints []string, answerer *lab.Pod, pods []*lab.Pod, n int, where *float64) []time.Duration {
	b.Helper()
	if err := l.WriteState("kube-dns-slice.yaml", kubeDNSSlice(endpoints...)); err != nil {
		b.Fatal(err)
	}
	// Until proxyd has the new slice, a lookup may still go the old way;
	// waitLocalAnswers returns once one reached answerer, and the counts
	// below check that all of the round's did.
	for {
		waitLocalAnswers(ctx, b, client, answerer)
		before := map[*lab.Pod]float64{}
		for _, p := range pods {
			before[p] = dnsdRequests(b, p)
		}
		if _, err := timedLookup(client.NSPath()); err != nil {
			b.Fatal(err)
		}
		if dnsdRequests(b, answerer) == before[answerer]+1 {
			break
		}
	}
	before := map[*lab.Pod]float64{}
	for _, p := range pods {
		before[p] = dnsdRequests(b, p)
	}
	out := make([]time.Duration, 0, n)
	for range n {
		d, err := timedLookup(client.NSPath())
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, d)
	}
	// A new socket's source port may be one a lookup of the round before
	// used: its conntrack entry (UDP, 30 s) still holds that round's DNAT,
	// as it would in a cluster, so a few may go the other way.
	total := 0.0
	for _, p := range pods {
		total += dnsdRequests(b, p) - before[p]
	}
	if total != float64(n) {
		b.Fatalf("the dnsd answered %v of the round's %d lookups", total, n)
	}
	*where += dnsdRequests(b, answerer) - before[answerer]
	return out
}
