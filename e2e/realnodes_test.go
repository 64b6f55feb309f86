//go:build conformance

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/e2e/image"
	"github.com/podnet/podnet/e2e/lab"
	"github.com/podnet/podnet/e2e/realnode"
)

// realNodes is the lab of make conformance: two nodes on segment A
// (host-gw between them) and one behind the router on segment B (VXLAN).
func realNodes() []lab.NodeSpec {
	return []lab.NodeSpec{
		{Name: "node1", IP: netip.MustParsePrefix("192.168.10.11/24"), Zone: "zone-a"},
		{Name: "node2", IP: netip.MustParsePrefix("192.168.10.12/24"), Zone: "zone-c"},
		{Name: "node3", IP: netip.MustParsePrefix("192.168.20.11/24"), Zone: "zone-b"},
	}
}

// spreadYAML is a Deployment of the test app with one pod per node, a
// NodePort Service in front, and a client pod on every node.
func spreadYAML(nodes []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: %d
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: web}}}
      containers:
        - name: web
          image: %s
          args: [":8080"]
          readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`, len(nodes), testappImage)
	for _, n := range nodes {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata: {name: client-%s, namespace: default, labels: {app: client}}
spec:
  nodeName: %s
  containers:
    - {name: client, image: %s, command: ["/testapp", "pause"]}
`, n, n, testappImage)
	}
	return b.String()
}

// TestRealNodes checks point 4 of the real-node issue on three nodes:
// each node in a zone of its own and with its own host name, pod → pod on every pair of nodes (host-gw and VXLAN), a ClusterIP and a
// NodePort (from outside the cluster), kubectl exec and logs, a rolling
// update of podnet's DaemonSet to a new image under steady Service traffic
// without a failed request, and a node whose kubelet and containerd are
// stopped and restarted getting its pods back without leaking addresses.
func TestRealNodes(t *testing.T) { testRealNodes(t, "") }

// TestRealNodesEBPF is TestRealNodes with the Service proxy in ebpf mode
// (deploy/ebpf): the ClusterIP through socket LB on every node, the
// NodePort through the tc programs on real nodes' uplinks and VXLAN
// devices, the rolling update taking over the pinned maps without a
// failed request, and no Service rule in any node's iptables.
func TestRealNodesEBPF(t *testing.T) { testRealNodes(t, "ebpf") }

// TestRealNodesNFT is TestRealNodes with the Service proxy in nftables mode
// (deploy/nftables, the kustomize variant; TestRealNodeHelm installs the
// chart in this mode on one node): the Services and the node's own rules
// (masquerade, forwarding) in podnet's inet table, proxyd status showing
// it on every node, and no podnet rule in any node's iptables or ip6tables.
func TestRealNodesNFT(t *testing.T) { testRealNodes(t, "nftables") }

