package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/podnet/podnet/e2e/lab"
)

// The scenarios of `make soak` that need the API server: Service churn
// through it (scenario 2) and long outages of it and of etcd (scenario 3).
// Both run on the kube lab (startKubeLab): proxyd on four nodes and dnsd in
// a pod, all reading the real kube-apiserver.

// soakChurnNS holds the churned Services. Nothing deletes namespaces here
// (no controller manager), so it is created once and reused.
const soakChurnNS = "soak-churn"

// churnTimes are the sampled delays from an API write to its effect.
type churnTimes struct {
	mu                               sync.Mutex
	created, changed, resolved, gone []time.Duration
	missed                           []string
	wg                               sync.WaitGroup
}

// time polls cond every 20 ms, for 30 s at most, from when the write was
// acknowledged, and records how long it took to hold into *into.
func (c *churnTimes) time(what string, into *[]time.Duration, written time.Time, cond func() bool) {
	c.wg.Go(func() {
		for time.Since(written) < 30*time.Second {
			if cond() {
				c.mu.Lock()
				*into = append(*into, time.Since(written))
				c.mu.Unlock()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		c.mu.Lock()
		c.missed = append(c.missed, what)
		c.mu.Unlock()
	})
}

// churnServicesAPI creates n Services with an EndpointSlice of web1 each,
// then points every slice at web2, then deletes them all, each phase
// spread evenly over phase, and times every step-th object's write to its
// effect: served by proxyd to the client pod, resolvable through dnsd, and
// NXDOMAIN once deleted.
func (k *kubeLab) churnServicesAPI(ctx context.Context, n int, phase time.Duration, web1, web2 *lab.Pod, times *churnTimes) {
	t := k.t
	t.Helper()
	step := max(1, n/50)
	vip := func(i int) string { return fmt.Sprintf("10.100.%d.%d", i/250, i%250+1) }
	name := func(i int) string { return fmt.Sprintf("churn%d", i) }
	fqdn := func(i int) string { return fmt.Sprintf("churn%d.%s.svc.cluster.local.", i, soakChurnNS) }
	endpoint := func(p *lab.Pod) []discoveryv1.Endpoint {
		return []discoveryv1.Endpoint{{
			Addresses:  []string{p.IP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true)},
			NodeName:   new(p.Node.Name),
		}}
	}
	// paced runs do(i) for every i, the i-th at start + i×phase/n.
	paced := func(do func(i int)) {
		start := time.Now()
		for i := range n {
			time.Sleep(time.Until(start.Add(time.Duration(i) * phase / time.Duration(n))))
			do(i)
		}
	}
	svcs, slicesAPI := k.admin.CoreV1().Services(soakChurnNS), k.admin.DiscoveryV1().EndpointSlices(soakChurnNS)
	created := make([]*discoveryv1.EndpointSlice, n)
	paced(func(i int) {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name(i), Namespace: soakChurnNS},
			Spec: corev1.ServiceSpec{ClusterIP: vip(i), Selector: map[string]string{"app": name(i)},
				Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name(i) + "-abcde", Namespace: soakChurnNS,
				Labels: map[string]string{discoveryv1.LabelServiceName: name(i)}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Protocol: new(corev1.ProtocolTCP), Port: new(int32(8080))}},
			Endpoints:   endpoint(web1),
		}
		if _, err := svcs.Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create service %s: %v", name(i), err)
		}
		s, err := slicesAPI.Create(ctx, slice, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create endpointslice of %s: %v", name(i), err)
		}
		created[i] = s
		if i%step == 0 {
			now := time.Now()
			times.time("created "+name(i), &times.created, now, func() bool { return k.reachesFast(vip(i)+":80", "web1") })
			times.time("resolvable "+name(i), &times.resolved, now, func() bool { return k.resolves(fqdn(i), vip(i)) })
		}
	})
	paced(func(i int) {
		s := created[i]
		s.Endpoints = endpoint(web2)
		if _, err := slicesAPI.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update endpointslice of %s: %v", name(i), err)
		}
		if i%step == 0 {
			times.time("changed "+name(i), &times.changed, time.Now(), func() bool { return k.reachesFast(vip(i)+":80", "web2") })
		}
	})
	paced(func(i int) {
		if err := slicesAPI.Delete(ctx, name(i)+"-abcde", metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete endpointslice of %s: %v", name(i), err)
		}
		if err := svcs.Delete(ctx, name(i), metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete service %s: %v", name(i), err)
		}
		if i%step == 0 || i == n-1 {
			times.time("deleted "+name(i), &times.gone, time.Now(), func() bool { return k.nxdomain(fqdn(i)) })
		}
	})
	times.wg.Wait()
}

