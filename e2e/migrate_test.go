//go:build conformance

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/e2e/lab"
	"github.com/podnet/podnet/e2e/realnode"
)

// migrateWorkloadYAML is the workload of make migrate: four web replicas
// spread over the nodes behind a ClusterIP + NodePort Service (each web pod
// keeps serving 5 s after it is told to stop, the preStop delay any
// Deployment needs for a drain without errors: until every node's proxy has
// seen its endpoint terminating, connections still reach it), and the
// client, a Deployment of one pod held to the node migrated last, sending
// HTTP through the ClusterIP and 20 lookups a second (the Service's name,
// the stub domain's name, an outside name) for the whole run.
func migrateWorkloadYAML(clientNode, clusterIP string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 4
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      topologySpreadConstraints:
        - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: web}}}
      terminationGracePeriodSeconds: 15
      containers:
        - name: web
          image: %[1]s
          args: [":8080"]
          lifecycle: {preStop: {sleep: {seconds: 5}}}
          readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: client, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: client}}
  template:
    metadata: {labels: {app: client}}
    spec:
      nodeSelector: {kubernetes.io/hostname: %[2]s}
      containers:
        - name: client
          image: %[1]s
          command: [/testapp, mix, "http://%[3]s/", "20", web.default.svc.cluster.local., "%[4]s.", "%[5]s."]
`, testappImage, clientNode, clusterIP, stubName, externalName)
}

// migrateServiceYAML is the web Service (created first: the client's URL
// is its ClusterIP).
const migrateServiceYAML = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`

// migrateWorkload is what startMigrateWorkload made.
type migrateWorkload struct {
	clusterIP string
	nodePort  int32
	client    string // the client's node
}

// startMigrateWorkload creates the workload with its client on the last
// node and waits for four ready web pods on every node and the client
// running.
func (c *realCluster) startMigrateWorkload(ctx context.Context) migrateWorkload {
	c.t.Helper()
	c.applyYAML(ctx, migrateServiceYAML)
	svc, err := c.admin.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	w := migrateWorkload{clusterIP: svc.Spec.ClusterIP, nodePort: svc.Spec.Ports[0].NodePort, client: c.nodes[len(c.nodes)-1].Name}
	c.applyYAML(ctx, migrateWorkloadYAML(w.client, w.clusterIP))
	c.waitFor(3*time.Minute, "four web pods ready on every node, the client running", func(ctx context.Context) (bool, string) {
		pods, err := c.admin.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app in (web,client)"})
		if err != nil {
			return false, err.Error()
		}
		nodes, web, client := map[string]bool{}, 0, false
		for _, p := range pods.Items {
			if p.Labels["app"] == "client" {
				client = client || p.Status.Phase == corev1.PodRunning
			} else if podReady(&p) {
				web++
				nodes[p.Spec.NodeName] = true
			}
		}
		if web != 4 || len(nodes) != len(c.nodes) || !client {
			return false, fmt.Sprintf("%d web pods ready on %v, client running %v", web, nodes, client)
		}
		return true, ""
	})
	return w
}

// checkPodToPod has every web pod GET every other one by its address.
func (c *realCluster) checkPodToPod(ctx context.Context, _ migrateWorkload) {
	pods, err := c.admin.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		c.t.Fatal(err)
	}
	for _, from := range pods.Items {
		for _, to := range pods.Items {
			out, err := c.execUntil(ctx, func(out string, err error) bool { return err == nil && strings.HasPrefix(out, to.Name) },
				"exec", from.Name, "--", "/testapp", "get", "http://"+to.Status.PodIP+":8080/")
			if err != nil || !strings.HasPrefix(out, to.Name) {
				c.errorf("%s (%s) → %s (%s, %s): %q, %v", from.Name, from.Spec.NodeName, to.Name, to.Spec.NodeName, to.Status.PodIP, out, err)
			}
		}
	}
}