// testRealNodes is TestRealNodes with podnet installed from the given
// variant of deploy/ ("", "ebpf" or "nftables").
func testRealNodes(t *testing.T, variant string) {
	c := startRealClusterOpts(t, realNodes(), realClusterOptions{variant: variant})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	names := []string{"node1", "node2", "node3"}
	c.applyYAML(ctx, spreadYAML(names))
	c.waitFor(3*time.Minute, "web on every node and the clients running", func(ctx context.Context) (bool, string) {
		return c.podsReady(ctx, "app=web", 3), ""
	})
	c.waitFor(time.Minute, "clients running", func(ctx context.Context) (bool, string) {
		return c.podsReady(ctx, "app=client", 3), ""
	})
	webs, err := c.admin.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}

	c.checkNodesAsMachines(ctx, len(names))

	t.Run("pod to pod on every pair of nodes", func(t *testing.T) {
		for _, from := range names {
			for _, w := range webs.Items {
				out, err := c.kubectl(ctx, "exec", "client-"+from, "--", "/testapp", "get", "http://"+w.Status.PodIP+":8080/")
				if err != nil || !strings.HasPrefix(out, w.Name+" ") {
					t.Errorf("%s → %s on %s (%s): %q, %v", from, w.Name, w.Spec.NodeName, w.Status.PodIP, out, err)
				}
			}
		}
	})

	svc, err := c.admin.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("ClusterIP and DNS from every node", func(t *testing.T) {
		for _, from := range names {
			out, err := c.kubectl(ctx, "exec", "client-"+from, "--", "/testapp", "resolve", "kubernetes.default")
			if err != nil || strings.TrimSpace(out) != "10.96.0.1" {
				t.Errorf("kubernetes.default from %s: %q, %v", from, out, err)
			}
			seen := map[string]bool{}
			for range 12 {
				out, err := c.kubectl(ctx, "exec", "client-"+from, "--", "/testapp", "get", "http://web/")
				if err != nil {
					t.Errorf("GET http://web/ from %s: %v %s", from, err, out)
					break
				}
				seen[strings.Fields(out)[0]] = true
			}
			if len(seen) < 2 {
				t.Errorf("from %s the ClusterIP %s reached only %v", from, svc.Spec.ClusterIP, seen)
			}
		}
	})

	t.Run("NodePort from outside", func(t *testing.T) {
		port := svc.Spec.Ports[0].NodePort
		for _, n := range c.l.Nodes {
			url := fmt.Sprintf("http://%s:%d/", n.IP, port)
			out, err := c.l.OutsideHost.Exec(ctx, c.testapp, "get", url)
			if err != nil || !strings.HasPrefix(out, "web-") {
				t.Errorf("outside → %s: %q, %v", url, out, err)
			}
		}
	})

	t.Run("kubectl logs", func(t *testing.T) {
		out, err := c.kubectl(ctx, "logs", webs.Items[0].Name)
		if err != nil || !strings.Contains(out, "serving on :8080") {
			t.Errorf("kubectl logs %s: %q, %v", webs.Items[0].Name, out, err)
		}
	})

	if variant == "ebpf" {
		t.Run("no Service rule in any node's iptables", func(t *testing.T) {
			for _, n := range c.nodes {
				out, err := n.Exec(ctx, "iptables-save")
				if err != nil || strings.Contains(out, "PODSVC") || strings.Contains(out, svc.Spec.ClusterIP) {
					c.errorf("iptables-save on %s in ebpf mode: %v\n%s", n.Name, err, out)
				}
			}
		})
	}
	if variant == "nftables" {
		t.Run("the node in nftables, no podnet rule in iptables", func(t *testing.T) {
			c.checkNodesInNFTables(ctx, svc.Spec.ClusterIP)
		})
	}

	t.Run("DaemonSet rolling update under traffic", func(t *testing.T) {
		c.rollingUpdate(ctx, t)
	})

	t.Run("kubelet and containerd restart", func(t *testing.T) {
		c.restartNode(ctx, t, c.nodes[1])
	})
}

// podsReady says whether want pods with the label selector are Running and
// Ready.
func (c *realCluster) podsReady(ctx context.Context, selector string, want int) bool {
	pods, err := c.admin.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return false
	}
	ready := 0
	for _, p := range pods.Items {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
				ready++
			}
		}
	}
	return ready == want
}

var loadResult = regexp.MustCompile(`ok (\d+) failed (\d+)`)

