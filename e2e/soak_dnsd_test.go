package e2e

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/dataplane/testport"
)

// soakUpstream is dnsmasq on a loopback port, answering *.example.test,
// that the dnsd soak kills and starts again.
type soakUpstream struct {
	t    *testing.T
	port int
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func (u *soakUpstream) start() {
	u.t.Helper()
	cmd := exec.Command(roottest.Tool(u.t, "dnsmasq", "dnsmasq-base"), "--no-daemon", "--no-resolv", "--no-hosts", "--bind-interfaces", "--listen-address=127.0.0.1",
		fmt.Sprintf("--port=%d", u.port), "--address=/example.test/192.0.2.1", "--user="+dnsUserName(), "--pid-file=")
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		u.t.Fatalf("start dnsmasq: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	u.mu.Lock()
	u.cmd, u.done = cmd, done
	u.mu.Unlock()
	c := &mdns.Client{Timeout: 100 * time.Millisecond}
	q := new(mdns.Msg)
	q.SetQuestion("ready.example.test.", mdns.TypeA)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, _, err := c.Exchange(q, fmt.Sprintf("127.0.0.1:%d", u.port)); err == nil {
			return
		}
	}
	u.t.Fatal("dnsmasq not answering")
}

func (u *soakUpstream) kill() {
	u.mu.Lock()
	cmd, done := u.cmd, u.done
	u.mu.Unlock()
	cmd.Process.Kill()
	<-done
}

// pid is the running dnsmasq's process id.
func (u *soakUpstream) pid() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.cmd.Process.Pid
}

// soakEvidence keeps what explains a wrong answer of the dnsd soak after
// the fact, sampled through the whole run: a witness asking the upstream
// directly (fresh names, 50 a second, bypassing dnsd), the run-queue wait
// of dnsmasq and of dnsd's threads (/proc/PID/task/*/schedstat: time
// runnable but not running), dnsd's forwarder counters (/metrics) and the
// load average. dnsd's log adds when its forwarder marked the upstream down
// and up.
type soakEvidence struct {
	mu      sync.Mutex
	direct  []directTry
	samples []evidenceSample
}

type directTry struct {
	sent time.Time
	took time.Duration
	err  error
}

type evidenceSample struct {
	at                  time.Time
	upstreamWait        time.Duration // cumulative, of the dnsmasq running then
	upstreamPid         int
	dnsdWait            time.Duration // cumulative, all threads
	forwardSent         float64       // tries sent upstream
	forwardAnswered     float64       // tries answered
	healthcheckFailures float64
	healthcheckBroken   float64
	load                string
	dnsdRSS, liveHeap   int // KiB
}

// askDirectly is the witness: every 20 ms a fresh name straight to the
// upstream while it is meant to be up, each answer's latency recorded.
func (e *soakEvidence) askDirectly(stop <-chan struct{}, upstream string, down *atomic.Bool) {
	c := &mdns.Client{Net: "udp", Timeout: 2 * time.Second}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if down.Load() {
			continue
		}
		q := new(mdns.Msg)
		q.SetQuestion(fmt.Sprintf("w%d.example.test.", i), mdns.TypeA)
		sent := time.Now()
		m, _, err := c.Exchange(q, upstream)
		if down.Load() { // killed on purpose meanwhile
			continue
		}
		if err == nil && m.Rcode != mdns.RcodeSuccess {
			err = fmt.Errorf("rcode %s", mdns.RcodeToString[m.Rcode])
		}
		e.mu.Lock()
		e.direct = append(e.direct, directTry{sent: sent, took: time.Since(sent), err: err})
		e.mu.Unlock()
	}
}

