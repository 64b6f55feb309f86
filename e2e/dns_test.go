package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/podnet/podnet/dataplane/dns"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/podnet/podnet/dataplane/metricstest"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/dataplane/testport"
	"github.com/podnet/podnet/e2e/lab"
)

// dnsdBinary is bin/dnsd under test.
func dnsdBinary(t *testing.T) string { return commandBinary(t, "dnsd", "../cmd/dnsd") }

func dnsUserName() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "root"
}

func dnsLoopbackPort(t *testing.T) int { return testport.Free(t) }

const dnsTestState = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: kubernetes, namespace: default}
  spec:
    clusterIP: 10.96.0.1
    clusterIPs: [10.96.0.1]
    ports: [{name: https, port: 443, protocol: TCP, targetPort: 6443}]
- apiVersion: v1
  kind: Service
  metadata: {name: kube-dns, namespace: kube-system}
  spec:
    clusterIP: 10.96.0.10
    clusterIPs: [10.96.0.10]
    ports:
    - {name: dns, port: 53, protocol: UDP}
    - {name: dns-tcp, port: 53, protocol: TCP}
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: default}
  spec:
    clusterIP: None
    ports: [{name: http, port: 80, protocol: TCP}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-abcde
    namespace: default
    labels: {kubernetes.io/service-name: web}
  addressType: IPv4
  ports: [{name: http, port: 80, protocol: TCP}]
  endpoints:
  - addresses: [10.244.2.7]
    hostname: web-0
    conditions: {ready: true}
`

// kubeDNSSlice is the kube-dns EndpointSlice with one endpoint per line of
// eps ("IP ready serving terminating [node]").
func kubeDNSSlice(eps ...string) string {
	var b strings.Builder
	b.WriteString(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-abcde
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns}
addressType: IPv4
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
endpoints:
`)
	for _, e := range eps {
		var ip, node string
		var ready, serving, terminating bool
		fmt.Sscan(e, &ip, &ready, &serving, &terminating, &node)
		fmt.Fprintf(&b, "- addresses: [%s]\n  conditions: {ready: %v, serving: %v, terminating: %v}\n", ip, ready, serving, terminating)
		if node != "" {
			fmt.Fprintf(&b, "  nodeName: %s\n", node)
		}
	}
	return b.String()
}