// rollingUpdate moves podnet's DaemonSet to a second tag of the image
// (imported on every node) while a client sends a request through the
// ClusterIP every 20 ms, and wants every one answered.
func (c *realCluster) rollingUpdate(ctx context.Context, t *testing.T) {
	spec, err := dockerfileSpec()
	if err != nil {
		t.Fatal(err)
	}
	tag := "ghcr.io/podnet/podnet:e2e-update"
	tar := filepath.Join(t.TempDir(), "update.tar")
	if err := image.Build(ctx, image.BuildOptions{Spec: spec, Root: filepath.Dir(binDir(t)), Tag: tag, Out: tar, CacheDir: "/var/cache/podnet"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.nodes {
		if out, err := n.Exec(ctx, c.bins.Ctr(), "--address", "/run/containerd/containerd.sock", "-n", "k8s.io", "images", "import", tar); err != nil {
			t.Fatalf("import on %s: %v\n%s", n.Name, err, out)
		}
	}
	load, err := c.cp.Host.Start("load", c.bins.Kubectl, "--kubeconfig="+c.adminKC, "exec", "client-node1", "--",
		"/testapp", "load", "http://web/", "60s")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	start := time.Now()
	if out, err := c.kubectl(ctx, "-n", "podnet-system", "set", "image", "daemonset/podnet-node", "install-cni="+tag, "proxyd="+tag); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := c.kubectl(ctx, "-n", "podnet-system", "rollout", "status", "daemonset/podnet-node", "--timeout=5m"); err != nil {
		t.Fatalf("rollout: %v\n%s", err, out)
	}
	t.Logf("rollout of %d nodes took %v", len(c.nodes), time.Since(start).Round(100*time.Millisecond))
	select {
	case <-load.Done():
	case <-time.After(90 * time.Second):
		t.Fatal("load client did not finish")
	}
	m := loadResult.FindStringSubmatch(load.Output())
	if m == nil {
		t.Fatalf("load client: %s", load.Output())
	}
	ok, _ := strconv.Atoi(m[1])
	t.Logf("during the rollout: %s", strings.TrimSpace(load.Output()))
	if m[2] != "0" || ok < 100 {
		t.Errorf("requests during the rolling update: %s", load.Output())
	}
	ds, err := c.admin.AppsV1().DaemonSets("podnet-system").Get(ctx, "podnet-node", metav1.GetOptions{})
	if err != nil || ds.Status.UpdatedNumberScheduled != int32(len(c.nodes)) || ds.Status.NumberReady != int32(len(c.nodes)) {
		t.Errorf("after the rollout: %+v, %v", ds.Status, err)
	}
}

// restartNode kills a node's kubelet and containerd and, while they are
// down, every process of its web pod (containers and shim: the sandbox is
// lost), starts them again and checks its pods come back reachable, the
// web pod in a new sandbox with an address of the node's podCIDR, with as
// many IPAM allocations, veths and network namespaces as pods of the pod
// network, and the Service still answering.
func (c *realCluster) restartNode(ctx context.Context, t *testing.T, n *realnode.Node) {
	lost := c.webPodOn(ctx, t, n.Name)
	restarts := lost.Status.ContainerStatuses[0].RestartCount
	n.KillKubelet()
	n.KillContainerd()
	killed, err := n.KillPod(string(lost.UID))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %d processes of %s (%s) on %s", killed, lost.Name, lost.Status.PodIP, n.Name)
	time.Sleep(2 * time.Second)
	if err := n.StartContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.StartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitFor(3*time.Minute, "pods of "+n.Name+" ready again, "+lost.Name+" in a new sandbox", func(ctx context.Context) (bool, string) {
		pods, err := c.admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if !podReady(&p) {
				return false, p.Namespace + "/" + p.Name + " not ready"
			}
			if p.UID == lost.UID && p.Status.ContainerStatuses[0].RestartCount <= restarts {
				return false, p.Name + " not restarted yet"
			}
		}
		return true, ""
	})
	back := c.webPodOn(ctx, t, n.Name)
	node, err := c.admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podCIDR, err := netip.ParsePrefix(node.Spec.PodCIDR)
	if err != nil {
		t.Fatal(err)
	}
	if a, err := netip.ParseAddr(back.Status.PodIP); back.UID != lost.UID || err != nil || !podCIDR.Contains(a) {
		t.Errorf("after the restart %s (uid %s) has address %q, want the same pod with one of %v", back.Name, back.UID, back.Status.PodIP, podCIDR)
	}
	t.Logf("%s: %s before, %s after (restarts %d → %d)", lost.Name, lost.Status.PodIP, back.Status.PodIP, restarts, back.Status.ContainerStatuses[0].RestartCount)
	// The pods' status may still be the old kubelet's: the new one is up
	// once its API answers an exec again.
	c.waitFor(time.Minute, "GET http://web/ from client-"+n.Name+" after the restart", func(ctx context.Context) (bool, string) {
		out, err := c.kubectl(ctx, "exec", "client-"+n.Name, "--", "/testapp", "get", "http://web/")
		return err == nil && strings.HasPrefix(out, "web-"), fmt.Sprintf("%q, %v", out, err)
	})
	c.waitFor(time.Minute, "GET "+back.Name+" at "+back.Status.PodIP+" from client-node1", func(ctx context.Context) (bool, string) {
		out, err := c.kubectl(ctx, "exec", "client-node1", "--", "/testapp", "get", "http://"+back.Status.PodIP+":8080/")
		return err == nil && strings.HasPrefix(out, back.Name+" "), fmt.Sprintf("%q, %v", out, err)
	})
	c.waitFor(time.Minute, "allocations, veths and netns of "+n.Name+" match its pods", func(ctx context.Context) (bool, string) {
		return c.nodeLeaks(ctx, n)
	})
}

// webPodOn is the web Deployment's pod on the node.
func (c *realCluster) webPodOn(ctx context.Context, t *testing.T, node string) *corev1.Pod {
	t.Helper()
	pods, err := c.admin.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web", FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 {
		t.Fatalf("the web pod on %s: %v, %v", node, pods, err)
	}
	return &pods.Items[0]
}

