package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	mdns "github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/podnet/podnet/dataplane/nodestatus"
	"github.com/podnet/podnet/dataplane/podcidr"
	"github.com/podnet/podnet/e2e/apiserver"
	"github.com/podnet/podnet/e2e/lab"
)

// kubeLab is the four-node lab with proxyd on every node and dnsd in a pod,
// all reading the cluster from the real API server.
type kubeLab struct {
	t     *testing.T
	l     *lab.Lab
	srv   *apiserver.Server
	admin kubernetes.Interface
	dnsd  *lab.Proc
	// dnsPod runs dnsd.
	dnsPod *lab.Pod
	// client is a pod on node1 that probes and resolves.
	client *lab.Pod
	pods   map[string]*lab.Pod
	// proxyd and its arguments, by node name
	proxyd     map[string]*lab.Proc
	proxydArgs map[string][]string
}

const kubeLabNS = "default"

func startKubeLab(t *testing.T) *kubeLab {
	cp, srv := kubeAPI(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	l := lab.Start(t, lab.Options{})
	detach, err := l.Attach(cp, kubeAPIAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := detach(); err != nil {
			t.Errorf("detach control plane: %v", err)
		}
	})
	admin, err := srv.Client(apiserver.Admin)
	if err != nil {
		t.Fatal(err)
	}
	k := &kubeLab{t: t, l: l, srv: srv, admin: admin, pods: map[string]*lab.Pod{}, proxyd: map[string]*lab.Proc{}, proxydArgs: map[string][]string{}}

	// The Nodes, as kubelets would register them; node4 without a podCIDR:
	// its proxyd claims one.
	for _, n := range l.Nodes {
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{
				"kubernetes.io/hostname": n.Name, "topology.kubernetes.io/zone": n.Zone,
			}},
		}
		if n.Name != "node4" {
			node.Spec.PodCIDR, node.Spec.PodCIDRs = n.PodCIDR.String(), []string{n.PodCIDR.String()}
		}
		node = createNode(t, admin, n.Name, node.Spec.PodCIDR)
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IP.String()}, {Type: corev1.NodeHostName, Address: n.Name}}
		node.Status.Conditions = []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastTransitionTime: metav1.Now()},
			{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionTrue, Reason: "NoRouteCreated", LastTransitionTime: metav1.Now()},
		}
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = admin.CoordinationV1().Leases(podcidr.DefaultNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: podcidr.LabelClaim})
	})

	var wg sync.WaitGroup
	errs := make([]error, len(l.Nodes))
	procs := make([]*lab.Proc, len(l.Nodes))
	for i, n := range l.Nodes {
		kc := filepath.Join(n.Dir, "kubeconfig")
		if err := srv.WriteKubeconfig(kc, apiserver.NodeSA, kubeAPIAddr.Addr()); err != nil {
			t.Fatal(err)
		}
		args := []string{"--state-dir=", "--kubeconfig", kc}
		if n.Name == "node4" {
			args = append(args, "--allocate-node-cidrs")
		}
		k.proxydArgs[n.Name] = args
		wg.Go(func() { procs[i], errs[i] = n.StartProxyd(ctx, args...) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
		k.proxyd[l.Nodes[i].Name] = procs[i]
	}

	k.client = k.addPod(ctx, "node1", "client")
	dnsPod := k.addPod(ctx, "node3", "dnsd")
	k.dnsPod = dnsPod
	kc := filepath.Join(l.WorkDir, "dnsd.kubeconfig")
	if err := srv.WriteKubeconfig(kc, apiserver.DNSSA, kubeAPIAddr.Addr()); err != nil {
		t.Fatal(err)
	}
	// The upstream is never asked: these tests resolve cluster names only.
	k.dnsd, err = dnsPod.Start("dnsd", filepath.Join(l.BinDir, "dnsd"), "--kubeconfig", kc, "--upstream", l.OutsideIP.String()+":53")
	if err != nil {
		t.Fatal(err)
	}
	k.createService(ctx, "kube-system", "kube-dns", "10.96.0.10", []svcPortSpec{{"dns", corev1.ProtocolUDP, 53, 53}, {"dns-tcp", corev1.ProtocolTCP, 53, 53}}, dnsPod)
	// The kubernetes Service is the API server's own, pointing at
	// 192.168.10.2:6443.
	waitUntil(t, 30*time.Second, func() bool {
		addrs, _, err := lookupIn(k.client.NSPath(), "kubernetes.default.svc.cluster.local.")
		return err == nil && len(addrs) == 1 && addrs[0] == "10.96.0.1"
	}, "kubernetes.default through 10.96.0.10")
	return k
}

func (k *kubeLab) addPod(ctx context.Context, node, name string) *lab.Pod {
	k.t.Helper()
	p, err := k.l.Node(node).AddPod(ctx, name)
	if err != nil {
		k.t.Fatal(err)
	}
	k.pods[name] = p
	return p
}

type svcPortSpec struct {
	name   string
	proto  corev1.Protocol
	port   int32
	target int32
}

// createService creates a Service with a fixed ClusterIP and, as the
// endpointslice controller would, its EndpointSlice of the given pods.
func (k *kubeLab) createService(ctx context.Context, namespace, name, clusterIP string, ports []svcPortSpec, pods ...*lab.Pod) {
	k.t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       corev1.ServiceSpec{ClusterIP: clusterIP, Selector: map[string]string{"app": name}},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name + "-abcde", Namespace: namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: name},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.name, Protocol: p.proto, Port: p.port, TargetPort: intstr.FromInt32(p.target)})
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: new(p.name), Protocol: new(p.proto), Port: new(p.target)})
	}
	for _, p := range pods {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.IP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true)},
			NodeName:   new(p.Node.Name),
		})
	}
	if _, err := k.admin.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		k.t.Fatalf("create service %s/%s: %v", namespace, name, err)
	}
	if _, err := k.admin.DiscoveryV1().EndpointSlices(namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		k.t.Fatalf("create endpointslice of %s/%s: %v", namespace, name, err)
	}
	// The API server outlives the test.
	k.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = k.admin.DiscoveryV1().EndpointSlices(namespace).Delete(ctx, slice.Name, metav1.DeleteOptions{})
		_ = k.admin.CoreV1().Services(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	})
}

