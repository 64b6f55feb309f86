package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/apiserver"
	"github.com/podnet/podnet/e2e/lab"
)

// kubeProxyBinary is kube-proxy of the lab's Kubernetes release: $PODNET_KUBE_PROXY,
// else the one make caches beside the API server.
func kubeProxyBinary(t *testing.T) string {
	t.Helper()
	p := os.Getenv("PODNET_KUBE_PROXY")
	if p == "" && os.Getenv("PODNET_KUBE_CACHE") != "" {
		p = filepath.Join(os.Getenv("PODNET_KUBE_CACHE"), "kube-proxy-v1.36.3")
	}
	if _, err := os.Stat(p); p == "" || err != nil {
		roottest.Unavailable(t, "kube-proxy binary: set $PODNET_KUBE_PROXY or $PODNET_KUBE_CACHE (make migrate's cache): %v", err)
	}
	return p
}

// takeOverKubeProxyConfig is kube-proxy's configuration on a lab node:
// iptables mode; health and metrics on ports of their own beside the
// proxyd already running there (as README's stage 1 has it the other way
// round); conntrack settings left to the host.
func takeOverKubeProxyConfig(kubeconfig, node string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %s}
hostnameOverride: %s
mode: iptables
clusterCIDR: 10.244.0.0/16
detectLocalMode: ClusterCIDR
healthzBindAddress: 0.0.0.0:10266
metricsBindAddress: 127.0.0.1:10259
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, kubeconfig, node)
}

// connectLoad connects to addr from a pod, one connect after the other,
// until stop is closed, and records each failure with its time.
type connectLoad struct {
	mu       sync.Mutex
	ok       int
	failures []string
	done     chan struct{}
}

func startConnectLoad(t *testing.T, p *lab.Pod, addr string, stop <-chan struct{}) *connectLoad {
	t.Helper()
	c, err := p.StartConnector("", addr)
	if err != nil {
		t.Fatal(err)
	}
	l := &connectLoad{done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer c.Close()
		for {
			select {
			case <-stop:
				return
			default:
			}
			at := time.Now()
			_, err := c.Connect(0)
			l.mu.Lock()
			if err != nil {
				l.failures = append(l.failures, at.UTC().Format("15:04:05.000")+" "+err.Error())
			} else {
				l.ok++
			}
			l.mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return l
}

func (l *connectLoad) counts() (int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok, append([]string(nil), l.failures...)
}

// kubeProxyChains lists the KUBE-* chains of a node's iptables but
// kubelet's own, as README's stage 2 wants them gone.
func kubeProxyChains(ctx context.Context, n *lab.Node) []string {
	out, _ := n.Exec(ctx, "iptables-save")
	var chains []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, ":KUBE-") && !strings.HasPrefix(l, ":KUBE-KUBELET-CANARY") && !strings.HasPrefix(l, ":KUBE-IPTABLES-HINT") {
			chains = append(chains, strings.Fields(l)[0])
		}
	}
	return chains
}

// TestKubeProxyTakeOver is README's stage 2 on one node of the namespace
// lab, under a load of connects to a ClusterIP from a pod of that node:
// kube-proxy (iptables mode, the real binary) serves the node's Services
// with proxyd beside it programming nothing (--proxy-mode=none, stage 1's
// ports); then kube-proxy stops (its rules stay) and proxyd restarts with
// --take-over-from-kube-proxy. No connect fails, before, during or after,
// and kube-proxy's chains are gone.
//
// Before and after, a second Service flaps between no endpoint and one:
// with proxyd serving, a connect either is refused (no endpoint) or gets
// through. kube-proxy's count of connects that did neither is logged: it
// writes the filter table (where its reject of an endpoint-less Service
// lives) and the nat table (its DNAT) in two commits, so when endpoints
// appear a SYN can pass between them neither rejected nor translated, and
// leaves the node for the Service's address ("network is unreachable" from
// the lab's router). proxyd marks for rejection in the nat table, in the
// same commit as the DNAT that replaces it.
func TestKubeProxyTakeOver(t *testing.T) {
	kubeProxy := kubeProxyBinary(t)
	k := startKubeLab(t)
	ctx := t.Context()
	node := k.l.Node("node1")

	var webs []*lab.Pod
	for _, n := range []string{"node2", "node3"} {
		w := k.addPod(ctx, n, "web"+strings.TrimPrefix(n, "node"))
		if _, err := w.StartEcho(lab.EchoOptions{TCP: []string{":8080"}}); err != nil {
			t.Fatal(err)
		}
		webs = append(webs, w)
	}
	const vip, flapVIP = "10.96.100.20:80", "10.96.100.21:80"
	k.createService(ctx, kubeLabNS, "web", "10.96.100.20", []svcPortSpec{{"http", corev1.ProtocolTCP, 80, 8080}}, webs...)
	k.createService(ctx, kubeLabNS, "flap", "10.96.100.21", []svcPortSpec{{"http", corev1.ProtocolTCP, 80, 8080}})
	waitUntil(t, 10*time.Second, func() bool { return k.reaches(vip, "web2") || k.reaches(vip, "web3") }, "the Service through podnet")

	kp := k.kubeProxyBeside(ctx, kubeProxy, node)
	byKubeProxy := k.flap(ctx, flapVIP, webs[0])
	t.Logf("kube-proxy, endpoints of a Service flapping none ↔ one: %v", byKubeProxy)

	stop := make(chan struct{})
	load := startConnectLoad(t, k.client, vip, stop)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-load.done
	}()
	time.Sleep(2 * time.Second)
	before, fails := load.counts()
	if before == 0 || len(fails) > 0 {
		t.Fatalf("through kube-proxy alone: %d connects, failures %q", before, fails)
	}

	// Stage 2: kube-proxy stops, its rules stay; proxyd takes over.
	if err := kp.Stop(); err != nil {
		t.Logf("kube-proxy: %v", err)
	}
	began := time.Now()
	k.restartProxyd(ctx, "node1", "--take-over-from-kube-proxy")
	waitUntil(t, 30*time.Second, func() bool { return len(kubeProxyChains(ctx, node)) == 0 }, "kube-proxy's chains gone from node1")
	tookOver := time.Since(began)
	time.Sleep(2 * time.Second)
	close(stop)
	<-load.done
	total, fails := load.counts()
	t.Logf("%d connects, %d failed; kube-proxy's chains gone %v after proxyd's restart", total, len(fails), tookOver.Round(time.Millisecond))
	if len(fails) > 0 {
		t.Errorf("connects failed across the take-over:\n%s\nproxyd:\n%s", strings.Join(fails, "\n"), k.proxyd["node1"].Output())
	}
	if total <= before {
		t.Errorf("no connect during the take-over (%d before, %d in all)", before, total)
	}

	byProxyd := k.flap(ctx, flapVIP, webs[0])
	t.Logf("proxyd, endpoints of a Service flapping none ↔ one: %v", byProxyd)
	if byProxyd.ok == 0 || byProxyd.refused == 0 || len(byProxyd.other) > 0 {
		t.Errorf("proxyd: want connects through and refused, nothing else: %v", byProxyd)
	}
}