// reachesFast is reaches with a 150 ms connect timeout, so that polling a
// Service not programmed yet measures its arrival to within ~170 ms.
func (k *kubeLab) reachesFast(addr, want string) bool {
	out, err := probeFrom(k.client.NSPath(), "tcp", addr, 150*time.Millisecond)
	name, _, _ := strings.Cut(out, " ")
	return err == nil && name == want
}

// TestSoakServiceChurnAPI is scenario 2 through the API server: Services
// with EndpointSlices created, their endpoints changed and then deleted
// through kube-apiserver (each phase spread over 20 s at full size: the
// whole churn over a minute) while a client pod hammers a stable Service.
// Goal: no failed request on the stable Service, every timed write took
// effect; figures: the 95th percentile from a write to proxyd serving it
// (creation, endpoint change) and to dnsd resolving it (creation) or
// answering NXDOMAIN (deletion). At full size the churn runs twice, each
// time settled, and proxyd's and dnsd's RSS after the second may not exceed
// that after the first by more than the measurement's noise.
func TestSoakServiceChurnAPI(t *testing.T) {
	k := startKubeLab(t)
	ctx := t.Context()
	web1, web2 := k.addPod(ctx, "node2", "web1"), k.addPod(ctx, "node4", "web2")
	for _, p := range []*lab.Pod{web1, web2} {
		if _, err := p.StartEcho(lab.EchoOptions{TCP: []string{":8080"}}); err != nil {
			t.Fatal(err)
		}
	}
	k.createService(ctx, kubeLabNS, "stable", "10.96.101.1", []svcPortSpec{{"http", corev1.ProtocolTCP, 80, 8080}}, web1, web2)
	waitUntil(t, 30*time.Second, func() bool {
		return k.reaches("10.96.101.1:80", "web1") || k.reaches("10.96.101.1:80", "web2")
	}, "the stable Service")
	if _, err := k.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: soakChurnNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	services := soakSize(20, 1000)
	phase := time.Duration(soakSize(2, 20)) * time.Second
	rounds := soakSize(1, 2)
	procs := []rssProc{
		{"proxyd", func() int { return k.proxyd["node1"].Pid() }, func() string {
			_, body := httpGetIn(k.l.Node("node1").NSPath(), "127.0.0.1:10249", "/metrics")
			return body
		}},
		{"dnsd", k.dnsd.Pid, func() string {
			_, body := httpGetIn(k.dnsPod.NSPath(), "127.0.0.1:9153", "/metrics")
			return body
		}},
	}
	times := &churnTimes{}
	run := runChurnUnderLoad(t, procs, rounds, func() error {
		out, err := probeFrom(k.client.NSPath(), "tcp", "10.96.101.1:80", 2*time.Second)
		if err == nil && !strings.HasPrefix(out, "web") {
			err = fmt.Errorf("answer %q", out)
		}
		return err
	}, func() { k.churnServicesAPI(ctx, services, phase, web1, web2, times) })
	if len(times.missed) > 0 {
		t.Errorf("%d timed writes did not take effect within 30 s: %v", len(times.missed), times.missed)
	}
	p95 := func(ds []time.Duration) string { return percentile(ds, 0.95).Round(time.Millisecond).String() }
	soakRow(t, "2 Service churn (API server)",
		fmt.Sprintf("%d Services with slices created, endpoints changed, deleted through kube-apiserver, %d round(s) of %v; stable Service hammered (%d requests)",
			services, rounds, run.perRound, run.stableTotal),
		"none beyond the churn",
		fmt.Sprintf("%d failed on the stable Service, %d of %d timed writes without effect", run.stableFailed, len(times.missed),
			len(times.created)+len(times.changed)+len(times.resolved)+len(times.gone)+len(times.missed)),
		fmt.Sprintf("write to served p95: created %s, endpoints changed %s; to resolvable p95 %s, deleted to NXDOMAIN p95 %s (%d samples each); %s",
			p95(times.created), p95(times.changed), p95(times.resolved), p95(times.gone), len(times.created), run.memory))
}

