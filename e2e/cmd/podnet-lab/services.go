package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/podnet/podnet/e2e/lab"
)

// The demo's Services, in the state directory as a control plane would
// write them.
const (
	webVIP     = "10.96.0.20"
	webPort    = 80
	webNodePrt = 30080
	echoPort   = 8080
	kubeDNSVIP = "10.96.0.10"
	apiVIP     = "10.96.0.1"
)

// serviceYAML is a Service with its EndpointSlice, ready endpoints on the
// given pods.
func serviceYAML(namespace, name, svcType, clusterIP string, ports []svcPort, pods []*lab.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Service\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  type: %s\n  clusterIP: %s\n  clusterIPs: [%s]\n  ports:\n",
		name, namespace, svcType, clusterIP, clusterIP)
	for _, p := range ports {
		fmt.Fprintf(&b, "  - {name: %s, protocol: %s, port: %d, targetPort: %d", p.name, p.proto, p.port, p.target)
		if p.nodePort != 0 {
			fmt.Fprintf(&b, ", nodePort: %d", p.nodePort)
		}
		b.WriteString("}\n")
	}
	fmt.Fprintf(&b, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: %s-1\n  namespace: %s\n  labels: {kubernetes.io/service-name: %s}\naddressType: IPv4\nports:\n",
		name, namespace, name)
	for _, p := range ports {
		fmt.Fprintf(&b, "- {name: %s, protocol: %s, port: %d}\n", p.name, p.proto, p.target)
	}
	if len(pods) == 0 {
		b.WriteString("endpoints: []\n")
		return b.String()
	}
	b.WriteString("endpoints:\n")
	for _, p := range pods {
		fmt.Fprintf(&b, "- addresses: [%s]\n  conditions: {ready: true}\n  nodeName: %s\n  zone: %s\n  targetRef: {kind: Pod, name: %s, namespace: %s}\n",
			p.IP, p.Node.Name, p.Node.Zone, p.Name, namespace)
	}
	return b.String()
}

type svcPort struct {
	name     string
	proto    string
	port     int
	target   int
	nodePort int
}

// service runs an HTTP echo server in the pods on node2 and node3, puts a
// NodePort Service in front of them, and asks it: 20 times from the pod on
// node1 through the ClusterIP (both endpoints must answer), and once from
// the outside through node4's NodePort.
func service(ctx context.Context, d *demo) error {
	l := d.lab
	if !d.proxyd || len(d.pods) < 5 {
		return skipError{"needs proxyd and the pods of the steps before"}
	}
	var backends []*lab.Pod
	for _, p := range d.pods {
		if p.Name == "a" && (p.Node.Name == "node2" || p.Node.Name == "node3") {
			backends = append(backends, p)
		}
	}
	for _, p := range backends {
		if _, err := p.StartEcho(lab.EchoOptions{Name: p.Node.Name + "/" + p.Name, HTTP: []string{fmt.Sprintf(":%d", echoPort)}}); err != nil {
			return err
		}
	}
	ports := []svcPort{{"http", "TCP", webPort, echoPort, webNodePrt}}
	if err := l.WriteState("web.yaml", serviceYAML("default", "web", "NodePort", webVIP, ports, backends)); err != nil {
		return err
	}
	vip := fmt.Sprintf("%s:%d", webVIP, webPort)
	fmt.Fprintf(d.out, "  Service default/web: %s (NodePort %d) → %s, %s port %d\n", vip, webNodePrt, backends[0].IP, backends[1].IP, echoPort)
	d.backends = backends
	return askService(ctx, d)
}