// sample records the run-queue waits, dnsd's forwarder counters and the
// load average every 250 ms.
func (e *soakEvidence) sample(stop <-chan struct{}, upstreamPid func() int, dnsdPid int, metricsAddr string) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		s := evidenceSample{at: time.Now(), upstreamPid: upstreamPid(), dnsdWait: schedWait(dnsdPid)}
		s.upstreamWait = schedWait(s.upstreamPid)
		if load, err := os.ReadFile("/proc/loadavg"); err == nil {
			s.load = strings.Join(strings.Fields(string(load))[:3], " ")
		}
		if resp, err := http.Get("http://" + metricsAddr + "/metrics"); err == nil {
			sums := metricSums(resp.Body)
			resp.Body.Close()
			s.forwardSent, s.forwardAnswered = sums["podnet_dns_forward_requests_total"], sums["coredns_proxy_request_duration_seconds_count"]
			s.healthcheckFailures, s.healthcheckBroken = sums["coredns_proxy_healthcheck_failures_total"], sums["coredns_forward_healthcheck_broken_total"]
			s.liveHeap = int(sums["go_memstats_next_gc_bytes"] / 2 / 1024)
		}
		s.dnsdRSS = rssOf(dnsdPid)
		e.mu.Lock()
		e.samples = append(e.samples, s)
		e.mu.Unlock()
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// rssOf is a process's VmRSS in KiB, 0 if it cannot be read.
func rssOf(pid int) int {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(status), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

// memoryTrace is dnsd's RSS and live heap (after its last GC) every 30 s,
// in MiB, with the run's events marked.
func (e *soakEvidence) memoryTrace(began time.Time) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var parts []string
	next := began
	for _, s := range e.samples {
		if s.at.Before(next) {
			continue
		}
		parts = append(parts, fmt.Sprintf("%v %.1f/%.1f", s.at.Sub(began).Round(time.Second), float64(s.dnsdRSS)/1024, float64(s.liveHeap)/1024))
		next = next.Add(30 * time.Second)
	}
	return strings.Join(parts, ", ")
}

// medianMemory is the median of dnsd's RSS and of its live heap sampled
// between from and to, in KiB.
func (e *soakEvidence) medianMemory(from, to time.Time) (rss, heap int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var rs, hs []int
	for _, s := range e.samples {
		if !s.at.Before(from) && !s.at.After(to) && s.dnsdRSS > 0 {
			rs, hs = append(rs, s.dnsdRSS), append(hs, s.liveHeap)
		}
	}
	if len(rs) == 0 {
		return 0, 0
	}
	slices.Sort(rs)
	slices.Sort(hs)
	return rs[len(rs)/2], hs[len(hs)/2]
}

// schedWait is how long the threads of pid have waited runnable on a run
// queue, in total (the second field of schedstat).
func schedWait(pid int) time.Duration {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var total time.Duration
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if fs := strings.Fields(string(b)); len(fs) >= 2 {
			ns, _ := strconv.ParseInt(fs[1], 10, 64)
			total += time.Duration(ns)
		}
	}
	return total
}

// metricSums adds up each Prometheus series by metric name.
func metricSums(r io.Reader) map[string]float64 {
	sums := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name := line[:strings.IndexAny(line+" ", "{ ")]
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			sums[name] += v
		}
	}
	return sums
}

// soakWrong is one wrong answer of the dnsd soak and the upstream's state
// as the test had made it.
type soakWrong struct {
	kind, qname, what string
	sent              time.Time
	took              time.Duration
	upstreamDown      bool
	sinceChange       time.Duration
}

// unresponsive reports whether a direct query to the upstream, overlapping
// the wrong answer's time, failed or took at least tryTimeout: then the
// upstream itself did not answer in time, as dnsd saw it.
func (e *soakEvidence) unresponsive(w soakWrong, tryTimeout time.Duration) (bool, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	from, to := w.sent.Add(-tryTimeout), w.sent.Add(w.took)
	var n, slow int
	var worst time.Duration
	var worstErr error
	for _, d := range e.direct {
		if d.sent.After(to) || d.sent.Add(d.took).Before(from) {
			continue
		}
		n++
		if d.took > worst {
			worst = d.took
		}
		if d.err != nil || d.took >= tryTimeout {
			slow++
			if d.err != nil {
				worstErr = d.err
			}
		}
	}
	s := fmt.Sprintf("%d direct queries to the upstream overlapped it, %d failed or took ≥ %v, slowest %v", n, slow, tryTimeout, worst.Round(time.Millisecond))
	if worstErr != nil {
		s += fmt.Sprintf(" (%v)", worstErr)
	}
	return slow > 0, s
}