// probeFrom is lab.Probe from inside the namespace at nsPath.
func probeFrom(nsPath, proto, addr string, timeout time.Duration) (string, error) {
	var out string
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		out, err = lab.Probe(context.Background(), proto, addr, timeout)
		return err
	})
	return out, err
}

// deployHTTPProbe is one httpGet probe of a container in deploy/.
type deployHTTPProbe struct {
	container, kind, path string
	port                  int64
}

// deployHTTPProbes lists the httpGet liveness and readiness probes of the
// containers of deploy/'s DaemonSets and Deployments.
func deployHTTPProbes(t *testing.T) []deployHTTPProbe {
	t.Helper()
	objs, err := manifests()
	if err != nil {
		t.Fatal(err)
	}
	var out []deployHTTPProbe
	for _, o := range objs {
		if o.GetKind() != "DaemonSet" && o.GetKind() != "Deployment" {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range cs {
			c, _ := c.(map[string]any)
			name, _ := c["name"].(string)
			for _, kind := range []string{"livenessProbe", "readinessProbe", "startupProbe"} {
				path, ok, _ := unstructured.NestedString(c, kind, "httpGet", "path")
				if !ok {
					continue
				}
				port, _, _ := unstructured.NestedFieldNoCopy(c, kind, "httpGet", "port")
				var p int64
				switch v := port.(type) {
				case int64:
					p = v
				case float64:
					p = int64(v)
				default:
					t.Fatalf("%s's %s: port %v is not a number", name, kind, port)
				}
				out = append(out, deployHTTPProbe{container: name, kind: kind, path: path, port: p})
			}
		}
	}
	return out
}

// soakOutageService creates a Service of one TCP port (80 → 8080) and its
// EndpointSlice through client.
func soakOutageService(ctx context.Context, client kubernetes.Interface, name, vip string, ep *lab.Pod) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kubeLabNS},
		Spec: corev1.ServiceSpec{ClusterIP: vip, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	// What an earlier attempt wrote counts (its answer may have been lost).
	if _, err := client.CoreV1().Services(kubeLabNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		got, gerr := client.CoreV1().Services(kubeLabNS).Get(ctx, name, metav1.GetOptions{})
		if gerr != nil || got.Spec.ClusterIP != vip {
			return fmt.Errorf("create service %s: %w", name, err)
		}
	}
	if _, err := client.DiscoveryV1().EndpointSlices(kubeLabNS).Create(ctx, soakSlice(name, ep), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create endpointslice of %s: %w", name, err)
	}
	return nil
}

func soakSlice(name string, ep *lab.Pod) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-abcde", Namespace: kubeLabNS,
			Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Protocol: new(corev1.ProtocolTCP), Port: new(int32(8080))}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{ep.IP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true)},
			NodeName:   new(ep.Node.Name),
		}},
	}
}