// TestDnsdProcess runs the dnsd binary on loopback ports (no root needed)
// with a state directory and dnsmasq as its upstream: readiness, cluster
// and forwarded answers over UDP and TCP, a state change picked up while
// running, metrics, and a clean exit on SIGTERM.
func TestDnsdProcess(t *testing.T) {
	bin := dnsdBinary(t)
	state := dnsStateDir(t, t.TempDir())
	upPort := startDnsmasq(t, "example.test", "192.0.2.1")

	d := startDnsd(t, bin, state, "--upstream", fmt.Sprintf("127.0.0.1:%d", upPort))
	d.waitReady(t)
	dnsPort, metricsPort, healthPort, cmd, exited, out, get := d.dnsPort, d.metricsPort, d.healthPort, d.cmd, d.exited, d.out, d.get
	if code, body := get(healthPort, "/health"); code != http.StatusOK {
		t.Errorf("/health: %d %s", code, body)
	}

	server := fmt.Sprintf("127.0.0.1:%d", dnsPort)
	ask := func(proto, name string, qtype uint16) *mdns.Msg {
		t.Helper()
		c := &mdns.Client{Net: proto, Timeout: 2 * time.Second}
		q := new(mdns.Msg)
		q.SetQuestion(name, qtype)
		m, _, err := c.Exchange(q, server)
		if err != nil {
			t.Fatalf("%s %s: %v", proto, name, err)
		}
		return m
	}
	for _, proto := range []string{"udp", "tcp"} {
		for _, c := range []struct {
			name  string
			qtype uint16
			want  string
		}{
			{"kubernetes.default.", mdns.TypeA, "kubernetes.default.\t5\tIN\tA\t10.96.0.1"},
			{"kubernetes.default.svc.cluster.local.", mdns.TypeA, "kubernetes.default.svc.cluster.local.\t5\tIN\tA\t10.96.0.1"},
			{"_https._tcp.kubernetes.default.svc.cluster.local.", mdns.TypeSRV, "_https._tcp.kubernetes.default.svc.cluster.local.\t5\tIN\tSRV\t0 100 443 kubernetes.default.svc.cluster.local."},
			{"1.0.96.10.in-addr.arpa.", mdns.TypePTR, "1.0.96.10.in-addr.arpa.\t5\tIN\tPTR\tkubernetes.default.svc.cluster.local."},
			{"web-0.web.default.svc.cluster.local.", mdns.TypeA, "web-0.web.default.svc.cluster.local.\t5\tIN\tA\t10.244.2.7"},
			{"www.example.test.", mdns.TypeA, "192.0.2.1"},
		} {
			m := ask(proto, c.name, c.qtype)
			if m.Rcode != mdns.RcodeSuccess || len(m.Answer) != 1 || !strings.Contains(m.Answer[0].String(), c.want) {
				t.Errorf("%s %s %s: %v", proto, c.name, mdns.TypeToString[c.qtype], m)
			}
		}
		if m := ask(proto, "nope.default.svc.cluster.local.", mdns.TypeA); m.Rcode != mdns.RcodeNameError || len(m.Ns) != 1 {
			t.Errorf("%s missing Service: %v", proto, m)
		}
	}

	// A Service added to the state directory is answered while running.
	extra := strings.ReplaceAll(strings.ReplaceAll(dnsTestState[strings.Index(dnsTestState, "- apiVersion: v1\n  kind: Service\n  metadata: {name: kube-dns"):strings.Index(dnsTestState, "- apiVersion: v1\n  kind: Service\n  metadata: {name: web")],
		"kube-dns", "late"), "10.96.0.10", "10.96.0.77")
	if err := os.WriteFile(filepath.Join(state, "late.yaml"), []byte("apiVersion: v1\nkind: List\nitems:\n"+extra), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := ask("udp", "late.kube-system.svc.cluster.local.", mdns.TypeA)
		if m.Rcode == mdns.RcodeSuccess && len(m.Answer) == 1 && strings.HasSuffix(m.Answer[0].String(), "10.96.0.77") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("new Service not answered after 10s: %v\n%s", m, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	_, metrics := get(metricsPort, "/metrics")
	fams := metricstest.Parse(t, metrics)
	for _, want := range [][]string{
		{"coredns_dns_responses_total", "rcode", "NOERROR", "plugin", "kubernetes"},
		{"coredns_dns_responses_total", "rcode", "NXDOMAIN", "plugin", "kubernetes"},
		{"coredns_dns_requests_total", "type", "A", "proto", "udp", "family", "1"},
		{"coredns_cache_hits_total", "type", "success"},
		{"coredns_dns_request_duration_seconds", "server", "dns://:53"},
		{"podnet_dns_upstream_healthy"},
	} {
		if v, ok := metricstest.Value(fams, want[0], want[1:]...); !ok || v == 0 {
			t.Errorf("/metrics: %v = %v (found %v), want above 0", want, v, ok)
		}
	}

	// dnsd status says what /metrics counts.
	stOut, err := exec.Command(bin, "status", "-o", "json", "--metrics-address", fmt.Sprintf("127.0.0.1:%d", metricsPort)).Output()
	if err != nil {
		t.Fatalf("dnsd status: %v", err)
	}
	var st dns.Status
	if err := json.Unmarshal(stOut, &st); err != nil {
		t.Fatalf("dnsd status -o json: %v\n%s", err, stOut)
	}
	names, _ := metricstest.Value(fams, "podnet_dns_zone_names")
	hits, _ := metricstest.Value(fams, "coredns_cache_hits_total", "type", "success")
	if !st.Synced || len(st.Zones) == 0 || st.Zones[0].Name != "cluster.local." || float64(st.Zones[0].Records) != names {
		t.Errorf("dnsd status zones %+v (synced %v), want cluster.local. with the %v names of /metrics", st.Zones, st.Synced, names)
	}
	if len(st.Upstreams) != 1 || st.Upstreams[0].Address != fmt.Sprintf("127.0.0.1:%d", upPort) || !st.Upstreams[0].Healthy {
		t.Errorf("dnsd status upstreams %+v, want the dnsmasq at %d, healthy", st.Upstreams, upPort)
	}
	if st.Cache == nil || st.Cache.Hits < hits || st.Cache.Success == 0 {
		t.Errorf("dnsd status cache %+v, want at least the %v hits of /metrics and an entry", st.Cache, hits)
	}
	if text, err := exec.Command(bin, "status", "--metrics-address", fmt.Sprintf("127.0.0.1:%d", metricsPort)).Output(); err != nil || !strings.Contains(string(text), "cluster.local.") || !strings.Contains(string(text), "healthy") {
		t.Errorf("dnsd status: %v\n%s", err, text)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("dnsd exit after SIGTERM: %v\n%s", err, out.String())
		}
	case <-time.After(5 * time.Second):
		t.Errorf("dnsd still running 5s after SIGTERM")
	}
}

// dnsdProc is the dnsd binary running on loopback ports with a state
// directory.
type dnsdProc struct {
	dnsPort, metricsPort, healthPort, readyPort int
	cmd                                         *exec.Cmd
	exited                                      chan error
	out                                         *lockedBuilder
}

func startDnsd(t *testing.T, bin, state string, extra ...string) *dnsdProc {
	t.Helper()
	d := &dnsdProc{dnsPort: dnsLoopbackPort(t), metricsPort: dnsLoopbackPort(t), healthPort: dnsLoopbackPort(t), readyPort: dnsLoopbackPort(t),
		exited: make(chan error, 1), out: &lockedBuilder{}}
	d.cmd = exec.Command(bin, append([]string{
		"--state-dir", state,
		"--listen", fmt.Sprintf("127.0.0.1:%d", d.dnsPort),
		"--metrics-address", fmt.Sprintf("127.0.0.1:%d", d.metricsPort),
		"--health-address", fmt.Sprintf("127.0.0.1:%d", d.healthPort),
		"--ready-address", fmt.Sprintf("127.0.0.1:%d", d.readyPort),
	}, extra...)...)
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.exited <- d.cmd.Wait() }()
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		select {
		case <-d.exited:
		case <-time.After(5 * time.Second):
		}
	})
	return d
}