// kubeProxyBeside starts kube-proxy on node beside its proxyd, then
// restarts proxyd as README's stage 1 runs it: nothing programmed (its
// own rules removed), so kube-proxy's rules serve.
func (k *kubeLab) kubeProxyBeside(ctx context.Context, kubeProxy string, node *lab.Node) *lab.Proc {
	t := k.t
	t.Helper()
	kc := filepath.Join(node.Dir, "kube-proxy.kubeconfig")
	if err := k.srv.WriteKubeconfig(kc, apiserver.Admin, kubeAPIAddr.Addr()); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(node.Dir, "kube-proxy.conf")
	if err := os.WriteFile(cfg, []byte(takeOverKubeProxyConfig(kc, node.Name)), 0o644); err != nil {
		t.Fatal(err)
	}
	kp, err := node.Start("kube-proxy", kubeProxy, "--config="+cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, func() bool {
		out, _ := node.Exec(ctx, "iptables-save", "-t", "nat")
		return strings.Contains(out, "default/web:http cluster IP")
	}, "kube-proxy's rules for the Service on "+node.Name)
	k.restartProxyd(ctx, node.Name, "--proxy-mode=none", "--healthz-bind-address=0.0.0.0:10356", "--metrics-bind-address=127.0.0.1:10349")
	waitUntil(t, 10*time.Second, func() bool {
		out, _ := node.Exec(ctx, "iptables-save", "-t", "nat")
		return !strings.Contains(out, "PODSVC-SERVICES")
	}, "podnet's Service rules gone from "+node.Name)
	return kp
}

// flapOutcome counts the connects of flap: through, refused, and the
// others' errors.
type flapOutcome struct {
	ok, refused int
	other       []string
}

func (o flapOutcome) String() string {
	return fmt.Sprintf("%d through, %d refused, %d other %q", o.ok, o.refused, len(o.other), o.other)
}

// flapCycles is how often flap takes the Service's endpoint away and
// gives it back: each time a none-to-one change in the proxy's rules
// (their sync period is a second, each phase longer).
const flapCycles = 12

// flap connects to vip from the client pod while the Service flap's
// EndpointSlice alternates between no endpoint and web, flapCycles times.
func (k *kubeLab) flap(ctx context.Context, vip string, web *lab.Pod) flapOutcome {
	stop := make(chan struct{})
	load := startConnectLoad(k.t, k.client, vip, stop)
	for range flapCycles {
		k.setEndpoints(ctx, "flap")
		time.Sleep(1200 * time.Millisecond)
		k.setEndpoints(ctx, "flap", web)
		time.Sleep(1200 * time.Millisecond)
	}
	close(stop)
	<-load.done
	var o flapOutcome
	var fails []string
	o.ok, fails = load.counts()
	for _, f := range fails {
		if strings.HasSuffix(f, "connection refused") {
			o.refused++
		} else {
			o.other = append(o.other, f)
		}
	}
	return o
}

// setEndpoints makes the EndpointSlice of createService's Service name
// hold pods, ready, as the endpointslice controller would.
func (k *kubeLab) setEndpoints(ctx context.Context, name string, pods ...*lab.Pod) {
	k.t.Helper()
	slices := k.admin.DiscoveryV1().EndpointSlices(kubeLabNS)
	s, err := slices.Get(ctx, name+"-abcde", metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	s.Endpoints = nil
	for _, p := range pods {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.IP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true)}, NodeName: new(p.Node.Name)})
	}
	if _, err := slices.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

// restartProxyd stops a node's proxyd and starts it again with the lab's
// arguments and extra (the last of a repeated flag wins).
func (k *kubeLab) restartProxyd(ctx context.Context, node string, extra ...string) {
	k.t.Helper()
	if err := k.proxyd[node].Stop(); err != nil {
		k.t.Logf("proxyd on %s: %v", node, err)
	}
	p, err := k.l.Node(node).StartProxyd(ctx, append(append([]string(nil), k.proxydArgs[node]...), extra...)...)
	if err != nil {
		k.t.Fatal(err)
	}
	k.proxyd[node] = p
}