func soakDeleteService(ctx context.Context, client kubernetes.Interface, name string) error {
	if err := client.DiscoveryV1().EndpointSlices(kubeLabNS).Delete(ctx, name+"-abcde", metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete endpointslice of %s: %w", name, err)
	}
	if err := client.CoreV1().Services(kubeLabNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete service %s: %w", name, err)
	}
	return nil
}

// soakArrival waits for every condition to hold, polling them all every
// 20 ms for limit×5 at most, and returns when the last one first held,
// since from; it fails the test if that is later than limit.
func soakArrival(t *testing.T, from time.Time, limit time.Duration, conds map[string]func() bool) time.Duration {
	t.Helper()
	took := map[string]time.Duration{}
	for len(took) < len(conds) && time.Since(from) < 5*limit {
		for what, cond := range conds {
			if _, done := took[what]; !done && cond() {
				took[what] = time.Since(from)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	var last time.Duration
	var parts []string
	for what := range conds {
		d, ok := took[what]
		if !ok {
			t.Errorf("%s: not after %v", what, 5*limit)
			d = 5 * limit
		}
		last = max(last, d)
		parts = append(parts, fmt.Sprintf("%s %v", what, d.Round(time.Millisecond)))
	}
	slices.Sort(parts)
	t.Logf("arrived: %s", strings.Join(parts, "; "))
	if last > limit {
		t.Errorf("changes arrived %v after, want within %v", last.Round(time.Millisecond), limit)
	}
	return last
}

// TestSoakAPIOutage is scenario 3: kube-apiserver killed for 3 minutes (15 s
// in make test), then etcd killed under the running kube-apiserver for a
// minute (5 s). The changes of the API outage are written while it lasts,
// through a second kube-apiserver on the same etcd that no daemon knows (a
// control plane whose replica the nodes use is down): a Service created,
// one's endpoints moved, one deleted. Throughout, from a pod: new TCP
// connections to a Service, echoes over connections established before,
// and lookups of its name keep working, and every httpGet probe of deploy/
// (proxyd's on every node, dnsd's) plus proxyd's /livez answers 200. While
// the API server is away the daemons keep the last state (the deleted
// Service still resolves and serves, the created one is unknown); the
// changes arrive within 5 s of its return, and a Service created once etcd
// is back within 5 s of the write.
func TestSoakAPIOutage(t *testing.T) {
	k := startKubeLab(t)
	ctx := t.Context()
	srv := k.srv
	// Whatever happens, the shared control plane is whole again for the
	// tests after this one.
	t.Cleanup(func() {
		_ = srv.StartEtcd()
		_ = srv.StartAPIServer(context.Background())
	})
	web1, web2 := k.addPod(ctx, "node2", "web1"), k.addPod(ctx, "node4", "web2")
	for _, p := range []*lab.Pod{web1, web2} {
		if _, err := p.StartEcho(lab.EchoOptions{TCP: []string{":8080"}}); err != nil {
			t.Fatal(err)
		}
	}
	port := []svcPortSpec{{"http", corev1.ProtocolTCP, 80, 8080}}
	k.createService(ctx, kubeLabNS, "steady", "10.96.102.1", port, web1, web2)
	k.createService(ctx, kubeLabNS, "moving", "10.96.102.2", port, web1)
	k.createService(ctx, kubeLabNS, "doomed", "10.96.102.3", port, web1)
	fqdn := func(name string) string { return name + ".default.svc.cluster.local." }
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, name := range []string{"arrives", "after-etcd"} {
			_ = soakDeleteService(ctx, k.admin, name)
		}
	})
	waitUntil(t, 30*time.Second, func() bool {
		return (k.reaches("10.96.102.1:80", "web1") || k.reaches("10.96.102.1:80", "web2")) && k.reaches("10.96.102.2:80", "web1") &&
			k.reaches("10.96.102.3:80", "web1") && k.resolves(fqdn("doomed"), "10.96.102.3")
	}, "the Services before the outage")

	// The loads: new connections, established ones, lookups, probes.
	var conns []net.Conn
	for range 4 {
		c, err := dialIn(k.client.NSPath(), "10.96.102.1:80")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	probes := deployHTTPProbes(t)
	type target struct{ nsPath, addr, path string }
	var targets []target
	for _, p := range probes {
		switch p.container {
		case "proxyd":
			for _, n := range k.l.Nodes {
				targets = append(targets, target{n.NSPath(), fmt.Sprintf("127.0.0.1:%d", p.port), p.path})
			}
		case "dnsd":
			targets = append(targets, target{k.dnsPod.NSPath(), fmt.Sprintf("127.0.0.1:%d", p.port), p.path})
		}
	}
	for _, n := range k.l.Nodes { // kube-proxy's liveness endpoint too
		targets = append(targets, target{n.NSPath(), "127.0.0.1:10256", "/livez"})
	}
	if len(targets) < 2*len(k.l.Nodes)+2 {
		t.Fatalf("deploy/ probes %v: want proxyd's and dnsd's", probes)
	}
	loads := []*soakLoad{{name: "new connections"}, {name: "established-connection echoes"}, {name: "lookups"}, {name: "health probes"}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		loads[0].run(stop, 1000000, func() error {
			out, err := probeFrom(k.client.NSPath(), "tcp", "10.96.102.1:80", 2*time.Second)
			if err == nil && !strings.HasPrefix(out, "web") {
				err = fmt.Errorf("answer %q", out)
			}
			return err
		})
	})
	wg.Go(func() {
		i := 0
		loads[1].run(stop, 1000000, func() error {
			time.Sleep(50 * time.Millisecond)
			i++
			if !echoes(conns[i%len(conns)]) {
				return fmt.Errorf("established connection %d: no echo", i%len(conns))
			}
			return nil
		})
	})
	wg.Go(func() {
		loads[2].run(stop, 1000000, func() error {
			time.Sleep(20 * time.Millisecond)
			if addrs, rcode, err := lookupIn(k.client.NSPath(), fqdn("steady")); err != nil || len(addrs) != 1 || addrs[0] != "10.96.102.1" {
				return fmt.Errorf("steady: %v rcode %d, %v", addrs, rcode, err)
			}
			return nil
		})
	})
	wg.Go(func() {
		loads[3].run(stop, 1000000, func() error {
			time.Sleep(time.Second)
			var errs []string
			for _, tg := range targets {
				if code, body := httpGetIn(tg.nsPath, tg.addr, tg.path); code != http.StatusOK {
					errs = append(errs, fmt.Sprintf("%s %s: %d %s", tg.addr, tg.path, code, strings.TrimSpace(body)))
				}
			}
			if len(errs) > 0 {
				return fmt.Errorf("%s", strings.Join(errs, "; "))
			}
			return nil
		})
	})
	began := time.Now()

	// The API server's outage, and the changes written meanwhile.
	outage := time.Duration(soakSize(15, 180)) * time.Second
	if err := srv.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	time.Sleep(2 * time.Second)
	writer, stopWriter, err := srv.StartSecond(ctx, 6444)
	if err != nil {
		t.Fatalf("second kube-apiserver: %v", err)
	}
	if err := soakOutageService(ctx, writer, "arrives", "10.96.102.4", web1); err != nil {
		t.Fatal(err)
	}
	moving, err := writer.DiscoveryV1().EndpointSlices(kubeLabNS).Get(ctx, "moving-abcde", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	moving.Endpoints = soakSlice("moving", web2).Endpoints
	if _, err := writer.DiscoveryV1().EndpointSlices(kubeLabNS).Update(ctx, moving, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := soakDeleteService(ctx, writer, "doomed"); err != nil {
		t.Fatal(err)
	}
	stopWriter()
	written := time.Since(down)
	// The daemons keep the last state they saw.
	time.Sleep(2 * time.Second)
	if !k.reaches("10.96.102.3:80", "web1") || !k.resolves(fqdn("doomed"), "10.96.102.3") || !k.nxdomain(fqdn("arrives")) || !k.reaches("10.96.102.2:80", "web1") {
		t.Errorf("during the outage the daemons do not hold the last state they saw (doomed served and resolvable, arrives unknown, moving on web1)")
	}
	time.Sleep(time.Until(down.Add(outage)))
	if err := srv.StartAPIServer(ctx); err != nil {
		t.Fatalf("restart kube-apiserver: %v", err)
	}
	back := time.Now()
	apiDown := back.Sub(down)
	apiArrival := soakArrival(t, back, 5*time.Second, map[string]func() bool{
		"arrives served":     func() bool { return k.reachesFast("10.96.102.4:80", "web1") },
		"arrives resolvable": func() bool { return k.resolves(fqdn("arrives"), "10.96.102.4") },
		"moving on web2":     func() bool { return k.reachesFast("10.96.102.2:80", "web2") },
		"doomed NXDOMAIN":    func() bool { return k.nxdomain(fqdn("doomed")) },
	})

	if k.reaches("10.96.102.3:80", "web1") {
		t.Error("doomed is still served after its deletion arrived")
	}

	// etcd's outage under the running API server.
	etcdOutage := time.Duration(soakSize(5, 60)) * time.Second
	srv.StopEtcd()
	time.Sleep(etcdOutage)
	if err := srv.StartEtcd(); err != nil {
		t.Fatal(err)
	}
	etcdBack := time.Now()
	// The first write the API server accepts again. An attempt that timed
	// out here may still have been carried out, or have left its cluster
	// IP allocated while the Service was not stored (the API server's
	// repair loop frees it minutes later): soakOutageService picks up what
	// an earlier attempt wrote, and an IP taken without a Service moves the
	// next attempt to the next IP.
	var accepted time.Duration
	vip := netip.MustParseAddr("10.96.102.5")
	for {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := soakOutageService(wctx, k.admin, "after-etcd", vip.String(), web2)
		cancel()
		if err == nil {
			accepted = time.Since(etcdBack)
			break
		}
		if time.Since(etcdBack) > time.Minute {
			t.Fatalf("no write accepted a minute after etcd's return: %v", err)
		}
		if strings.Contains(err.Error(), "already allocated") {
			t.Logf("after etcd's return: %v; trying the next IP", err)
			vip = vip.Next()
		}
		time.Sleep(100 * time.Millisecond)
	}
	wrote := time.Now()
	etcdArrival := soakArrival(t, wrote, 5*time.Second, map[string]func() bool{
		"after-etcd served":     func() bool { return k.reachesFast(vip.String()+":80", "web2") },
		"after-etcd resolvable": func() bool { return k.resolves(fqdn("after-etcd"), vip.String()) },
	})
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	took := time.Since(began)

	total, failed, parts := soakSummary(t, loads, 5)
	soakRow(t, "3 long API outage",
		fmt.Sprintf("from a pod: %s over %v; %d httpGet probes of deploy/ and proxyd's /livez each second", strings.Join(parts, ", "), took.Round(time.Second), len(targets)),
		fmt.Sprintf("kube-apiserver killed for %v (a Service created, one's endpoints moved, one deleted %v into it through a second kube-apiserver on the same etcd), then etcd killed for %v under the running kube-apiserver",
			apiDown.Round(time.Second), written.Round(time.Second), etcdOutage),
		fmt.Sprintf("%d of %d requests and probes failed", failed, total),
		fmt.Sprintf("the outage's changes served and resolvable %v after the API server was ready again; after etcd's return a write accepted after %v, served and resolvable %v after it",
			apiArrival.Round(time.Millisecond), accepted.Round(time.Millisecond), etcdArrival.Round(time.Millisecond)))
}