// checkNames waits for the client's lookups of all three names to
// succeed (its log's last full second without a failed lookup).
func (c *realCluster) checkNames(ctx context.Context, _ string) {
	c.waitFor(time.Minute, "the client's HTTP and lookups all answered for a second", func(ctx context.Context) (bool, string) {
		out, err := c.kubectl(ctx, "logs", "deploy/client", "--tail=5")
		if err != nil {
			return false, fmt.Sprintf("%v %s", err, out)
		}
		for _, l := range strings.Split(out, "\n") {
			if s, ok := parseMixLine(l); ok && s.httpOK > 0 && s.httpFailed == 0 && s.dnsOK >= 15 && s.dnsFailed == 0 {
				return true, ""
			}
		}
		return false, out
	})
}

// mixSecond is one line of podnet-testapp mix: one second's results.
type mixSecond struct {
	at                                   int64
	httpOK, httpFailed, dnsOK, dnsFailed int
}

var mixLine = regexp.MustCompile(`^(\d+) http (\d+) (\d+) dns (\d+) (\d+)$`)

func parseMixLine(l string) (mixSecond, bool) {
	m := mixLine.FindStringSubmatch(strings.TrimSpace(l))
	if m == nil {
		return mixSecond{}, false
	}
	var n [5]int64
	for i := range n {
		n[i], _ = strconv.ParseInt(m[i+1], 10, 64)
	}
	return mixSecond{n[0], int(n[1]), int(n[2]), int(n[3]), int(n[4])}, true
}

// mixLog collects a mix client's lines, as they come, from any number of
// streams (the client pod's log, followed again after it is replaced).
type mixLog struct {
	mu       sync.Mutex
	seconds  []mixSecond
	failures []string
}

func (m *mixLog) add(line string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := parseMixLine(line); ok {
		// a log followed again from its start repeats its seconds
		if !slices.ContainsFunc(m.seconds, func(x mixSecond) bool { return x.at == s.at }) {
			m.seconds = append(m.seconds, s)
		}
	} else if strings.HasPrefix(line, "fail ") && len(m.failures) < 100 {
		m.failures = append(m.failures, line)
	}
}

// window sums the seconds in [from, to) not excluded.
func (m *mixLog) window(from, to time.Time, excluded func(at int64) bool) (s mixSecond) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, x := range m.seconds {
		if x.at >= from.Unix() && x.at < to.Unix() && !excluded(x.at) {
			s.httpOK += x.httpOK
			s.httpFailed += x.httpFailed
			s.dnsOK += x.dnsOK
			s.dnsFailed += x.dnsFailed
		}
	}
	return s
}

