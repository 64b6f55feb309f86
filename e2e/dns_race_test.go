package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	mdns "github.com/miekg/dns"
	"golang.org/x/net/ipv4"

	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
)

// conntrackStats sums a column of the kernel's conntrack statistics
// (/proc/net/stat/nf_conntrack, what `conntrack -S` prints: insert_failed,
// clashres) over the CPUs, in a node's namespace.
func conntrackStats(ctx context.Context, t *testing.T, n *lab.Node, column string) int64 {
	t.Helper()
	out, err := n.Exec(ctx, "cat", "/proc/net/stat/nf_conntrack")
	if err != nil {
		t.Fatalf("conntrack statistics of %s: %v %s", n.Name, err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	col := slices.Index(strings.Fields(lines[0]), column)
	if col < 0 {
		t.Fatalf("conntrack statistics of %s: no column %s in %q", n.Name, column, lines[0])
	}
	var sum int64
	for _, line := range lines[1:] {
		if f := strings.Fields(line); col < len(f) {
			v, _ := strconv.ParseInt(f[col], 16, 64)
			sum += v
		}
	}
	return sum
}

// askAAndAAAA is one glibc lookup: a new UDP socket (in the pod's
// namespace and, for ebpf mode's socket hooks, its node's cgroup), the A
// and AAAA queries of one name sent together in one sendmmsg, both answers
// awaited for timeout.
func askAAndAAAA(nsPath, cgroup string, timeout time.Duration) error {
	var conn *net.UDPConn
	dial := func() error {
		return ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
			c, err := net.Dial("udp", "10.96.0.10:53")
			if err == nil {
				conn = c.(*net.UDPConn)
			}
			return err
		})
	}
	var err error
	if cgroup != "" {
		err = lab.InCgroup(cgroup, dial)
	} else {
		err = dial()
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	var msgs []ipv4.Message
	ids := map[uint16]uint16{}
	for _, qt := range []uint16{mdns.TypeA, mdns.TypeAAAA} {
		q := new(mdns.Msg).SetQuestion("kubernetes.default.svc.cluster.local.", qt)
		pkt, err := q.Pack()
		if err != nil {
			return err
		}
		ids[q.Id] = qt
		msgs = append(msgs, ipv4.Message{Buffers: [][]byte{pkt}})
	}
	if n, err := ipv4.NewPacketConn(conn).WriteBatch(msgs, 0); err != nil || n != 2 {
		return fmt.Errorf("sendmmsg: %d sent, %v", n, err)
	}
	conn.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 512)
	for len(ids) > 0 {
		n, err := conn.Read(buf)
		if err != nil {
			return fmt.Errorf("%d of 2 answers: %w", 2-len(ids), err)
		}
		var m mdns.Msg
		if m.Unpack(buf[:n]) == nil {
			delete(ids, m.Id)
		}
	}
	return nil
}

// TestDnsdParallelAAndAAAA sends glibc's default lookup, A and AAAA of one
// name from one socket at once (the "5-second DNS delay" of
// kubernetes#56903: two packets of one new UDP flow racing to insert
// their conntrack entry, each DNATed to its own endpoint), from a pod of
// node1 to 10.96.0.10 whose two dnsd endpoints are on node2, from four
// clients at once for PODNET_DNS_RACE_SECONDS (10 by default; the issue
// asks 60). In both proxy modes: no lookup waits more than 1 s for its
// two answers, and conntrack's insert_failed on the client's node does not
// move. The log also gives clashres, the clashes the kernel resolved: on
// this lab (kernel 6.18, two CPUs) it stayed 0 in both modes, so the race
// itself was not provoked here and the test guards the outcome;
// TestConntrackClashOfOneSocket (dataplane/proxy) provokes it with two
// pinned threads and shows the kernel resolving it.
func TestDnsdParallelAAndAAAA(t *testing.T) {
	for _, mode := range []string{"iptables", "ebpf"} {
		t.Run(mode, func(t *testing.T) { testParallelAAndAAAA(t, mode) })
	}
}

func testParallelAAndAAAA(t *testing.T, mode string) {
	roottest.Require(t)
	d := 10 * time.Second
	if s, err := strconv.Atoi(os.Getenv("PODNET_DNS_RACE_SECONDS")); err == nil && s > 0 {
		d = time.Duration(s) * time.Second
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute+d)
	defer cancel()
	l := lab.Start(t, lab.Options{Nodes: lab.DefaultNodes()[:2]})
	for _, n := range l.Nodes {
		if _, err := n.Start("proxyd", svcProxydArgs(l, n, mode)...); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range l.Nodes {
		waitUntil(t, 30*time.Second, func() bool { return svcFileExists(n.NodeConfigPath()) }, "node config of "+n.Name)
	}
	node1, node2 := l.Nodes[0], l.Nodes[1]
	var dnsPods []*lab.Pod
	for _, name := range []string{"dns1", "dns2"} {
		p, err := node2.AddPod(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		dnsPods = append(dnsPods, p)
	}
	client, err := node1.AddPod(ctx, "client")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WriteState("dns.yaml", dnsTestState); err != nil {
		t.Fatal(err)
	}
	if err := l.WriteState("kube-dns-slice.yaml", kubeDNSSlice(dnsPods[0].IP.String()+" true true false", dnsPods[1].IP.String()+" true true false")); err != nil {
		t.Fatal(err)
	}
	var procs []*lab.Proc
	for _, p := range dnsPods {
		d, err := p.Start("dnsd", filepath.Join(l.BinDir, "dnsd"), "--state-dir", l.StateDir(), "--upstream", l.OutsideIP.String()+":53")
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, d)
	}
	cgroup := ""
	if mode == "ebpf" {
		cgroup = node1.BPFCgroup()
	}
	deadline := time.Now().Add(60 * time.Second)
	for askAAndAAAA(client.NSPath(), cgroup, 2*time.Second) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("no answers through 10.96.0.10 after 60s\n%s\n%s", procs[0].Output(), procs[1].Output())
		}
		time.Sleep(200 * time.Millisecond)
	}

	failedBefore, clashBefore := conntrackStats(ctx, t, node1, "insert_failed"), conntrackStats(ctx, t, node1, "clashres")
	var lookups, slow atomic.Int64
	var mu sync.Mutex
	var slowErrs []string
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(stop) && ctx.Err() == nil {
				lookups.Add(1)
				if err := askAAndAAAA(client.NSPath(), cgroup, time.Second); err != nil {
					slow.Add(1)
					mu.Lock()
					slowErrs = append(slowErrs, time.Now().Format("15:04:05.000")+" "+err.Error())
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	failed, clash := conntrackStats(ctx, t, node1, "insert_failed")-failedBefore, conntrackStats(ctx, t, node1, "clashres")-clashBefore
	t.Logf("%s mode, %v: %d parallel A+AAAA lookups, %d over 1s; conntrack on the client's node: insert_failed +%d, clashres +%d",
		mode, d, lookups.Load(), slow.Load(), failed, clash)
	if slow.Load() != 0 {
		t.Errorf("%d lookups waited more than 1s for their two answers:\n%s", slow.Load(), strings.Join(slowErrs[:min(len(slowErrs), 20)], "\n"))
	}
	if failed != 0 {
		t.Errorf("conntrack insert_failed on %s rose by %d", node1.Name, failed)
	}
}