// nodeLeaks says whether the node holds one IPAM allocation, one veth on
// cbr0 and one network namespace per pod of the pod network, and what it
// holds.
func (c *realCluster) nodeLeaks(ctx context.Context, n *realnode.Node) (bool, string) {
	pods, err := c.admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return false, err.Error()
	}
	want := 0
	for _, p := range pods.Items {
		if !p.Spec.HostNetwork {
			want++
		}
	}
	data, err := n.Exec(ctx, "cat", "/var/lib/podnet/ipam/podnet/allocations.json")
	if err != nil {
		return false, err.Error()
	}
	var st struct {
		Allocations []json.RawMessage `json:"allocations"`
	}
	if err := json.Unmarshal([]byte(data), &st); err != nil {
		return false, err.Error()
	}
	count := func(args ...string) (int, error) {
		out, err := n.Exec(ctx, args...)
		return len(strings.Fields(out)), err
	}
	veths, err := count("sh", "-c", "ip -o link show master cbr0 | cut -d: -f2")
	if err != nil {
		return false, err.Error()
	}
	netns, err := count("ls", "/run/netns")
	if err != nil {
		return false, err.Error()
	}
	return len(st.Allocations) == want && veths == want && netns == want,
		fmt.Sprintf("%d pods, %d allocations, %d veths, %d netns", want, len(st.Allocations), veths, netns)
}

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase == corev1.PodSucceeded {
		return true
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// binDir is $PODNET_BIN, the directory make build fills.
func binDir(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("PODNET_BIN")
	if bin == "" {
		t.Fatal("$PODNET_BIN is unset: run with make")
	}
	if filepath.Base(bin) == "podnet" {
		bin = filepath.Dir(bin)
	}
	return bin
}

// checkNodesInNFTables checks a cluster installed from deploy/nftables:
// on every node neither iptables nor ip6tables (either backend) holds a
// podnet chain, a Service rule or the Service's cluster IP, while proxyd
// status in that node's podnet-node pod shows podnet's inet table holding
// the Service and finds nothing the kernel's table and proxyd disagree on.
func (c *realCluster) checkNodesInNFTables(ctx context.Context, clusterIP string) {
	for _, n := range c.nodes {
		for _, save := range []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
			out, err := n.Exec(ctx, save)
			if err != nil || strings.Contains(out, "PODSVC") || strings.Contains(out, "PODNET") || strings.Contains(out, clusterIP) {
				c.errorf("%s on %s in nftables mode: %v\n%s", save, n.Name, err, out)
			}
		}
		pods, err := c.admin.CoreV1().Pods("podnet-system").List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=podnet-node", FieldSelector: "spec.nodeName=" + n.Name})
		if err != nil || len(pods.Items) != 1 {
			c.errorf("the podnet-node pod on %s: %v, %v", n.Name, pods, err)
			continue
		}
		pod := pods.Items[0].Name
		out, err := c.kubectl(ctx, "-n", "podnet-system", "exec", pod, "-c", "proxyd", "--", "proxyd", "status")
		if err != nil || !strings.Contains(out, "nftables table inet podnet:") || !strings.Contains(out, clusterIP) ||
			strings.Contains(out, "Problems in the table") || strings.Contains(out, "Differences from proxyd's report") {
			c.errorf("proxyd status on %s (%s): %v\n%s", n.Name, pod, err, out)
		}
	}
}
