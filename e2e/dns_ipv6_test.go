package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
)

// dnsIPv6State is a dual-stack cluster's DNS objects: an IPv6-only
// ClusterIP Service and a headless Service with an IPv6 EndpointSlice.
const dnsIPv6State = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: ns6}
- apiVersion: v1
  kind: Service
  metadata: {name: web6, namespace: ns6}
  spec:
    clusterIP: fd00:10:96::80
    clusterIPs: [fd00:10:96::80]
    ipFamilies: [IPv6]
    ports: [{name: http, port: 80, protocol: TCP}]
- apiVersion: v1
  kind: Service
  metadata: {name: db, namespace: ns6}
  spec:
    clusterIP: None
    ipFamilies: [IPv4, IPv6]
    ports: [{name: pg, port: 5432, protocol: TCP}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: db-v6
    namespace: ns6
    labels: {kubernetes.io/service-name: db}
  addressType: IPv6
  ports: [{name: pg, port: 5432, protocol: TCP}]
  endpoints:
  - addresses: ["fd00:10:244:1::20"]
    hostname: db-0
    conditions: {ready: true}
  - addresses: ["fd00:10:244:2::21"]
    conditions: {ready: true}
`

// TestDnsdOverIPv6 runs the dnsd binary in a lab pod's namespace on IPv6
// only: it listens on a ULA address of the pod (not every address: the
// upstream is on port 53 of the same namespace), forwards to a dnsmasq on another ULA address of the pod, and dig asks it
// over IPv6, UDP and TCP, for AAAA of an IPv6 cluster IP and of headless
// endpoints, an ip6.arpa PTR, an IPv6 pod record and a forwarded name.
func TestDnsdOverIPv6(t *testing.T) {
	roottest.Require(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	l := lab.Start(t, lab.Options{Nodes: lab.DefaultNodes()[:1]})
	if err := l.Nodes[0].WriteNodeConfig(); err != nil { // no proxyd: the pod needs only its namespace
		t.Fatal(err)
	}
	pod, err := l.Nodes[0].AddPod(ctx, "dns6")
	if err != nil {
		t.Fatal(err)
	}
	const dnsdAddr, upAddr = "fd00:53::1", "fd00:53::2"
	for _, a := range []string{dnsdAddr, upAddr} {
		if out, err := pod.Exec(ctx, "ip", "-6", "addr", "add", a+"/128", "dev", "lo"); err != nil {
			t.Fatalf("ip -6 addr add %s: %v %s", a, err, out)
		}
	}
	up, err := pod.Start("dnsmasq", roottest.Tool(t, "dnsmasq", "dnsmasq-base"), "--no-daemon", "--no-resolv", "--no-hosts",
		"--bind-interfaces", "--listen-address="+upAddr, "--port=53", "--address=/example.test/2001:db8::80", "--user=root", "--pid-file=")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WriteState("dns6.yaml", dnsIPv6State); err != nil {
		t.Fatal(err)
	}
	dnsd, err := pod.Start("dnsd", filepath.Join(l.BinDir, "dnsd"), "--state-dir", l.StateDir(),
		"--listen", "["+dnsdAddr+"]:53", "--service-cluster-ip-range", "10.96.0.0/12,fd00:10:96::/112", "--upstream", "["+upAddr+"]:53", "--dns-service-ip", "fd00:10:96::a")
	if err != nil {
		t.Fatal(err)
	}
	dig := func(args ...string) string {
		out, err := pod.Exec(ctx, append([]string{"dig", "-6", "+short", "+time=1", "+tries=2", "@" + dnsdAddr}, args...)...)
		if err != nil {
			return "error: " + err.Error()
		}
		return strings.TrimSpace(out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for dig("AAAA", "web6.ns6.svc.cluster.local") != "fd00:10:96::80" {
		if time.Now().After(deadline) {
			t.Fatalf("no answer over IPv6 after 30s\ndnsd:\n%s\ndnsmasq:\n%s", dnsd.Output(), up.Output())
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, proto := range []string{"+notcp", "+tcp"} {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"AAAA", "web6.ns6.svc.cluster.local"}, "fd00:10:96::80"},
			{[]string{"AAAA", "db-0.db.ns6.svc.cluster.local"}, "fd00:10:244:1::20"},
			{[]string{"AAAA", "fd00-10-244-2--21.db.ns6.svc.cluster.local"}, "fd00:10:244:2::21"},
			{[]string{"AAAA", "db.ns6.svc.cluster.local"}, "fd00:10:244:1::20\nfd00:10:244:2::21"},
			{[]string{"-x", "fd00:10:96::80"}, "web6.ns6.svc.cluster.local."},
			{[]string{"-x", "fd00:10:244:2::21"}, "fd00-10-244-2--21.db.ns6.svc.cluster.local."},
			{[]string{"AAAA", "fd00-10-244-7--9.ns6.pod.cluster.local"}, "fd00:10:244:7::9"},
			{[]string{"AAAA", "www.example.test"}, "2001:db8::80"},
		} {
			if got := dig(append([]string{proto}, c.args...)...); got != c.want {
				t.Errorf("dig -6 %s %s: %q, want %q", proto, strings.Join(c.args, " "), got, c.want)
			}
		}
	}
}
