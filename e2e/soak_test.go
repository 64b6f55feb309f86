package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
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

	"github.com/podnet/podnet/dataplane/ipam"
	"github.com/podnet/podnet/dataplane/link"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/dataplane/testport"
	"github.com/podnet/podnet/e2e/lab"
)

// The reliability scenarios of `make soak` (scripts/soak.sh). Each runs a
// short version in `make test` and its full size with PODNET_SOAK=1, asserts
// its goal either way, and adds one row to the table soak.sh prints:
// scenario | load | faults | failed requests or lost data | figure.

// soakFull reports whether the full-size scenarios were asked for.
func soakFull() bool { return os.Getenv("PODNET_SOAK") == "1" }

// soakSize is short in `make test`, full in `make soak`.
func soakSize(short, full int) int {
	if soakFull() {
		return full
	}
	return short
}

// soakRow logs a table row and appends it to $PODNET_SOAK_REPORT. Called
// after the scenario's checks, it marks the row of a scenario that missed
// its goal.
func soakRow(t *testing.T, scenario, load, faults, failed, figure string) {
	t.Helper()
	if t.Failed() {
		scenario = "FAILED " + scenario
	}
	row := strings.Join([]string{scenario, load, faults, failed, figure}, " | ")
	t.Log(row)
	if p := os.Getenv("PODNET_SOAK_REPORT"); p != "" {
		f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Errorf("soak report: %v", err)
			return
		}
		defer f.Close()
		fmt.Fprintln(f, row)
	}
}

// soakLoad is one steady client: a probe after another, with a pause,
// until stopped or max probes; it counts what failed.
type soakLoad struct {
	name         string
	ok, failed   atomic.Int64
	mu           sync.Mutex
	firstFailure string
}

func (l *soakLoad) run(stop <-chan struct{}, max int, probe func() error) {
	for range max {
		select {
		case <-stop:
			return
		default:
		}
		l.record(probe(), time.Now())
		time.Sleep(5 * time.Millisecond)
	}
}

// record counts one request; err says what was wrong with it.
func (l *soakLoad) record(err error, at time.Time) {
	if err == nil {
		l.ok.Add(1)
		return
	}
	l.failed.Add(1)
	l.mu.Lock()
	if l.firstFailure == "" {
		l.firstFailure = fmt.Sprintf("%s at %s", err, at.Format("15:04:05.000"))
	}
	l.mu.Unlock()
}

// soakSummary fails the test for each load with a failure or fewer than
// minOK good requests, and returns the totals and one "name count" per load.
func soakSummary(t *testing.T, loads []*soakLoad, minOK int64) (total, failed int64, parts []string) {
	t.Helper()
	for _, ld := range loads {
		total += ld.ok.Load() + ld.failed.Load()
		failed += ld.failed.Load()
		parts = append(parts, fmt.Sprintf("%s %d", ld.name, ld.ok.Load()+ld.failed.Load()))
		if ld.failed.Load() > 0 || ld.ok.Load() < minOK {
			t.Errorf("%s: %d requests right, %d failed (first: %s)", ld.name, ld.ok.Load(), ld.failed.Load(), ld.firstFailure)
		}
	}
	return total, failed, parts
}