func (d *dnsdProc) get(port int, path string) (int, string) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (d *dnsdProc) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _ := d.get(d.readyPort, "/ready"); code == http.StatusOK {
			return
		}
		select {
		case err := <-d.exited:
			t.Fatalf("dnsd exited: %v\n%s", err, d.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dnsd not ready after 10s:\n%s", d.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (d *dnsdProc) ask(t *testing.T, proto, name string) (*mdns.Msg, error) {
	t.Helper()
	c := &mdns.Client{Net: proto, Timeout: 2 * time.Second}
	q := new(mdns.Msg)
	q.SetQuestion(name, mdns.TypeA)
	m, _, err := c.Exchange(q, fmt.Sprintf("127.0.0.1:%d", d.dnsPort))
	return m, err
}

// TestDnsdTCPConnectionMemory: 10,000 TCP connections attempted at once,
// each sending all but the last byte of a 64 KiB message (what holds the
// most memory on the server), keep dnsd's peak RSS under the Deployment's
// 256 Mi limit, and dnsd answers again once they are gone. Before the cap
// and message-sized buffers, 4,000 such connections took it to 357 MB.
func TestDnsdTCPConnectionMemory(t *testing.T) {
	// As root the hard limit may be raised too (CAP_SYS_RESOURCE).
	const files = 10500
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < files {
		lim.Cur, lim.Max = max(lim.Max, files), max(lim.Max, files)
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); lim.Cur < files {
		roottest.Unavailable(t, "open files limited to %d; 10,000 connections need more", lim.Cur)
	}
	state := t.TempDir()
	if err := os.WriteFile(filepath.Join(state, "cluster.yaml"), []byte(dnsTestState), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDnsd(t, dnsdBinary(t), state)
	d.waitReady(t)
	addr := fmt.Sprintf("127.0.0.1:%d", d.dnsPort)
	msg := make([]byte, 2+65535-1)
	msg[0], msg[1] = 0xff, 0xff // 65535 announced, one byte short
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	dialed, failed := 0, 0
	start := time.Now()
	for range 10000 {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			failed++
			continue
		}
		dialed++
		conns = append(conns, c)
		c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		c.Write(msg)
	}
	time.Sleep(500 * time.Millisecond)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	kib := func(field string) int {
		for _, l := range strings.Split(string(status), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == field+":" {
				n, _ := strconv.Atoi(f[1])
				return n
			}
		}
		t.Fatalf("no %s in /proc status", field)
		return 0
	}
	peak, now := kib("VmHWM"), kib("VmRSS")
	t.Logf("10,000 connections attempted in %v (%d connected, %d failed): dnsd RSS %d MiB, peak %d MiB",
		time.Since(start).Round(time.Millisecond), dialed, failed, now/1024, peak/1024)
	if peak >= 256*1024 {
		t.Errorf("dnsd peak RSS %d MiB with 10,000 TCP connections attempted, want under 256 MiB", peak/1024)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	// Answers over UDP throughout, and over TCP once the held connections
	// are gone.
	for _, proto := range []string{"udp", "tcp"} {
		var m *mdns.Msg
		var err error
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if m, err = d.ask(t, proto, "kubernetes.default.svc.cluster.local."); err == nil && m.Rcode == mdns.RcodeSuccess {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil || m.Rcode != mdns.RcodeSuccess {
			t.Errorf("%s query after the connections: %v, %v", proto, m, err)
		}
	}
}

// TestDnsdStartedWithABrokenStateFile: dnsd restarted while a state file
// does not parse must not answer NXDOMAIN for that file's names and call
// itself ready: it answers SERVFAIL and /ready names the file until the
// file is fixed.
func TestDnsdStartedWithABrokenStateFile(t *testing.T) {
	state := t.TempDir()
	if err := os.WriteFile(filepath.Join(state, "cluster.yaml"), []byte(dnsTestState), 0o644); err != nil {
		t.Fatal(err)
	}
	late := "apiVersion: v1\nkind: Service\nmetadata: {name: late, namespace: default}\nspec: {clusterIP: 10.96.0.77, ports: [{port: 80}]}\n"
	if err := os.WriteFile(filepath.Join(state, "late.yaml"), []byte(late+"  broken: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDnsd(t, dnsdBinary(t), state)
	time.Sleep(time.Second)
	if code, body := d.get(d.readyPort, "/ready"); code == http.StatusOK || !strings.Contains(body, "late.yaml") {
		t.Errorf("/ready with late.yaml broken: %d %q; want not ready, naming the file", code, body)
	}
	for _, name := range []string{"late.default.svc.cluster.local.", "kubernetes.default.svc.cluster.local."} {
		if m, err := d.ask(t, "udp", name); err != nil || m.Rcode != mdns.RcodeServerFailure {
			t.Errorf("%s with the state half read: %v, %v; want SERVFAIL", name, m, err)
		}
	}
	if err := os.WriteFile(filepath.Join(state, "late.yaml"), []byte(late), 0o644); err != nil {
		t.Fatal(err)
	}
	d.waitReady(t)
	if m, err := d.ask(t, "udp", "late.default.svc.cluster.local."); err != nil || m.Rcode != mdns.RcodeSuccess || len(m.Answer) != 1 {
		t.Errorf("late after the fix: %v, %v", m, err)
	}
}

// TestDnsdInLab runs dnsd as a pod behind the kube-dns VIP 10.96.0.10 in
// the lab, with proxyd's Service proxy on every node and dnsmasq "on the
// internet" as upstream, and asks from a pod on another node.
func TestDnsdInLab(t *testing.T) {
	roottest.Require(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	l := lab.Start(t, lab.Options{Nodes: lab.DefaultNodes()[:2]})
	for _, n := range l.Nodes {
		if _, err := n.StartProxyd(ctx); err != nil {
			t.Fatal(err)
		}
	}
	up, err := l.OutsideHost.Start("dnsmasq", "dnsmasq", "--no-daemon", "--no-resolv", "--no-hosts", "--bind-interfaces",
		"--listen-address="+l.OutsideIP.String(), "--port=53", "--address=/example.test/192.0.2.1", "--user=root", "--pid-file=")
	if err != nil {
		t.Fatal(err)
	}
	dnsPod, err := l.Nodes[0].AddPod(ctx, "dnsd")
	if err != nil {
		t.Fatal(err)
	}
	client, err := l.Nodes[1].AddPod(ctx, "client")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WriteState("dns.yaml", dnsTestState); err != nil {
		t.Fatal(err)
	}
	if err := l.WriteState("kube-dns-slice.yaml", kubeDNSSlice(dnsPod.IP.String()+" true true false")); err != nil {
		t.Fatal(err)
	}
	dnsd, err := dnsPod.Start("dnsd", filepath.Join(l.BinDir, "dnsd"), "--state-dir", l.StateDir(),
		"--upstream", l.OutsideIP.String()+":53")
	if err != nil {
		t.Fatal(err)
	}

	dig := func(args ...string) string {
		out, err := client.Exec(ctx, append([]string{"dig", "+short", "+time=1", "+tries=2"}, args...)...)
		if err != nil {
			return "error: " + err.Error()
		}
		return strings.TrimSpace(out)
	}
	// Wait until the VIP answers: proxyd's rules and dnsd's sync.
	deadline := time.Now().Add(30 * time.Second)
	for dig("@10.96.0.10", "kubernetes.default") != "10.96.0.1" {
		if time.Now().After(deadline) {
			t.Fatalf("no answer through 10.96.0.10 after 30s\ndnsd:\n%s\ndnsmasq:\n%s\n%s", dnsd.Output(), up.Output(), l.Logs())
		}
		time.Sleep(200 * time.Millisecond)
	}

	// dig +search with the resolv.conf a ClusterFirst pod gets, mounted in a
	// private mount namespace of the client's command only.
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"@10.96.0.10", "kubernetes.default"}, "10.96.0.1"},
		{[]string{"+tcp", "@10.96.0.10", "kubernetes.default"}, "10.96.0.1"},
		{[]string{"@10.96.0.10", "SRV", "_https._tcp.kubernetes.default.svc.cluster.local"}, "0 100 443 kubernetes.default.svc.cluster.local."},
		{[]string{"+tcp", "@10.96.0.10", "SRV", "_https._tcp.kubernetes.default.svc.cluster.local"}, "0 100 443 kubernetes.default.svc.cluster.local."},
		{[]string{"@10.96.0.10", "-x", "10.96.0.1"}, "kubernetes.default.svc.cluster.local."},
		{[]string{"+tcp", "@10.96.0.10", "-x", "10.96.0.1"}, "kubernetes.default.svc.cluster.local."},
		{[]string{"@10.96.0.10", "www.example.test"}, "192.0.2.1"},
		{[]string{"+tcp", "@10.96.0.10", "www.example.test"}, "192.0.2.1"},
	} {
		if got := dig(c.args...); got != c.want {
			t.Errorf("dig %s: %q, want %q", strings.Join(c.args, " "), got, c.want)
		}
	}
	for _, tcp := range []string{"+notcp", "+tcp"} {
		out, err := client.Exec(ctx, "unshare", "--mount", "--propagation", "private", "sh", "-c",
			"mount --bind "+resolv+" /etc/resolv.conf && dig +short +search "+tcp+" kubernetes.default")
		if err != nil || strings.TrimSpace(out) != "10.96.0.1" {
			t.Errorf("dig +search %s kubernetes.default: %q, %v", tcp, out, err)
		}
	}
}

// lockedBuilder is a strings.Builder a process writes to while a test
// reads it.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