// followClient streams the client Deployment's log into m until ctx ends,
// following each new pod of it (the one drained with its node comes back
// when the node is uncordoned).
func (c *realCluster) followClient(ctx context.Context, m *mixLog) {
	for ctx.Err() == nil {
		cmd := []string{c.bins.Kubectl, "--kubeconfig=" + c.adminKC, "logs", "-f", "deploy/client", "--pod-running-timeout=30s"}
		p, err := c.cp.Host.Start("client-log", cmd...)
		if err != nil {
			c.t.Error(err)
			return
		}
		select {
		case <-p.Done():
		case <-ctx.Done():
			_ = p.Stop()
		}
		sc := bufio.NewScanner(strings.NewReader(p.Output()))
		for sc.Scan() {
			m.add(sc.Text())
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// outsideClients start one podnet-testapp mix (HTTP only) per node, from
// the lab's outside namespace, to the node's NodePort.
func (c *realCluster) outsideClients(t *testing.T, nodePort int32) map[string]*lab.Proc {
	out := map[string]*lab.Proc{}
	for _, n := range c.nodes {
		p, err := c.l.OutsideHost.Start("np-"+n.Name, c.testapp, "mix", fmt.Sprintf("http://%s:%d/", n.IP, nodePort), "0")
		if err != nil {
			t.Fatal(err)
		}
		out[n.Name] = p
	}
	return out
}

// migrateStep is one row of make migrate's table.
type migrateStep struct {
	name       string
	start, end time.Time
	// drained is the node being drained during the step ("" none): its
	// NodePort's client does not count, nor the pod client when it is the
	// client's node.
	drained string
}

// readme holds README's text with its whitespace runs folded to one
// space, so that a command broken over lines is found.
type readme struct{ text string }

var spaces = regexp.MustCompile(`\s+`)

func readREADME(t *testing.T) readme {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	return readme{spaces.ReplaceAllString(string(b), " ")}
}

// has fails the test unless README gives cmd, word for word.
func (r readme) has(t *testing.T, cmd string) {
	t.Helper()
	if !strings.Contains(r.text, spaces.ReplaceAllString(cmd, " ")) {
		t.Fatalf("README does not give %q", cmd)
	}
}

// migration runs README's commands: kubectl and dnsd in the control
// plane's namespace, in a directory holding deploy/ (a link to the tree's),
// node commands on the node.
type migration struct {
	c      *realCluster
	readme readme
	dir    string
	path   string
	steps  []migrateStep
}

func newMigration(t *testing.T, c *realCluster) *migration {
	dir := t.TempDir()
	bins := filepath.Join(dir, "bin")
	deploy, err := filepath.Abs("../deploy")
	if err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{filepath.Join(bins, "kubectl"): c.bins.Kubectl, filepath.Join(bins, "dnsd"): filepath.Join(binDir(t), "dnsd"), filepath.Join(dir, "deploy"): deploy} {
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	return &migration{c: c, readme: readREADME(t), dir: dir, path: bins + ":" + os.Getenv("PATH")}
}

// run runs a command README gives (N: the node's name), failing the test
// if README does not give it or it fails.
func (m *migration) run(ctx context.Context, cmd, node string) string {
	m.c.t.Helper()
	actual := cmd
	if node != "" {
		actual = regexp.MustCompile(`\bN\b`).ReplaceAllString(cmd, node)
	}
	return m.runAs(ctx, cmd, actual)
}

// runWith is run with README's placeholder old replaced by new.
func (m *migration) runWith(ctx context.Context, cmd, old, new string) string {
	m.c.t.Helper()
	return m.runAs(ctx, cmd, strings.ReplaceAll(cmd, old, new))
}

// runAs checks README gives cmd and runs actual, cmd with its
// placeholders filled in.
func (m *migration) runAs(ctx context.Context, cmd, actual string) string {
	t := m.c.t
	t.Helper()
	m.readme.has(t, cmd)
	out, err := m.c.cp.Host.Exec(ctx, "env", "PATH="+m.path, "KUBECONFIG="+m.c.adminKC, "sh", "-c", "cd "+m.dir+" && "+actual)
	if err != nil {
		m.c.fatalf("%s: %v\n%s", actual, err, out)
	}
	t.Logf("$ %s\n%s", actual, strings.TrimSpace(out))
	return out
}

// onNode runs a command README gives to run on the node.
func (m *migration) onNode(ctx context.Context, n *realnode.Node, cmd string) {
	t := m.c.t
	t.Helper()
	m.readme.has(t, cmd)
	out, err := n.Exec(ctx, "sh", "-c", cmd)
	if err != nil {
		m.c.fatalf("%s on %s: %v\n%s", cmd, n.Name, err, out)
	}
	t.Logf("%s$ %s\n%s", n.Name, cmd, strings.TrimSpace(out))
}

// step runs f as one row of the table.
func (m *migration) step(name, drained string, f func()) {
	s := migrateStep{name: name, start: time.Now(), drained: drained}
	f()
	s.end = time.Now()
	m.steps = append(m.steps, s)
	m.c.t.Logf("step %s: %v (%s to %s UTC)", name, s.end.Sub(s.start).Round(100*time.Millisecond),
		s.start.UTC().Format(mixClock), s.end.UTC().Format(mixClock))
}

// mixClock is how podnet-testapp mix stamps a failure (UTC, in its
// container and in the lab's outside namespace alike).
const mixClock = "15:04:05.000"

// stepOf names the step during which a failure line ("fail 15:04:05.000
// ...") was seen, or "outside the steps" (the workload's start, before
// the first step).
func (m *migration) stepOf(failure string) string {
	f := strings.Fields(failure)
	if len(f) > 0 && f[0] != "fail" {
		f = f[1:] // an outside client's line starts with its node
	}
	if len(f) < 2 {
		return "?"
	}
	at, err := time.Parse(mixClock, f[1])
	if err != nil {
		return "?"
	}
	for _, s := range m.steps {
		day := func(t time.Time) time.Time {
			u := t.UTC()
			return time.Date(0, 1, 1, u.Hour(), u.Minute(), u.Second(), u.Nanosecond(), time.UTC)
		}
		if !at.Before(day(s.start)) && at.Before(day(s.end)) {
			return s.name
		}
	}
	return "outside the steps"
}

// waitDaemonSet waits until a DaemonSet has a ready pod on the nodes
// it should, all of the current template.
func (c *realCluster) waitDaemonSet(ns, name string) {
	c.waitFor(4*time.Minute, ns+"/"+name+" rolled out", func(ctx context.Context) (bool, string) {
		d, err := c.admin.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		s := d.Status
		if s.ObservedGeneration < d.Generation || s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberReady != s.DesiredNumberScheduled || s.NumberUnavailable != 0 {
			return false, fmt.Sprintf("%+v", s)
		}
		return true, ""
	})
}

// table prints the steps with what the clients not being drained saw.
func (m *migration) table(pod *mixLog, outside map[string]*mixLog) (string, int) {
	var b strings.Builder
	fmt.Fprintf(&b, "%-34s %9s %9s %9s %9s %9s\n", "stage", "duration", "requests", "failures", "lookups", "failures")
	failed := 0
	for _, s := range m.steps {
		none := func(int64) bool { return false }
		var total mixSecond
		if s.drained != m.c.nodes[len(m.c.nodes)-1].Name {
			total = pod.window(s.start, s.end, none)
		}
		for node, o := range outside {
			if node != s.drained {
				x := o.window(s.start, s.end, none)
				total.httpOK += x.httpOK
				total.httpFailed += x.httpFailed
			}
		}
		failed += total.httpFailed + total.dnsFailed
		fmt.Fprintf(&b, "%-34s %9s %9d %9d %9d %9d\n", s.name, s.end.Sub(s.start).Round(time.Second), total.httpOK+total.httpFailed, total.httpFailed,
			total.dnsOK+total.dnsFailed, total.dnsFailed)
	}
	return b.String(), failed
}

// nodeLeftovers says what of flannel, kube-proxy and CoreDNS a node still
// holds: flannel.1, cni0, iptables KUBE-* chains (kubelet's own canary
// and hint chains aside), of both iptables backends and both families.
func nodeLeftovers(ctx context.Context, n *realnode.Node) []string {
	var left []string
	links, _ := n.Exec(ctx, "ip", "-o", "link", "show")
	for _, l := range []string{"flannel.1", "cni0"} {
		if strings.Contains(links, ": "+l+":") || strings.Contains(links, ": "+l+"@") {
			left = append(left, l)
		}
	}
	for _, save := range []string{"iptables-legacy-save", "iptables-nft-save", "ip6tables-legacy-save", "ip6tables-nft-save"} {
		out, _ := n.Exec(ctx, save)
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, ":KUBE-") && !strings.HasPrefix(l, ":KUBE-KUBELET-CANARY") && !strings.HasPrefix(l, ":KUBE-IPTABLES-HINT") {
				left = append(left, save+" "+strings.Fields(l)[0])
			}
		}
	}
	return left
}

// TestMigrate is make migrate: three real nodes on flannel, kube-proxy and
// CoreDNS move to podnet by README's "Migrating from flannel, kube-proxy
// and CoreDNS", its commands run word for word, under load the whole time:
// the client pod on the node migrated last (HTTP through the ClusterIP,
// 20 lookups a second) and the outside (HTTP to every node's NodePort).
// No request or lookup of a client whose own pod or node is not being
// drained fails; at the end no node holds flannel.1, cni0 or a KUBE-*
// chain and no CoreDNS pod runs; one node rolled back to flannel and
// forward again loses nothing either.
//
// With PODNET_MIGRATE_CONFORMANCE=1 (make migrate MIGRATE_CONFORMANCE=1,
// which passes make conformance's variables), e2e.test's specs run on the
// migrated cluster at the end, as TestConformance runs them on a lab.
func TestMigrate(t *testing.T) {
	e := flannelEnvFromEnv(t)
	conf, confImages := migrateConformance(t)
	c := startRealClusterOpts(t, realNodes(), realClusterOptions{
		extraImages: func(c *realCluster) []string { return append(flannelStackImages(t, t.TempDir(), e), confImages...) },
		install:     installFlannelStack(e),
	})
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Minute)
	defer cancel()
	w := c.startMigrateWorkload(ctx)
	c.checkPodToPod(ctx, w)
	c.checkNames(ctx, w.client)

	podLog := &mixLog{}
	logCtx, stopLog := context.WithCancel(ctx)
	var logs sync.WaitGroup
	logs.Go(func() { c.followClient(logCtx, podLog) })
	outside := c.outsideClients(t, w.nodePort)
	m := newMigration(t, c)
	m.migrate(ctx, c)

	stopLog()
	logs.Wait()
	outLogs := map[string]*mixLog{}
	for node, p := range outside {
		_ = p.Stop()
		l := &mixLog{}
		for _, line := range strings.Split(p.Output(), "\n") {
			l.add(line)
		}
		outLogs[node] = l
	}
	table, failed := m.table(podLog, outLogs)
	t.Logf("make migrate:\n%s", table)
	if failed != 0 {
		var fails []string
		fails = append(fails, podLog.failures...)
		for node, l := range outLogs {
			for _, f := range l.failures {
				fails = append(fails, node+" "+f)
			}
		}
		sort.Strings(fails)
		for i, f := range fails {
			fails[i] = f + "  [" + m.stepOf(f) + "]"
		}
		c.errorf("%d failed requests or lookups from clients not being drained; failures seen (all clients, drained ones too):\n%s", failed, strings.Join(fails, "\n"))
	}
	for _, n := range c.nodes {
		if left := nodeLeftovers(ctx, n); len(left) > 0 {
			c.errorf("%s still holds %v", n.Name, left)
		}
	}
	if pods, err := c.admin.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"}); err != nil {
		t.Fatal(err)
	} else {
		for _, p := range pods.Items {
			if strings.HasPrefix(p.Name, "coredns-") {
				c.errorf("CoreDNS pod %s on %s (%s)", p.Name, p.Spec.NodeName, p.Status.Phase)
			}
		}
	}
	if conf != nil {
		c.runConformance(t, *conf)
	}
}

// migrateConformance is, with PODNET_MIGRATE_CONFORMANCE=1, the
// conformance run make conformance's variables describe and the specs'
// images for the nodes; nil otherwise.
func migrateConformance(t *testing.T) (*conformanceRun, []string) {
	t.Helper()
	if os.Getenv("PODNET_MIGRATE_CONFORMANCE") != "1" {
		return nil, nil
	}
	r := conformanceRunFromEnv(t)
	checkGinkgoVersion(t, r.ginkgo)
	dir := t.TempDir()
	return &r, conformanceImages(t, dir, r.agnhost, r.coredns, buildTestapp(t, dir))
}