// explain says what the samples and dnsd's log show around a wrong answer.
func (e *soakEvidence) explain(w soakWrong, dnsdLog string) string {
	e.mu.Lock()
	var before, after *evidenceSample
	for i := range e.samples {
		s := &e.samples[i]
		if !s.at.After(w.sent.Add(-time.Second)) {
			before = s
		}
		if after == nil && s.at.After(w.sent.Add(w.took)) {
			after = s
		}
	}
	e.mu.Unlock()
	var b strings.Builder
	if before != nil && after != nil {
		span := after.at.Sub(before.at).Round(time.Millisecond)
		upWait := "dnsmasq restarted in between"
		if before.upstreamPid == after.upstreamPid {
			upWait = (after.upstreamWait - before.upstreamWait).Round(time.Millisecond).String()
		}
		fmt.Fprintf(&b, "over the %v around it: dnsmasq waited %s on a run queue, dnsd's threads %v; dnsd's forwarder sent %.0f tries upstream, %.0f answered, %.0f health checks failed, %.0f times all upstreams were down; load average %s",
			span, upWait, (after.dnsdWait - before.dnsdWait).Round(time.Millisecond),
			after.forwardSent-before.forwardSent, after.forwardAnswered-before.forwardAnswered,
			after.healthcheckFailures-before.healthcheckFailures, after.healthcheckBroken-before.healthcheckBroken, after.load)
	}
	var lines []string
	for _, l := range strings.Split(dnsdLog, "\n") {
		if !strings.Contains(l, "upstream") {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(l, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err == nil && at.After(w.sent.Add(-3*time.Second)) && at.Before(w.sent.Add(w.took+3*time.Second)) {
			lines = append(lines, l)
		}
	}
	if len(lines) > 0 {
		fmt.Fprintf(&b, "; dnsd's log within 3 s: %s", strings.Join(lines, " / "))
	} else {
		b.WriteString("; dnsd logged no upstream change within 3 s")
	}
	return b.String()
}

// TestSoakDnsd is scenario 4: mixed queries at a fixed rate (cluster names,
// misses, a cached forwarded name, fresh forwarded names) while a Service
// churns in the state directory, the upstream is killed and started again
// twice, and in the middle 100,000 garbage UDP packets and truncated TCP
// messages arrive. Goal: cluster names and misses answered right
// throughout, the cached name answered (stale while the upstream is down),
// SERVFAIL only for fresh forwarded names the upstream did not answer in
// time: while it is down, and while it is up only when a direct query to
// it at that moment was as slow (every wrong answer is logged with what
// the evidence sampler saw); RSS at the end within 10 % of the start
// (medians of the first and the last minute, checked at full size).
func TestSoakDnsd(t *testing.T) {
	state := t.TempDir()
	if err := os.WriteFile(filepath.Join(state, "cluster.yaml"), []byte(dnsTestState), 0o644); err != nil {
		t.Fatal(err)
	}
	up := &soakUpstream{t: t, port: testport.Free(t)}
	up.start()
	t.Cleanup(func() { up.kill() })
	const tryTimeout = 500 * time.Millisecond
	// A cache of 1,000 entries fills in the first 20 s of fresh names, so
	// the RSS at the start (after that warm-up) includes a full cache.
	// Cached names answered while the upstream is down is serve-stale's
	// promise, which dnsd (like kubeadm's Corefile) makes only when
	// configured: this dnsd is, as an operator wanting it would.
	d := startDnsd(t, dnsdBinary(t), state, "--upstream", fmt.Sprintf("127.0.0.1:%d", up.port),
		"--forward-timeout", tryTimeout.String(), "--forward-deadline", "1500ms", "--cache-size", "1000",
		"--serve-stale", "1h")
	d.waitReady(t)
	server := fmt.Sprintf("127.0.0.1:%d", d.dnsPort)
	// The cached name is asked once while the upstream is up.
	if m, err := d.ask(t, "udp", "www.example.test."); err != nil || m.Rcode != mdns.RcodeSuccess {
		t.Fatalf("priming the cache: %v, %v", m, err)
	}
	duration := time.Duration(soakSize(8, 600)) * time.Second
	warmUp := time.Duration(soakSize(1, 30)) * time.Second

	var upstreamDown atomic.Bool
	var lastChange atomic.Int64 // unix nanos of the last upstream change
	lastChange.Store(time.Now().UnixNano())
	type kind struct {
		soakLoad
		q        func(i int) string
		servfail atomic.Int64
	}
	kinds := []*kind{
		{soakLoad: soakLoad{name: "cluster"}, q: func(int) string { return "kubernetes.default.svc.cluster.local." }},
		{soakLoad: soakLoad{name: "miss"}, q: func(int) string { return "nope.default.svc.cluster.local." }},
		{soakLoad: soakLoad{name: "cached forwarded"}, q: func(int) string { return "www.example.test." }},
		{soakLoad: soakLoad{name: "fresh forwarded"}, q: func(i int) string { return fmt.Sprintf("u%d.example.test.", i) }},
	}
	var wrongMu sync.Mutex
	var wrong []soakWrong
	// suspects are SERVFAILs for fresh names while the upstream was meant
	// to be up: judged at the end, against the witness.
	var suspects []soakWrong
	judge := func(k *kind, qname string, m *mdns.Msg, err error, sent time.Time) {
		var ok bool
		w := soakWrong{kind: k.name, qname: qname, sent: sent, took: time.Since(sent),
			upstreamDown: upstreamDown.Load(), sinceChange: sent.Sub(time.Unix(0, lastChange.Load()))}
		switch {
		case err != nil:
		case k.name == "miss":
			ok = m.Rcode == mdns.RcodeNameError
		case k.name == "fresh forwarded" && m.Rcode == mdns.RcodeServerFailure:
			k.servfail.Add(1)
			// While the upstream is down, or within a second of a
			// change (health checks and in-flight tries), SERVFAIL is
			// right.
			if w.upstreamDown || w.sinceChange < time.Second {
				ok = true
				break
			}
			w.what = "SERVFAIL"
			wrongMu.Lock()
			suspects = append(suspects, w)
			wrongMu.Unlock()
			return
		default:
			ok = m.Rcode == mdns.RcodeSuccess && len(m.Answer) > 0
		}
		if ok {
			k.record(nil, sent)
			return
		}
		if err == nil {
			err = fmt.Errorf("wrong answer %v", m)
		}
		w.what = err.Error()
		wrongMu.Lock()
		wrong = append(wrong, w)
		wrongMu.Unlock()
		k.record(err, sent)
	}
	evidence := &soakEvidence{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { evidence.askDirectly(stop, fmt.Sprintf("127.0.0.1:%d", up.port), &upstreamDown) })
	wg.Go(func() { evidence.sample(stop, up.pid, d.cmd.Process.Pid, fmt.Sprintf("127.0.0.1:%d", d.metricsPort)) })
	for _, k := range kinds {
		wg.Go(func() {
			c := &mdns.Client{Net: "udp", Timeout: 2 * time.Second}
			tick := time.NewTicker(20 * time.Millisecond) // 50 queries/s of each kind
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				q := new(mdns.Msg)
				q.SetQuestion(k.q(i), mdns.TypeA)
				sent := time.Now()
				m, _, err := c.Exchange(q, server)
				if err != nil { // a stub resolver tries twice (resolv.conf attempts:2)
					m, _, err = c.Exchange(q, server)
				}
				judge(k, q.Question[0].Name, m, err, sent)
			}
		})
	}
	// A Service churning in the state directory.
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			svc := fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: churn, namespace: default}\nspec: {clusterIP: 10.96.0.%d, ports: [{port: 80}]}\n", 100+i%100)
			tmp := filepath.Join(state, ".churn.tmp")
			if i%3 == 2 {
				os.Remove(filepath.Join(state, "churn.yaml"))
			} else if os.WriteFile(tmp, []byte(svc), 0o644) == nil {
				os.Rename(tmp, filepath.Join(state, "churn.yaml"))
			}
		}
	})
	began := time.Now()
	time.Sleep(warmUp)
	measured := time.Now()
	phase := duration / 8
	garbage := soakSize(20000, 100000)
	for step := range 8 {
		time.Sleep(phase)
		switch step {
		case 0, 2: // the upstream dies, and comes back a phase later
			upstreamDown.Store(true)
			up.kill()
			lastChange.Store(time.Now().UnixNano())
		case 1, 3:
			up.start()
			upstreamDown.Store(false)
			lastChange.Store(time.Now().UnixNano())
		case 4:
			soakGarbage(t, server, garbage)

		}
	}
	close(stop)
	wg.Wait()
	took := time.Since(began)
	// RSS under this load moves by ±1.7 MiB around its level as GC
	// cycles come and go (a 10-minute run: 33.2 to 36.7 MiB with no
	// trend, the live heap 3.5 to 5.2 MiB); one sample at each end can
	// differ by 10 % with nothing leaking. Start and end are the medians
	// of the first and the last minute's samples (every 250 ms).
	window := min(time.Minute, phase)
	rssStart, heapStart := evidence.medianMemory(measured, measured.Add(window))
	rssEnd, heapEnd := evidence.medianMemory(began.Add(took-window), began.Add(took))
	t.Logf("dnsd RSS/live heap (MiB) since the start: %s; phases of %v from %v: upstream killed, back, killed, back, garbage", evidence.memoryTrace(began), phase, warmUp)

	// Every wrong answer is shown with its evidence; a SERVFAIL with the
	// upstream up counts as wrong unless the upstream, asked directly at
	// that moment, did not answer within dnsd's try timeout either.
	dnsdLog := d.out.String()
	unanswered := 0
	for _, s := range suspects {
		slow, direct := evidence.unresponsive(s, tryTimeout)
		line := fmt.Sprintf("%s %s: %s after %v, upstream up (last change %v before): %s; %s",
			s.sent.Format("15:04:05.000"), s.qname, s.what, s.took.Round(time.Millisecond), s.sinceChange.Round(time.Millisecond), direct, evidence.explain(s, dnsdLog))
		if slow {
			unanswered++
			kinds[3].record(nil, s.sent)
			t.Logf("upstream unresponsive, SERVFAIL right: %s", line)
			continue
		}
		kinds[3].record(fmt.Errorf("SERVFAIL with the upstream up and answering directly: %s", line), s.sent)
		t.Logf("WRONG: %s", line)
	}
	for _, w := range wrong {
		state := "up"
		if w.upstreamDown {
			state = "down"
		}
		_, direct := evidence.unresponsive(w, tryTimeout)
		t.Logf("WRONG %s %s (%s): %s after %v, upstream %s (last change %v before): %s; %s",
			w.sent.Format("15:04:05.000"), w.qname, w.kind, w.what, w.took.Round(time.Millisecond), state, w.sinceChange.Round(time.Millisecond), direct, evidence.explain(w, dnsdLog))
	}
	evidence.mu.Lock()
	var directSlow int
	var directWorst time.Duration
	for _, d := range evidence.direct {
		if d.err != nil || d.took >= tryTimeout {
			directSlow++
		}
		directWorst = max(directWorst, d.took)
	}
	directTotal := len(evidence.direct)
	evidence.mu.Unlock()

	loads := make([]*soakLoad, len(kinds))
	for i, k := range kinds {
		loads[i] = &k.soakLoad
	}
	total, bad, parts := soakSummary(t, loads, 1)
	if soakFull() && rssEnd > rssStart*11/10 {
		t.Errorf("dnsd RSS (median of %v) %d KiB at the end, %d KiB at the start: more than 10 %% growth", window, rssEnd, rssStart)
	}
	soakRow(t, "4 dnsd soak",
		fmt.Sprintf("%s queries over %v (%.0f/s) of which %v warm-up, a Service churning", strings.Join(parts, ", "), took.Round(time.Second), float64(total)/took.Seconds(), warmUp),
		fmt.Sprintf("upstream killed and restarted twice; %d garbage UDP packets and 200 truncated TCP messages", garbage),
		fmt.Sprintf("%d of %d answers wrong (SERVFAIL for fresh forwarded names: %d, of which %d with the upstream up but not answering a direct query within %v either)",
			bad, total, kinds[3].servfail.Load(), unanswered, tryTimeout),
		fmt.Sprintf("RSS (median of %v) %.1f MiB at the start, %.1f MiB at the end, live heap %.1f → %.1f MiB; upstream asked directly: %d of %d queries failed or took ≥ %v, slowest %v",
			window, float64(rssStart)/1024, float64(rssEnd)/1024, float64(heapStart)/1024, float64(heapEnd)/1024, directSlow, directTotal, tryTimeout, directWorst.Round(time.Millisecond)))
}

// soakGarbage sends n random UDP packets and 200 TCP connections carrying a
// length prefix and only part of the message to a DNS server.
func soakGarbage(t *testing.T, server string, n int) {
	t.Helper()
	uc, err := net.Dial("udp", server)
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	buf := make([]byte, 600)
	for i := range n {
		l := rand.IntN(len(buf))
		for j := range l {
			buf[j] = byte(rand.IntN(256))
		}
		uc.Write(buf[:l])
		if i%20 == 19 {
			time.Sleep(time.Millisecond) // at most 20,000 a second
		}
	}
	for range 200 {
		c, err := net.DialTimeout("tcp", server, time.Second)
		if err != nil {
			continue
		}
		c.Write([]byte{0x01, 0x00, 0xab, 0xcd, 0x01})
		c.Close()
	}
}