// healthz asks the proxyd of node for /healthz on its loopback. The socket
// is made on the namespace's thread (an http.Client would dial from another
// one, outside the namespace).
func healthz(n *lab.Node) (ok bool, body string) {
	var conn net.Conn
	err := ns.WithNetNSPath(n.NSPath(), func(ns.NetNS) error {
		var err error
		conn, err = net.DialTimeout("tcp", "127.0.0.1:10256", 200*time.Millisecond)
		return err
	})
	if err != nil {
		return false, err.Error()
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(conn, "GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK, string(b)
}

// TestSoakProxydKilled is scenario 1: proxyd killed (SIGKILL) and stopped
// (SIGTERM) again and again, on the client's node and on an endpoint's node,
// under steady TCP and UDP load through a ClusterIP and TCP load through a
// NodePort from outside. Goal: no failed request, and the node's rules stay
// in place while proxyd is down.
func TestSoakProxydKilled(t *testing.T) {
	c := svcStart(t, "iptables")
	l := c.lab
	n1, n3 := l.Node("node1"), l.Node("node3")
	c.apply(svcDef{name: "soak", clusterIP: "10.96.2.1", typ: "NodePort",
		ports: []svcPort{
			{name: "tcp", proto: "TCP", port: 80, target: 9090, nodePort: 30090},
			{name: "udp", proto: "UDP", port: 53, target: 5353},
		},
		endpoints: []svcEndpoint{svcReady(c.web1), svcReady(c.web2)}})
	nodePort := net.JoinHostPort(n3.IP.String(), "30090")
	c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.2.1:80", "web1", "web2")
	c.eventuallyServes(t, c.c3.NSPath(), "udp", "10.96.2.1:53", "web1", "web2")
	c.eventuallyServes(t, l.OutsideHost.NSPath(), "tcp", nodePort, "web1", "web2")

	rounds := soakSize(1, 5)
	probe := func(nsPath, proto, addr string) func() error {
		return func() error {
			out, err := c.probeIn(nsPath, proto, addr, 2*time.Second)
			if err == nil && !strings.HasPrefix(out, "web") {
				err = fmt.Errorf("answer %q", out)
			}
			return err
		}
	}
	loads := []*soakLoad{{name: "TCP ClusterIP"}, {name: "UDP ClusterIP"}, {name: "TCP NodePort"}}
	probes := []func() error{
		probe(c.c3.NSPath(), "tcp", "10.96.2.1:80"),
		probe(c.c3.NSPath(), "udp", "10.96.2.1:53"),
		probe(l.OutsideHost.NSPath(), "tcp", nodePort),
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, ld := range loads {
		wg.Go(func() { ld.run(stop, 100000, probes[i]) })
	}
	began := time.Now()

	var restarts []time.Duration
	faults := 0
	for _, n := range []*lab.Node{n3, n1} {
		for _, sig := range []string{"KILL", "TERM"} {
			for range rounds {
				time.Sleep(300 * time.Millisecond)
				if sig == "KILL" {
					c.proxyd[n.Name].Kill()
				} else if err := c.proxyd[n.Name].Stop(); err != nil {
					t.Errorf("proxyd on %s after SIGTERM: %v", n.Name, err)
				}
				faults++
				time.Sleep(200 * time.Millisecond)
				// With proxyd gone the kernel still holds the Service.
				if out, err := n.Exec(t.Context(), "iptables-save", "-t", "nat"); err != nil || !strings.Contains(out, "10.96.2.1/32") || !strings.Contains(out, "--dport 30090") {
					t.Errorf("%s with proxyd down (SIG%s): the Service's rules are gone (%v)", n.Name, sig, err)
				}
				start := time.Now()
				c.startProxyd(n)
				for ok, body := healthz(n); !ok; ok, body = healthz(n) {
					if time.Since(start) > 10*time.Second {
						t.Fatalf("proxyd on %s not healthy 10 s after a restart: %s\n%s", n.Name, body, c.proxyd[n.Name].Output())
					}
					time.Sleep(20 * time.Millisecond)
				}
				restarts = append(restarts, time.Since(start))
			}
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	took := time.Since(began)

	total, failed, perLoad := soakSummary(t, loads, 20)
	slices.Sort(restarts)
	soakRow(t, "1 proxyd killed",
		fmt.Sprintf("%s over %v (%.0f req/s)", strings.Join(perLoad, ", "), took.Round(time.Second), float64(total)/took.Seconds()),
		fmt.Sprintf("%d on node3 (client) and node1 (endpoint): SIGKILL and SIGTERM × %d each", faults, rounds),
		fmt.Sprintf("%d of %d requests failed", failed, total),
		fmt.Sprintf("restart to healthy: median %v, max %v", restarts[len(restarts)/2].Round(time.Millisecond), restarts[len(restarts)-1].Round(time.Millisecond)))
}

// TestSoakCNIChurn is scenario 5: ADD/DEL pairs, 20 at a time, the plugin
// SIGKILLed at random points of one ADD or DEL in ten (a runtime's timeout:
// libcni kills the plugin when its context ends, and the runtime then
// DELs until that succeeds), proxyd restarted halfway, then GC. Goal: no
// address held by two live pods at once, and afterwards no allocation,
// host veth, store temp file or cached result left.
func TestSoakCNIChurn(t *testing.T) {
	roottest.Require(t)
	l := lab.Start(t, lab.Options{})
	n := l.Node("node1")
	startProxyd := func() *lab.Proc {
		p, err := n.Start("proxyd", svcProxydArgs(l, n, "iptables")...)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	proxyd := startProxyd()
	waitUntil(t, 10*time.Second, func() bool { return svcFileExists(n.NodeConfigPath()) }, "node config")

	pairs, workers := soakSize(100, 2000), 20
	// The kill window is how long an uninterrupted ADD takes.
	start := time.Now()
	cal, err := n.AddPod(t.Context(), "churncal")
	if err != nil {
		t.Fatal(err)
	}
	window := time.Since(start)
	if err := n.DeletePod(t.Context(), cal); err != nil {
		t.Fatal(err)
	}

	var (
		mu                      sync.Mutex
		live                    = map[netip.Addr]string{}
		twice                   []string
		kills, unkilledFailures atomic.Int64
		firstFailure            atomic.Value
		addTimes                []time.Duration
	)
	// maybeKilled returns a context that, one time in ten, ends at a random
	// point of the plugin's run.
	maybeKilled := func() (context.Context, context.CancelFunc, bool) {
		if rand.IntN(10) != 0 {
			return context.Background(), func() {}, false
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.Int64N(int64(window)+1)))
		return ctx, cancel, true
	}
	// del DELs until it succeeds, as a runtime does.
	del := func(p *lab.Pod) {
		ctx, cancel, kill := maybeKilled()
		err := n.DeletePod(ctx, p)
		cancel()
		for try := 0; err != nil && try < 5; try++ {
			if kill {
				kills.Add(1)
				kill = false
			} else {
				unkilledFailures.Add(1)
				firstFailure.CompareAndSwap(nil, err.Error())
			}
			err = n.DeletePod(context.Background(), p)
		}
		if err != nil {
			t.Errorf("DEL %s never succeeded: %v", p.Name, err)
		}
	}
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				name := fmt.Sprintf("churn%d", i)
				ctx, cancel, kill := maybeKilled()
				began := time.Now()
				p, err := n.AddPod(ctx, name)
				cancel()
				if err != nil {
					if kill {
						kills.Add(1)
					} else {
						unkilledFailures.Add(1)
						firstFailure.CompareAndSwap(nil, err.Error())
					}
					// The failed ADD's own DEL died with it: the runtime
					// tears the sandbox down.
					for _, q := range l.Pods() {
						if q.Name == name {
							del(q)
						}
					}
					continue
				}
				mu.Lock()
				addTimes = append(addTimes, time.Since(began))
				if other, ok := live[p.IP]; ok {
					twice = append(twice, fmt.Sprintf("%s to %s and %s", p.IP, other, name))
				}
				live[p.IP] = name
				mu.Unlock()
				time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
				mu.Lock()
				delete(live, p.IP)
				mu.Unlock()
				del(p)
			}
		})
	}
	began := time.Now()
	for i := range pairs {
		if i == pairs/2 {
			if err := proxyd.Stop(); err != nil {
				t.Errorf("proxyd: %v", err)
			}
			proxyd = startProxyd()
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	took := time.Since(began)

	if err := n.GC(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	var leaks []string
	txn, err := ipam.Open(ipam.Options{Dir: filepath.Join(n.Dir, "ipam", "podnet")})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range txn.Allocations() {
		leaks = append(leaks, "address "+a.Addr.String()+" of "+a.Attachment.String())
	}
	txn.Close()
	tmps, _ := filepath.Glob(filepath.Join(n.Dir, "ipam", "podnet", ".*tmp*"))
	for _, f := range tmps {
		leaks = append(leaks, "store temp file "+f)
	}
	if err := ns.WithNetNSPath(n.NSPath(), func(ns.NetNS) error {
		veths, err := link.HostVeths()
		for _, v := range veths {
			leaks = append(leaks, "veth "+v.Attrs().Name)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	cached, _ := filepath.Glob(filepath.Join(n.Dir, "cni-cache", "results", "*churn*"))
	for _, f := range cached {
		leaks = append(leaks, "cached result "+filepath.Base(f))
	}
	for _, p := range l.Pods() {
		leaks = append(leaks, "pod namespace "+p.NS)
	}
	if len(twice) > 0 {
		t.Errorf("addresses handed out twice: %v", twice)
	}
	if len(leaks) > 0 {
		t.Errorf("left after GC: %d: %v", len(leaks), leaks)
	}
	if n := unkilledFailures.Load(); n > 0 {
		t.Errorf("%d ADDs or DELs that were not killed failed (first: %v)", n, firstFailure.Load())
	}
	slices.Sort(addTimes)
	median := time.Duration(0)
	if len(addTimes) > 0 {
		median = addTimes[len(addTimes)/2]
	}
	soakRow(t, "5 CNI churn",
		fmt.Sprintf("%d ADD/DEL pairs, %d at a time, in %v", pairs, workers, took.Round(time.Second)),
		fmt.Sprintf("%d plugin runs SIGKILLed, 1 proxyd restart, then GC", kills.Load()),
		fmt.Sprintf("%d addresses handed out twice, %d leaked objects", len(twice), len(leaks)),
		fmt.Sprintf("ADD median %v (%.0f pairs/s)", median.Round(time.Millisecond), float64(pairs)/took.Seconds()))
}

// rssKiB is a process's resident set in KiB, from /proc.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatalf("no VmRSS for pid %d", pid)
	return 0
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// TestSoakServiceChurn is scenario 2, through the state directory: Services
// with EndpointSlices created, changed and deleted, half of their files
// written in place (truncated, then written) and half replaced by rename,
// while a client hammers a stable Service. Goal: no failed request on the
// stable Service; figures: the 95th percentile from a file's write to its
// Service being served by proxyd (from a pod) and resolvable from dnsd. At
// full size the churn runs twice, each time settled, and proxyd's and
// dnsd's RSS after the second may not exceed that after the first by more
// than the measurement's noise. (TestSoakServiceChurnAPI is the scenario
// through the API server.)
func TestSoakServiceChurn(t *testing.T) {
	c := svcStart(t, "iptables")
	l := c.lab
	n3 := l.Node("node3")
	dns := startDnsd(t, dnsdBinary(t), l.StateDir(), "--upstream", fmt.Sprintf("127.0.0.1:%d", testport.Free(t)))
	c.apply(svcDef{name: "stable", clusterIP: "10.96.3.1", ports: svcTCPPort(80), endpoints: []svcEndpoint{svcReady(c.web1), svcReady(c.web2)}})
	c.eventuallyServes(t, c.c3.NSPath(), "tcp", "10.96.3.1:80", "web1", "web2")
	dns.waitReady(t)

	services := soakSize(20, 1000)
	spread := time.Duration(soakSize(2, 30)) * time.Second // creations, then changes, spread over this
	rounds := soakSize(1, 2)
	procs := []rssProc{
		{"proxyd", c.proxyd[n3.Name].Pid, func() string {
			_, body := httpGetIn(n3.NSPath(), "127.0.0.1:10249", "/metrics")
			return body
		}},
		{"dnsd", func() int { return dns.cmd.Process.Pid }, func() string {
			_, body := dns.get(dns.metricsPort, "/metrics")
			return body
		}},
	}
	vip := func(i int) string { return fmt.Sprintf("10.96.%d.%d", 4+i/250, i%250+1) }
	def := func(i int, ep *lab.Pod) svcDef {
		return svcDef{name: fmt.Sprintf("churn%d", i), clusterIP: vip(i), ports: svcTCPPort(80), endpoints: []svcEndpoint{svcReady(ep)}}
	}
	// write puts a Service's file in place (even i) or by rename (odd i).
	write := func(i int, text string) error {
		name := fmt.Sprintf("svc-churn%d.yaml", i)
		if i%2 == 0 {
			return os.WriteFile(filepath.Join(l.StateDir(), name), []byte(text), 0o644)
		}
		return l.WriteState(name, text)
	}
	var mu sync.Mutex
	var served, resolved []time.Duration
	var measure sync.WaitGroup
	// Every Service's creation is timed until a pod reaches it through
	// proxyd and dnsd resolves its name (30 s at most: p95 was 9.7 s at
	// load average 38 on this machine).
	timeIt := func(i int, written time.Time) {
		measure.Go(func() {
			addr, name := vip(i)+":80", fmt.Sprintf("churn%d.default.svc.cluster.local.", i)
			var proxyDone, dnsDone bool
			for time.Since(written) < 30*time.Second && !(proxyDone && dnsDone) {
				if !proxyDone {
					if out, err := c.probeIn(c.c3.NSPath(), "tcp", addr, 300*time.Millisecond); err == nil && strings.HasPrefix(out, "web1") {
						proxyDone = true
						mu.Lock()
						served = append(served, time.Since(written))
						mu.Unlock()
					}
				}
				if !dnsDone {
					if m, err := dns.ask(t, "udp", name); err == nil && m.Rcode == mdns.RcodeSuccess && len(m.Answer) == 1 {
						dnsDone = true
						mu.Lock()
						resolved = append(resolved, time.Since(written))
						mu.Unlock()
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	churn := func() {
		gap := spread / time.Duration(services)
		for i := range services {
			if err := write(i, def(i, c.web1).yaml(t)); err != nil {
				t.Fatal(err)
			}
			if i%max(1, services/50) == 0 { // 50 timed samples at most
				timeIt(i, time.Now())
			}
			time.Sleep(gap)
		}
		for i := range services {
			if err := write(i, def(i, c.web2).yaml(t)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(gap)
		}
		for i := range services {
			if err := os.Remove(filepath.Join(l.StateDir(), fmt.Sprintf("svc-churn%d.yaml", i))); err != nil {
				t.Fatal(err)
			}
		}
		measure.Wait()
		// Settled: the last Service is gone from proxyd and dnsd.
		waitUntil(t, 30*time.Second, func() bool {
			_, err := c.probeIn(c.c3.NSPath(), "tcp", vip(services-1)+":80", 300*time.Millisecond)
			m, derr := dns.ask(t, "udp", fmt.Sprintf("churn%d.default.svc.cluster.local.", services-1))
			return err != nil && derr == nil && m.Rcode == mdns.RcodeNameError
		}, "the churned Services gone")
	}
	run := runChurnUnderLoad(t, procs, rounds, func() error {
		_, err := c.probeIn(c.c3.NSPath(), "tcp", "10.96.3.1:80", 2*time.Second)
		return err
	}, churn)
	samples := rounds * min(services, (services+max(1, services/50)-1)/max(1, services/50))
	if len(served) < samples || len(resolved) < samples {
		t.Errorf("of %d timed Services, %d were served and %d resolved within 30 s", samples, len(served), len(resolved))
	}
	soakRow(t, "2 Service churn (state directory)",
		fmt.Sprintf("%d Services created, changed, deleted, %d round(s) of %v (half written in place); stable Service hammered (%d requests)",
			services, rounds, run.perRound, run.stableTotal),
		"none beyond the churn",
		fmt.Sprintf("%d failed on the stable Service", run.stableFailed),
		fmt.Sprintf("write to served p95 %v, to resolvable p95 %v (%d samples); %s",
			percentile(served, 0.95).Round(time.Millisecond), percentile(resolved, 0.95).Round(time.Millisecond), len(served),
			run.memory))
}

// churnMemory shows the RSS around the churn rounds: before and after the
// one short round, or the flat check of two rounds at full size.
func churnMemory(t *testing.T, procs []rssProc, before []rssSettled, settled [][]rssSettled) string {
	t.Helper()
	mib := func(kib int) float64 { return float64(kib) / 1024 }
	if len(settled) < 2 {
		return fmt.Sprintf("RSS %s %.1f → %.1f, %s %.1f → %.1f MiB", procs[0].name, mib(before[0].median), mib(settled[0][0].median),
			procs[1].name, mib(before[1].median), mib(settled[0][1].median))
	}
	return "RSS settled after round 1 → round 2: " + rssFlat(t, procs, settled[0], settled[1]) +
		fmt.Sprintf(" (before the churn: %s %.1f, %s %.1f MiB)", procs[0].name, mib(before[0].median), procs[1].name, mib(before[1].median))
}