func (k *kubeLab) deleteService(ctx context.Context, namespace, name string) {
	k.t.Helper()
	if err := k.admin.DiscoveryV1().EndpointSlices(namespace).Delete(ctx, name+"-abcde", metav1.DeleteOptions{}); err != nil {
		k.t.Fatal(err)
	}
	if err := k.admin.CoreV1().Services(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

// lookupIn asks 10.96.0.10 for the A records of name from inside the
// namespace at nsPath.
func lookupIn(nsPath, name string) ([]string, int, error) {
	var addrs []string
	rcode := -1
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		c := &mdns.Client{Timeout: 500 * time.Millisecond}
		m := new(mdns.Msg).SetQuestion(name, mdns.TypeA)
		r, _, err := c.Exchange(m, "10.96.0.10:53")
		if err != nil {
			return err
		}
		rcode = r.Rcode
		for _, rr := range r.Answer {
			if a, ok := rr.(*mdns.A); ok {
				addrs = append(addrs, a.A.String())
			}
		}
		return nil
	})
	return addrs, rcode, err
}

// within polls cond every 20 ms and returns how long it took to hold, or
// fails the test after limit×5 (so a miss still shows the real delay).
func within(t *testing.T, limit time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > 5*limit {
			t.Fatalf("%s: not after %v", what, 5*limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	d := time.Since(start)
	if d > limit {
		t.Errorf("%s after %v, want within %v", what, d.Round(time.Millisecond), limit)
	} else {
		t.Logf("%s after %v", what, d.Round(time.Millisecond))
	}
	return d
}

func (k *kubeLab) reaches(addr, want string) bool {
	return k.reachesWithin(addr, want, 300*time.Millisecond) == nil
}

// reachesWithin is reaches with a timeout of the caller's, saying what
// went wrong.
func (k *kubeLab) reachesWithin(addr, want string, timeout time.Duration) error {
	var out string
	err := ns.WithNetNSPath(k.client.NSPath(), func(ns.NetNS) error {
		var err error
		out, err = lab.Probe(context.Background(), "tcp", addr, timeout)
		return err
	})
	if name, _, _ := strings.Cut(out, " "); err == nil && name != want {
		err = fmt.Errorf("answered by %q, want %s", name, want)
	}
	return err
}

// livenessProbe is the httpGet liveness probe of proxyd's DaemonSet.
type livenessProbe struct {
	path   string
	port   int64
	window time.Duration // how long the probe may fail before a restart
}

// proxydLivenessProbe reads proxyd's liveness probe from deploy/.
func proxydLivenessProbe(t *testing.T) livenessProbe {
	t.Helper()
	objs, err := manifests()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "DaemonSet" {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range cs {
			c, _ := c.(map[string]any)
			if c["name"] != "proxyd" {
				continue
			}
			lp, ok, _ := unstructured.NestedMap(c, "livenessProbe")
			if !ok || lp["httpGet"] == nil {
				t.Fatal("proxyd's DaemonSet has no liveness probe")
			}
			// Numbers decode as float64 (YAML through JSON).
			num := func(def float64, fields ...string) int64 {
				v, ok, _ := unstructured.NestedFieldNoCopy(lp, fields...)
				if f, isNum := v.(float64); ok && isNum {
					return int64(f)
				}
				if i, isInt := v.(int64); ok && isInt {
					return i
				}
				return int64(def)
			}
			path, _, _ := unstructured.NestedString(lp, "httpGet", "path")
			return livenessProbe{path: path, port: num(0, "httpGet", "port"),
				window: time.Duration(num(10, "periodSeconds")*num(3, "failureThreshold")) * time.Second}
		}
	}
	t.Fatal("no DaemonSet in deploy/ runs a container named proxyd")
	return livenessProbe{}
}

// healthz asks proxyd's /healthz on the node.
func (k *kubeLab) healthz(node string) (int, string) {
	return httpGetIn(k.l.Node(node).NSPath(), "127.0.0.1:10256", "/healthz")
}

// httpGetIn GETs path from addr inside the namespace at nsPath. The socket
// is made on the namespace's thread (net/http would dial from another
// goroutine, in this process's own namespace).
func httpGetIn(nsPath, addr, path string) (int, string) {
	var c net.Conn
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", addr, time.Second)
		return err
	})
	if err != nil {
		return 0, err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err := req.Write(c); err != nil {
		return 0, err.Error()
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (k *kubeLab) resolves(name, want string) bool {
	addrs, _, err := lookupIn(k.client.NSPath(), name)
	return err == nil && len(addrs) == 1 && addrs[0] == want
}

func (k *kubeLab) nxdomain(name string) bool {
	_, rcode, err := lookupIn(k.client.NSPath(), name)
	return err == nil && rcode == mdns.RcodeNameError
}

func TestKubeLab(t *testing.T) {
	k := startKubeLab(t)
	ctx := t.Context()

	t.Run("node4 claimed a podCIDR and every node reports its network", func(t *testing.T) {
		n4, err := k.admin.CoreV1().Nodes().Get(ctx, "node4", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := netip.ParsePrefix(n4.Spec.PodCIDR)
		if err != nil || !lab.ClusterCIDR.Contains(p.Addr()) || p.Bits() != 24 {
			t.Fatalf("node4 podCIDR %q: want a /24 of %v", n4.Spec.PodCIDR, lab.ClusterCIDR)
		}
		for _, n := range k.l.Nodes[:3] {
			if p.Overlaps(n.PodCIDR) {
				t.Errorf("node4 claimed %v, which overlaps %s's %v", p, n.Name, n.PodCIDR)
			}
		}
		for _, n := range k.l.Nodes {
			waitUntil(t, 10*time.Second, func() bool {
				node, err := k.admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
				if err != nil {
					return false
				}
				for _, c := range node.Status.Conditions {
					if c.Type == corev1.NodeNetworkUnavailable {
						return c.Status == corev1.ConditionFalse && c.Reason == nodestatus.Reason
					}
				}
				return false
			}, n.Name+" NetworkUnavailable=False")
		}
		// A pod on node4 gets an address of the claimed podCIDR, and is
		// reachable across the router (VXLAN).
		web4 := k.addPod(ctx, "node4", "web4")
		if !p.Contains(web4.IP) {
			t.Errorf("pod on node4 got %v, outside node4's podCIDR %v", web4.IP, p)
		}
		if _, err := web4.StartEcho(lab.EchoOptions{TCP: []string{":8080"}}); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, 10*time.Second, func() bool { return k.reaches(web4.IP.String()+":8080", "web4") }, "client → web4 on node4")
	})

	web2 := k.addPod(ctx, "node2", "web2")
	if _, err := web2.StartEcho(lab.EchoOptions{TCP: []string{":8080"}}); err != nil {
		t.Fatal(err)
	}

	t.Run("a Service created through the API is reachable and resolvable", func(t *testing.T) {
		k.createService(ctx, kubeLabNS, "web", "10.96.100.10", []svcPortSpec{{"http", corev1.ProtocolTCP, 80, 8080}}, web2)
		start := time.Now()
		var wg sync.WaitGroup
		wg.Go(func() {
			within(t, 2*time.Second, "10.96.100.10:80 reachable from a pod", func() bool { return k.reaches("10.96.100.10:80", "web2") })
		})
		wg.Go(func() {
			within(t, time.Second, "web.default resolvable through dnsd", func() bool { return k.resolves("web.default.svc.cluster.local.", "10.96.100.10") })
		})
		wg.Wait()
		t.Logf("both after %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("deleting the Service removes its rules and its name", func(t *testing.T) {
		k.deleteService(ctx, kubeLabNS, "web")
		var wg sync.WaitGroup
		wg.Go(func() {
			within(t, 2*time.Second, "10.96.100.10:80 gone", func() bool { return !k.reaches("10.96.100.10:80", "web2") })
		})
		wg.Go(func() {
			within(t, time.Second, "web.default NXDOMAIN", func() bool { return k.nxdomain("web.default.svc.cluster.local.") })
		})
		wg.Wait()
	})

	t.Run("an API server outage breaks nothing, later changes are applied", func(t *testing.T) {
		k.createService(ctx, kubeLabNS, "steady", "10.96.100.20", []svcPortSpec{{"http", corev1.ProtocolTCP, 80, 8080}}, web2)
		waitUntil(t, 5*time.Second, func() bool {
			return k.reaches("10.96.100.20:80", "web2") && k.resolves("steady.default.svc.cluster.local.", "10.96.100.20")
		}, "steady Service")

		// An established connection, and fresh connections and lookups,
		// all through the outage.
		conn, err := dialIn(k.client.NSPath(), "10.96.100.20:80")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var probes, failures atomic.Int64
		var failMu sync.Mutex
		var firstFailure string
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				probes.Add(1)
				var what string
				// A client's connect survives a lost SYN (retransmitted
				// after 1 s): so does the probe's, not a timing check.
				if err := k.reachesWithin("10.96.100.20:80", "web2", 1500*time.Millisecond); err != nil {
					what = "new connection to steady: " + err.Error()
				}
				switch {
				case what != "":
				case !k.resolves("steady.default.svc.cluster.local.", "10.96.100.20"):
					what = "lookup of steady"
				case !echoes(conn):
					what = "established connection"
				default:
					continue
				}
				failures.Add(1)
				failMu.Lock()
				if firstFailure == "" {
					firstFailure = what
				}
				failMu.Unlock()
			}
		})
		// The outage outlasts the DaemonSet's liveness window: a probe
		// that failed while the API server is merely away would restart
		// proxyd on every node.
		probe := proxydLivenessProbe(t)
		if err := k.srv.StopAPIServer(); err != nil {
			t.Errorf("stop kube-apiserver: %v", err)
		}
		outage := time.Now()
		var probeFailures atomic.Int64
		var probeMu sync.Mutex
		var firstProbeFailure string
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Second):
				}
				for _, n := range k.l.Nodes {
					for _, path := range []string{probe.path, "/healthz", "/livez"} {
						if code, body := httpGetIn(n.NSPath(), fmt.Sprintf("127.0.0.1:%d", probe.port), path); code != http.StatusOK {
							probeFailures.Add(1)
							probeMu.Lock()
							if firstProbeFailure == "" {
								firstProbeFailure = fmt.Sprintf("%s %s after %v: %d %s", n.Name, path, time.Since(outage).Round(time.Second), code, body)
							}
							probeMu.Unlock()
						}
					}
				}
			}
		})
		// proxyd says its state is stale (metrics), and keeps serving it.
		var code int
		var body string
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			code, body = httpGetIn(k.l.Node("node1").NSPath(), "127.0.0.1:10249", "/metrics")
			if code == http.StatusOK && strings.Contains(body, "\npodnet_cluster_state_stale 1\n") {
				break
			}
			if time.Now().After(deadline) {
				_, line, _ := strings.Cut(body, "\npodnet_cluster_state_stale")
				line, _, _ = strings.Cut(line, "\n")
				t.Fatalf("node1 /metrics during the outage: %d, podnet_cluster_state_stale%s; want 1", code, line)
			}
		}
		// dnsd stays ready (every dnsd unready at once would empty the
		// kube-dns Service) and says in its status that the state is stale.
		waitUntil(t, 5*time.Second, func() bool {
			code, body = httpGetIn(k.dnsPod.NSPath(), "127.0.0.1:9153", "/status")
			return code == http.StatusOK && strings.Contains(body, `"stale"`)
		}, "dnsd status reporting stale cluster state")
		if code, body := httpGetIn(k.dnsPod.NSPath(), "127.0.0.1:8181", "/ready"); code != http.StatusOK {
			t.Errorf("dnsd /ready during the outage: %d %s, want 200", code, strings.TrimSpace(body))
		}
		// A proxyd restarted while the API server is away has no state to
		// sync from: it must leave the node's routes and rules alone (the
		// probes from node1's pod go on meanwhile).
		if err := k.proxyd["node1"].Stop(); err != nil {
			t.Errorf("stop proxyd on node1: %v", err)
		}
		p, err := k.l.Node("node1").StartProxyd(ctx, k.proxydArgs["node1"]...)
		if err != nil {
			t.Fatalf("restart proxyd on node1 during the outage: %v", err)
		}
		k.proxyd["node1"] = p
		time.Sleep(probe.window + 5*time.Second - time.Since(outage))
		startErr := k.srv.StartAPIServer(ctx)
		close(stop)
		wg.Wait()
		if startErr != nil {
			t.Fatalf("restart kube-apiserver: %v", startErr)
		}
		if n := probeFailures.Load(); n > 0 {
			t.Errorf("%d health probes failed during a %v outage (liveness window %v), first: %s", n, probe.window+5*time.Second, probe.window, firstProbeFailure)
		} else {
			t.Logf("every proxyd's %s, /healthz and /livez answered 200 through a %v outage (liveness window %v)", probe.path, probe.window+5*time.Second, probe.window)
		}
		if n := failures.Load(); n > 0 {
			t.Errorf("%d of %d probes failed during the outage, first: %s", n, probes.Load(), firstFailure)
		} else {
			t.Logf("%d probes (connection, lookup, established connection) during the outage, none failed", probes.Load())
		}

		// Changes made after it returns reach the nodes: the watches
		// reconnect with backoff, so allow for that.
		k.createService(ctx, kubeLabNS, "after", "10.96.100.30", []svcPortSpec{{"http", corev1.ProtocolTCP, 80, 8080}}, web2)
		// The kube source's reflectors retry with client-go's backoff
		// capped at 800 ms (kube.PromptBackoff), so they resume within
		// about a second rather than after client-go's default backoff
		// (up to a minute after an outage this long).
		within(t, 3*time.Second, "Service created after the outage reachable and resolvable", func() bool {
			return k.reaches("10.96.100.30:80", "web2") && k.resolves("after.default.svc.cluster.local.", "10.96.100.30")
		})
		waitUntil(t, 10*time.Second, func() bool {
			code, _ := k.healthz("node1")
			return code == http.StatusOK
		}, "node1 /healthz healthy again")
		waitUntil(t, 10*time.Second, func() bool {
			code, _ := httpGetIn(k.dnsPod.NSPath(), "127.0.0.1:8181", "/ready")
			return code == http.StatusOK
		}, "dnsd /ready again")
	})
}

// echoes sends a line on the established connection and expects it back.
func echoes(conn net.Conn) bool {
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("ping\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return err == nil && line == "ping\n"
}

// dialIn opens a TCP connection from inside the namespace at nsPath and
// reads the echo server's greeting.
func dialIn(nsPath, addr string) (net.Conn, error) {
	var c net.Conn
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 2*time.Second)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		c.Close()
		return nil, fmt.Errorf("greeting of %s: %w", addr, err)
	}
	return c, nil
}
