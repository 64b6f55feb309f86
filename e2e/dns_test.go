package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/podnet/podnet/dataplane/metricstest"
	"github.com/podnet/podnet/dataplane/roottest"
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

func dnsLoopbackPort(t *testing.T) int {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	return pc.LocalAddr().(*net.UDPAddr).Port
}

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

// TestDnsdProcess runs the dnsd binary on loopback ports (no root needed)
// with a state directory and dnsmasq as its upstream: readiness, cluster
// and forwarded answers over UDP and TCP, a state change picked up while
// running, metrics, and a clean exit on SIGTERM.
func TestDnsdProcess(t *testing.T) {
	bin := dnsdBinary(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "cluster.yaml"), []byte(dnsTestState), 0o644); err != nil {
		t.Fatal(err)
	}
	upPort := dnsLoopbackPort(t)
	dm := exec.Command("dnsmasq", "--no-daemon", "--no-resolv", "--no-hosts", "--bind-interfaces", "--listen-address=127.0.0.1",
		fmt.Sprintf("--port=%d", upPort), "--address=/example.test/192.0.2.1", "--user="+dnsUserName(), "--pid-file=")
	dm.Stderr = io.Discard
	if err := dm.Start(); err != nil {
		t.Skipf("dnsmasq: %v (scripts/deps.sh installs dnsmasq-base)", err)
	}
	t.Cleanup(func() { dm.Process.Kill(); dm.Wait() })

	dnsPort, metricsPort, healthPort, readyPort := dnsLoopbackPort(t), dnsLoopbackPort(t), dnsLoopbackPort(t), dnsLoopbackPort(t)
	cmd := exec.Command(bin,
		"--state-dir", state,
		"--listen", fmt.Sprintf("127.0.0.1:%d", dnsPort),
		"--upstream", fmt.Sprintf("127.0.0.1:%d", upPort),
		"--metrics-address", fmt.Sprintf("127.0.0.1:%d", metricsPort),
		"--health-address", fmt.Sprintf("127.0.0.1:%d", healthPort),
		"--ready-address", fmt.Sprintf("127.0.0.1:%d", readyPort),
	)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
		}
	})

	get := func(port int, path string) (int, string) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _ := get(readyPort, "/ready"); code == http.StatusOK {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("dnsd exited: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dnsd not ready after 10s:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	deadline = time.Now().Add(10 * time.Second)
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
	state := dnsTestState + fmt.Sprintf(`- apiVersion: discovery.k8s.io/v1
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
  - addresses: [%s]
    conditions: {ready: true}
`, dnsPod.IP)
	if err := l.WriteState("dns.yaml", state); err != nil {
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