// switchMode restarts proxyd on every node in the other proxy mode (which
// removes the first mode's rules or maps) and asks the Service again.
func switchMode(ctx context.Context, d *demo) error {
	if len(d.backends) == 0 || len(d.procs) == 0 {
		return skipError{"needs the Service of the step before"}
	}
	mode := map[string]string{"iptables": "ebpf", "ebpf": "iptables"}[d.proxyMode]
	for _, p := range d.procs {
		if err := p.Stop(); err != nil {
			return err
		}
	}
	var err error
	if d.procs, err = startProxydEverywhere(ctx, d.lab, mode); err != nil {
		return err
	}
	// The new mode is in place once the old one's state is gone: ebpf
	// mode removes the Service rules from iptables, iptables mode writes
	// them back.
	node1 := d.lab.Nodes[0]
	var rules int
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := node1.Exec(ctx, "iptables-save")
		if err != nil {
			return err
		}
		rules = strings.Count(out, "-A PODSVC")
		if (rules == 0) == (mode == "ebpf") {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proxyd --proxy-mode %s: node1 still holds %d Service rules in iptables after 10s", mode, rules)
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Fprintf(d.out, "  proxyd --proxy-mode %s on every node; node1's iptables hold %d Service rules\n", mode, rules)
	if err := askService(ctx, d); err != nil {
		return err
	}
	d.proxyMode = mode
	return nil
}

// askService asks the Service 20 times from the pod on node1 through the
// ClusterIP (both endpoints must answer) and once from the outside through
// node4's NodePort.
func askService(ctx context.Context, d *demo) error {
	l, client, backends := d.lab, d.pods[0], d.backends
	vip := fmt.Sprintf("%s:%d", webVIP, webPort)
	// proxyd sees the new file within its minimum sync period.
	if _, err := untilAnswer(ctx, 10*time.Second, func() (string, error) { return client.Probe(ctx, "http", vip) }); err != nil {
		return fmt.Errorf("%s → %s: %w", client.Node.Name+"/"+client.Name, vip, err)
	}
	count := map[string]int{}
	const requests = 20
	for range requests {
		answer, err := client.Probe(ctx, "http", vip)
		if err != nil {
			return fmt.Errorf("%s/%s → %s: %w", client.Node.Name, client.Name, vip, err)
		}
		server, seen, _ := strings.Cut(answer, " ")
		count[server]++
		if host, _, _ := strings.Cut(seen, ":"); host != client.IP.String() {
			return fmt.Errorf("%s saw the client as %s, want the pod's own address %s", server, host, client.IP)
		}
	}
	var spread []string
	for _, p := range backends {
		spread = append(spread, fmt.Sprintf("%s ×%d", p.Node.Name+"/"+p.Name, count[p.Node.Name+"/"+p.Name]))
	}
	fmt.Fprintf(d.out, "  %s/%s → http://%s, %d requests: %s\n", client.Node.Name, client.Name, vip, requests, strings.Join(spread, ", "))
	for _, p := range backends {
		if count[p.Node.Name+"/"+p.Name] == 0 {
			return fmt.Errorf("endpoint %s/%s never answered %d requests to %s", p.Node.Name, p.Name, requests, vip)
		}
	}

	node4 := l.Node("node4")
	np := netip.AddrPortFrom(node4.IP, webNodePrt).String()
	answer, err := untilAnswer(ctx, 5*time.Second, func() (string, error) { return l.OutsideHost.Probe(ctx, "http", np) })
	if err != nil {
		return fmt.Errorf("outside → %s: %w", np, err)
	}
	fmt.Fprintf(d.out, "  outside → http://%s (NodePort on node4): answered by %s\n", np, answer)
	return nil
}

// clusterDNS runs dnsd in a pod on node1 behind the kube-dns VIP, with a
// dnsmasq in the outside namespace as its upstream, and resolves from the
// pod on node4 with a ClusterFirst resolv.conf.
func clusterDNS(ctx context.Context, d *demo) error {
	if _, err := os.Stat(filepath.Join(d.lab.BinDir, "dnsd")); err != nil {
		return skipError{fmt.Sprintf("no dnsd binary (%v)", err)}
	}
	if !d.proxyd || len(d.pods) < 5 {
		return skipError{"needs proxyd and the pods of the steps before"}
	}
	upstream, err := startClusterDNS(ctx, d)
	if err != nil {
		return err
	}
	return resolveFromPod(ctx, d, upstream != "")
}

// startClusterDNS starts the upstream (when dnsmasq is installed) and dnsd
// behind kube-dns, and returns the upstream's address ("" for none).
func startClusterDNS(ctx context.Context, d *demo) (upstream string, err error) {
	l := d.lab
	dnsd := filepath.Join(l.BinDir, "dnsd")
	if _, err := exec.LookPath("dnsmasq"); err == nil {
		// The internet's DNS, played by the outside namespace.
		if _, err := l.OutsideHost.Start("dnsmasq", "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null",
			"--no-resolv", "--no-hosts", "--pid-file=", "--bind-interfaces", "--listen-address="+l.OutsideIP.String(),
			"--address=/example.com/203.0.113.80"); err != nil {
			return "", err
		}
		upstream = l.OutsideIP.String() + ":53"
	}

	node1 := l.Nodes[0]
	dnsPod, err := d.addPod(ctx, node1, "dns")
	if err != nil {
		return "", err
	}
	args := []string{dnsd, "--state-dir", l.StateDir(), "--listen", ":53"} // both families: the lab may be dual-stack
	if upstream != "" {
		args = append(args, "--upstream", upstream)
	} else {
		// Never the host's resolver: an empty resolv.conf means no upstream.
		if err := dnsPod.SetResolvConf(""); err != nil {
			return "", err
		}
	}
	if _, err := dnsPod.Start("dnsd", args...); err != nil {
		return "", err
	}
	dnsPorts := []svcPort{{"dns", "UDP", 53, 53, 0}, {"dns-tcp", "TCP", 53, 53, 0}}
	if err := l.WriteState("kube-dns.yaml", serviceYAML("kube-system", "kube-dns", "ClusterIP", kubeDNSVIP, dnsPorts, []*lab.Pod{dnsPod})); err != nil {
		return "", err
	}
	apiPorts := []svcPort{{"https", "TCP", 443, 6443, 0}}
	if err := l.WriteState("kubernetes.yaml", serviceYAML("default", "kubernetes", "ClusterIP", apiVIP, apiPorts, nil)); err != nil {
		return "", err
	}
	fmt.Fprintf(d.out, "  dnsd in pod %s/%s (%s) behind Service kube-system/kube-dns %s", node1.Name, dnsPod.Name, dnsPod.IP, kubeDNSVIP)
	if upstream != "" {
		fmt.Fprintf(d.out, ", forwarding to dnsmasq on the outside (%s)", upstream)
	}
	fmt.Fprintln(d.out)

	return upstream, nil
}

// resolveFromPod resolves from the pod on node4 with a ClusterFirst
// resolv.conf: cluster names, a search-path name, TCP, and a forwarded name
// when there is an upstream.
func resolveFromPod(ctx context.Context, d *demo, forwarded bool) error {
	client := d.pods[slices.IndexFunc(d.pods, func(p *lab.Pod) bool { return p.Node.Name == "node4" })]
	const resolv = "nameserver " + kubeDNSVIP + "\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
	if err := client.SetResolvConf(resolv); err != nil {
		return err
	}
	queries := [][]string{
		{"dig", "+short", "@" + kubeDNSVIP, "kubernetes.default"},
		{"dig", "+short", "+search", "web"},
		{"dig", "+short", "+tcp", "web.default.svc.cluster.local"},
	}
	wants := []string{apiVIP, webVIP, webVIP}
	if forwarded {
		queries = append(queries, []string{"dig", "+short", "example.com"})
		wants = append(wants, "203.0.113.80")
	}
	for i, q := range queries {
		q = append(q, "+time=1", "+tries=1")
		answer, err := untilAnswer(ctx, 10*time.Second, func() (string, error) {
			out, err := client.Exec(ctx, q...)
			if err == nil && strings.TrimSpace(out) == "" {
				err = fmt.Errorf("empty answer")
			}
			return strings.TrimSpace(out), err
		})
		if err != nil {
			return fmt.Errorf("%s/%s: %s: %w", client.Node.Name, client.Name, strings.Join(queries[i], " "), err)
		}
		mark := "✓"
		if answer != wants[i] {
			mark = "✗"
		}
		fmt.Fprintf(d.out, "  %s %s/%s$ %-52s → %s\n", mark, client.Node.Name, client.Name, strings.Join(queries[i], " "), answer)
		if answer != wants[i] {
			return fmt.Errorf("%s answered %q, want %s", strings.Join(queries[i], " "), answer, wants[i])
		}
	}
	return nil
}

// untilAnswer calls try every 100 ms until it succeeds or timeout passes
// (bounded: at most timeout/100ms tries), and returns its last result.
func untilAnswer(ctx context.Context, timeout time.Duration, try func() (string, error)) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		answer, err := try()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return answer, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
