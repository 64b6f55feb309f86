package e2e

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/nodestatus"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/apiserver"
	"github.com/podnet/podnet/e2e/image"
	"github.com/podnet/podnet/e2e/lab"
	"github.com/podnet/podnet/e2e/realnode"
)

// Images of the real-node lab besides podnet's own: one static test binary
// (e2e/cmd/podnet-testapp) as the sandbox's pause and as the workload.
const (
	pauseImage   = "localhost/podnet-e2e/pause:1"
	testappImage = "localhost/podnet-e2e/testapp:1"
)

// realCluster is a control plane (etcd, kube-apiserver with Node
// authorization, kube-controller-manager allocating podCIDRs,
// kube-scheduler) and real nodes, with podnet installed by kubectl apply -k.
type realCluster struct {
	t       *testing.T
	l       *lab.Lab
	cp      *lab.ControlPlane
	srv     *apiserver.Server
	admin   kubernetes.Interface
	bins    realnode.Binaries
	nodes   []*realnode.Node
	adminKC string
	procs   []*lab.Proc
	// testapp is the static test binary of the images, runnable in any
	// lab namespace too.
	testapp string
	// failures are the test's own failure messages, said again after the
	// node and control plane logs so that the end of the output names them.
	failures []string
	// dualStack is realClusterOptions.dualStack.
	dualStack bool
}

// errorf fails the test as t.Errorf does and keeps the message for the
// summary after the logs.
func (c *realCluster) errorf(format string, args ...any) {
	c.t.Helper()
	msg := fmt.Sprintf(format, args...)
	c.failures = append(c.failures, msg)
	c.t.Error(msg)
}

// fatalf is errorf, then t.FailNow.
func (c *realCluster) fatalf(format string, args ...any) {
	c.t.Helper()
	c.errorf(format, args...)
	c.t.FailNow()
}

// startRealCluster builds the cluster on the given lab nodes and installs
// podnet exactly as README says: the podnet-apiserver ConfigMap, then
// kubectl apply -k with the image tag set in a kustomization over deploy/.
func startRealCluster(t *testing.T, nodes []lab.NodeSpec) *realCluster {
	return startRealClusterWith(t, nodes, nil)
}

// startRealClusterWith is startRealCluster with more images for the nodes,
// built by extraImages once the control plane is up.
func startRealClusterWith(t *testing.T, nodes []lab.NodeSpec, extraImages func(*realCluster) []string) *realCluster {
	return startRealClusterOpts(t, nodes, realClusterOptions{extraImages: extraImages})
}

// realClusterOptions are what a real cluster gets beyond its nodes.
type realClusterOptions struct {
	// extraImages builds more images for the nodes once the control
	// plane is up.
	extraImages func(*realCluster) []string
	// variant is the kustomization of deploy/ installed: "" for deploy/
	// itself, "ebpf" for deploy/ebpf.
	variant string
	// users are more identities of the API server (name → group).
	users map[string]string
	// install puts the network on the started nodes instead of
	// installPodnet.
	install func(ctx context.Context, c *realCluster, podnetTar string)
	// dualStack makes the cluster dual-stack, IPv4 first: the lab's ULA
	// underlay beside its IPv4 one (lab.Options.Families), kube-apiserver's
	// and kube-controller-manager's --service-cluster-ip-range and
	// kube-controller-manager's --cluster-cidr of both families (a /24 and
	// a /64 per node), each kubelet's --node-ip of both, and podnet's
	// --cluster-cidr of both (applyPodnet).
	dualStack bool
}

// serviceCIDR6 is a dual-stack cluster's IPv6 Service range.
const serviceCIDR6 = "fd00:10:96::/112"

// families are the cluster's address families, IPv4 first.
func (c *realCluster) families() []ipfamily.Family {
	if c.dualStack {
		return []ipfamily.Family{ipfamily.IPv4, ipfamily.IPv6}
	}
	return []ipfamily.Family{ipfamily.IPv4}
}

// clusterCIDRs is the cluster's --cluster-cidr: one prefix per family.
func (c *realCluster) clusterCIDRs() string {
	if c.dualStack {
		return lab.ClusterCIDR.String() + "," + lab.ClusterCIDR6.String()
	}
	return lab.ClusterCIDR.String()
}

// serviceCIDRs is the cluster's --service-cluster-ip-range.
func (c *realCluster) serviceCIDRs() string {
	if c.dualStack {
		return apiserver.ServiceCIDR + "," + serviceCIDR6
	}
	return apiserver.ServiceCIDR
}

// nodeCIDRMaskSize is kube-controller-manager's flag for the size of a
// node's podCIDRs: a /24 of IPv4 and, in a dual-stack cluster, a /64 of
// IPv6 (which the single-family flag may not be given with).
func (c *realCluster) nodeCIDRMaskSize() []string {
	if c.dualStack {
		return []string{"--node-cidr-mask-size-ipv4=24", "--node-cidr-mask-size-ipv6=64"}
	}
	return []string{"--node-cidr-mask-size=24"}
}

// nodeIPs are a lab node's kubelet --node-ip: its address of each family.
func (c *realCluster) nodeIPs(ln *lab.Node) []netip.Addr {
	if c.dualStack {
		return []netip.Addr{ln.IP, ln.IP6}
	}
	return []netip.Addr{ln.IP}
}

// dualStackKustomization gives podnet's node agent and its sysctls init
// container the cluster CIDRs of both families: flags appended after the
// base's (the last of a repeated flag wins); the test ops fail the
// kustomization if the containers are no longer the ones meant.
func dualStackKustomization(clusterCIDRs string) string {
	return fmt.Sprintf(`  - target: {kind: DaemonSet, name: podnet-node}
    patch: |-
      - {op: test, path: /spec/template/spec/initContainers/0/name, value: sysctls}
      - {op: add, path: /spec/template/spec/initContainers/0/command/-, value: "--cluster-cidr=%[1]s"}
      - {op: test, path: /spec/template/spec/containers/0/name, value: proxyd}
      - {op: add, path: /spec/template/spec/containers/0/command/-, value: "--cluster-cidr=%[1]s"}
`, clusterCIDRs)
}

func startRealClusterOpts(t *testing.T, nodes []lab.NodeSpec, o realClusterOptions) *realCluster {
	roottest.Require(t)
	bins, err := realnode.FindBinaries()
	if err != nil {
		t.Fatal(err)
	}
	apiBin, err := apiserver.Binary()
	if err != nil {
		t.Fatal(err)
	}
	podnetTar := podnetImage(t)
	checkHostUntouched(t)
	c := &realCluster{t: t, bins: bins, dualStack: o.dualStack}
	// Registered first, so it runs last: after every log dump.
	t.Cleanup(func() {
		if t.Failed() && len(c.failures) > 0 {
			t.Logf("FAILED (said again after the logs):\n%s", strings.Join(c.failures, "\n"))
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()

	l := lab.Start(t, lab.Options{Nodes: nodes, Families: c.families()})
	cp, err := lab.NewControlPlane(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Close() })
	detach, err := l.Attach(cp, kubeAPIAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { detach() })
	users := map[string]string{}
	for _, n := range l.Nodes {
		users["system:node:"+n.Name] = "system:nodes"
	}
	for u, g := range o.users {
		users[u] = g
	}
	srv, err := apiserver.Start(ctx, apiserver.Options{
		NSPath:            cp.NSPath(),
		Start:             func(name string, args ...string) (apiserver.Process, error) { return cp.Host.Start(name, args...) },
		Dir:               filepath.Join(cp.Dir, "apiserver"),
		AdvertiseAddress:  kubeAPIAddr.Addr(),
		Binary:            apiBin,
		Users:             users,
		AuthorizationMode: "Node,RBAC",
		ExtraArgs: []string{
			"--enable-admission-plugins=NodeRestriction",
			// No DNS for node names in the lab.
			"--kubelet-preferred-address-types=InternalIP",
			// After apiserver's own (the last wins): both families
			// in a dual-stack cluster.
			"--service-cluster-ip-range=" + c.serviceCIDRs(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	c.l, c.cp, c.srv = l, cp, srv
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane logs:\n%s", srv.Logs())
			for _, p := range c.procs {
				out := p.Output()
				t.Logf("=== %s\n%s", "controller", out[max(0, len(out)-4000):])
			}
		}
		srv.Close()
	})
	if c.admin, err = srv.Client(apiserver.Admin); err != nil {
		t.Fatal(err)
	}
	c.adminKC = filepath.Join(cp.Dir, "admin.kubeconfig")
	if err := srv.WriteKubeconfig(c.adminKC, apiserver.Admin, netip.MustParseAddr("127.0.0.1")); err != nil {
		t.Fatal(err)
	}
	c.startControllers()

	imgDir := t.TempDir()
	images := c.testImages(imgDir)
	if o.extraImages != nil {
		images = append(images, o.extraImages(c)...)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(l.Nodes))
	c.nodes = make([]*realnode.Node, len(l.Nodes))
	for i, ln := range l.Nodes {
		kc := filepath.Join(ln.Dir, "kubelet.kubeconfig")
		if err := srv.WriteKubeconfig(kc, "system:node:"+ln.Name, kubeAPIAddr.Addr()); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			c.nodes[i], errs[i] = realnode.Start(ctx, ln, l.Prefix, realnode.NodeOptions{
				Binaries:   bins,
				Kubeconfig: kc,
				Images:     append([]string{podnetTar}, images...),
				PauseImage: pauseImage,
				Nameserver: l.OutsideIP.String(),
				Logf:       t.Logf,
				NodeIPs:    c.nodeIPs(ln),
			})
		})
	}
	wg.Wait()
	// Registered after the lab's cleanup, so it runs before it: the node's
	// processes end and its cgroup v1 roots go before the lab removes the
	// rest.
	for _, n := range c.nodes {
		if n == nil {
			continue
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("%s", n.Logs())
			}
			if err := n.Close(); err != nil {
				t.Errorf("close node %s: %v", n.Name, err)
			}
		})
	}
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if o.install != nil {
		o.install(ctx, c, podnetTar)
	} else {
		c.installPodnet(ctx, podnetTar, o.variant)
	}
	c.routePodCIDRs(ctx)
	return c
}

// routePodCIDRs gives the control plane's namespace a route to every
// node's podCIDRs (through the router for nodes on other segments), as a
// control plane on a node of the cluster has: the API server proxies to pods
// (pods/proxy, which the conformance DNS tests read their results through).
func (c *realCluster) routePodCIDRs(ctx context.Context) {
	c.t.Helper()
	var seg lab.Segment
	for _, s := range c.l.Segments {
		if s.Subnet == kubeAPIAddr.Masked() {
			seg = s
		}
	}
	for _, ln := range c.l.Nodes {
		node, err := c.admin.CoreV1().Nodes().Get(ctx, ln.Name, metav1.GetOptions{})
		if err != nil || node.Spec.PodCIDR == "" || len(node.Spec.PodCIDRs) != len(c.families()) {
			c.t.Fatalf("podCIDRs of %s: %q, %v; want one per family of %v", ln.Name, node.Spec.PodCIDRs, err, c.families())
		}
		for _, cidr := range node.Spec.PodCIDRs {
			nodeIP, gw := ln.IP, seg.Gateway
			if strings.Contains(cidr, ":") {
				nodeIP, gw = ln.IP6, seg.Gateway6()
			}
			via := nodeIP.String()
			if !seg.Subnet.Contains(ln.IP) {
				via = gw.String()
				if out, err := exec.CommandContext(ctx, "ip", "-n", c.l.Router, "route", "replace", cidr, "via", nodeIP.String()).CombinedOutput(); err != nil {
					c.t.Fatalf("route %s in the router: %v %s", cidr, err, out)
				}
			}
			if out, err := exec.CommandContext(ctx, "ip", "-n", c.cp.Host.NS, "route", "replace", cidr, "via", via).CombinedOutput(); err != nil {
				c.t.Fatalf("route %s in the control plane: %v %s", cidr, err, out)
			}
		}
	}
}

// hostPaths are what a kubelet, containerd, kube-controller-manager or the
// DaemonSet would create on a node's host; host-wide sysctls the kubelet
// sets. None may change on the machine running the lab.
var (
	hostPaths = []string{"/etc/cni", "/opt/cni", "/var/lib/kubelet", "/var/lib/containerd", "/var/lib/podnet",
		"/run/podnet", "/run/containerd", "/var/log/pods", "/var/log/containers", "/usr/libexec/kubernetes",
		"/etc/kubernetes", "/usr/lib/modules", "/run/xtables.lock"}
	hostSysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
		"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}
)

// checkHostUntouched records hostPaths and hostSysctls now and, after every
// other cleanup of the test, fails it if any differs.
func checkHostUntouched(t *testing.T) {
	snapshot := func() map[string]string {
		m := map[string]string{}
		for _, p := range hostPaths {
			_, err := os.Lstat(p)
			m[p] = fmt.Sprint(err == nil)
		}
		for _, s := range hostSysctls {
			b, _ := os.ReadFile("/proc/sys/" + s)
			m[s] = strings.TrimSpace(string(b))
		}
		return m
	}
	before := snapshot()
	t.Cleanup(func() {
		for k, v := range snapshot() {
			if v != before[k] {
				t.Errorf("the host's %s changed: %s, was %s", k, v, before[k])
			}
		}
	})
}

// startControllers runs kube-controller-manager (podCIDRs from
// 10.244.0.0/16, and from fd00:10:244::/56 in a dual-stack cluster;
// kube-root-ca.crt for pods' service-account volumes) and kube-scheduler
// in the control plane's namespace.
func (c *realCluster) startControllers() {
	c.t.Helper()
	for _, args := range [][]string{
		append([]string{c.bins.ControllerManager, "--kubeconfig=" + c.adminKC, "--leader-elect=false",
			"--allocate-node-cidrs", "--cluster-cidr=" + c.clusterCIDRs(),
			"--service-cluster-ip-range=" + c.serviceCIDRs(),
			"--root-ca-file=" + c.srv.CertFile(), "--service-account-private-key-file=" + c.srv.SAKeyFile(),
			"--use-service-account-credentials=false", "--v=0",
			// Its default is under /usr/libexec, on the host.
			"--flex-volume-plugin-dir=" + filepath.Join(c.cp.Dir, "flexvolume")}, c.nodeCIDRMaskSize()...),
		{c.bins.Scheduler, "--kubeconfig=" + c.adminKC, "--leader-elect=false", "--v=0"},
	} {
		p, err := c.cp.Host.Start(filepath.Base(args[0]), args...)
		if err != nil {
			c.t.Fatal(err)
		}
		c.procs = append(c.procs, p)
	}
}

// testImages writes the pause and test-app images (one static binary,
// built for the test) and returns their tarballs.
func (c *realCluster) testImages(dir string) []string {
	c.t.Helper()
	bin := buildTestapp(c.t, dir)
	c.testapp = bin
	var out []string
	for _, img := range []struct{ tag, cmd string }{{pauseImage, "pause"}, {testappImage, "serve"}} {
		path := filepath.Join(dir, strings.ReplaceAll(filepath.Base(img.tag), ":", "-")+".tar")
		err := image.Build(c.t.Context(), image.BuildOptions{
			Spec: image.Spec{
				Files:      []image.File{{Src: bin, Dst: "/testapp", Mode: 0o755}},
				Entrypoint: []string{"/testapp", img.cmd},
			},
			Tag: img.tag, Out: path,
		})
		if err != nil {
			c.t.Fatal(err)
		}
		out = append(out, path)
	}
	return out
}

// buildTestapp builds e2e/cmd/podnet-testapp, static, into dir.
func buildTestapp(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "podnet-testapp")
	if out, err := goCmd("build", "-trimpath", "-o", bin, "./cmd/podnet-testapp"); err != nil {
		t.Fatalf("build podnet-testapp: %v\n%s", err, out)
	}
	return bin
}

// goCmd runs the go command (static builds, as the Makefile's).
func goCmd(args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// kubectl runs kubectl as the admin inside the control plane's namespace
// (never from the host's) and returns its output.
func (c *realCluster) kubectl(ctx context.Context, args ...string) (string, error) {
	return c.cp.Host.Exec(ctx, append([]string{c.bins.Kubectl, "--kubeconfig=" + c.adminKC}, args...)...)
}

// installPodnet does what README's "Deploy on a cluster" says, with the
// given variant of deploy/ ("ebpf": README, "Service proxy in ebpf mode").
func (c *realCluster) installPodnet(ctx context.Context, imageTar string, variant string) {
	c.applyPodnet(ctx, imageTar, variant, "")
	c.waitNetworkUp("podnet-dns")
}

// applyPodnet creates the podnet-apiserver ConfigMap and applies a
// kustomization over deploy/ (or its variant, deploy/ebpf) that sets the
// image's tag, with more kustomization text (patches) after it.
func (c *realCluster) applyPodnet(ctx context.Context, imageTar string, variant string, moreKustomization string) {
	t := c.t
	t.Helper()
	repo, tag := imageRepoTag(t, imageTar)
	deploy, err := filepath.Abs(filepath.Join("../deploy", variant))
	if err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(c.cp.Dir, "deploy-overlay")
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(overlay, deploy)
	if err != nil {
		t.Fatal(err)
	}
	kust := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\nimages:\n  - name: %s\n    newTag: %q\n", rel, repo, tag)
	if c.dualStack {
		// One patches list: the dual-stack patch first, then those of
		// moreKustomization.
		kust += "patches:\n" + dualStackKustomization(c.clusterCIDRs())
		moreKustomization = strings.TrimPrefix(moreKustomization, "patches:\n")
		if strings.Contains(moreKustomization, "patches:") {
			t.Fatalf("more kustomization with patches not first: %q", moreKustomization)
		}
	}
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kust+moreKustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	c.createAPIServerConfigMap(ctx)
	if out, err := c.kubectl(ctx, "apply", "-k", overlay); err != nil {
		t.Fatalf("kubectl apply -k: %v\n%s", err, out)
	}
}

// imageRepoTag is the repository and tag of the one image in a
// docker-archive tarball.
func imageRepoTag(t *testing.T, imageTar string) (repo, tag string) {
	t.Helper()
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(imageTar) })
	if err != nil || len(m) != 1 || len(m[0].RepoTags) != 1 {
		t.Fatalf("podnet image manifest %v: %v", m, err)
	}
	repo, tag, _ = strings.Cut(m[0].RepoTags[0], ":")
	return repo, tag
}

// createAPIServerConfigMap does what README's prerequisites say: podnet's
// namespace and the podnet-apiserver ConfigMap telling proxyd where the
// API server is.
func (c *realCluster) createAPIServerConfigMap(ctx context.Context) {
	c.t.Helper()
	if out, err := c.kubectl(ctx, "create", "namespace", "podnet-system"); err != nil {
		c.t.Fatalf("%v\n%s", err, out)
	}
	if out, err := c.kubectl(ctx, "-n", "podnet-system", "create", "configmap", "podnet-apiserver",
		"--from-literal=KUBERNETES_SERVICE_HOST="+kubeAPIAddr.Addr().String(), "--from-literal=KUBERNETES_SERVICE_PORT=6443"); err != nil {
		c.t.Fatalf("%v\n%s", err, out)
	}
}

// waitNetworkUp waits for every node Ready, podnet's DaemonSet ready on
// each and every replica of the cluster DNS Deployment of kube-system.
func (c *realCluster) waitNetworkUp(dnsDeployment string) {
	c.waitFor(3*time.Minute, "every node Ready and podnet's DaemonSet and DNS Deployment available", func(ctx context.Context) (bool, string) {
		nodes, err := c.admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(nodes.Items) != len(c.nodes) {
			return false, fmt.Sprintf("nodes: %v (%v)", nodeNames(nodes), err)
		}
		for _, n := range nodes.Items {
			if !nodeReady(&n) {
				return false, "node " + n.Name + " not Ready"
			}
		}
		ds, err := c.admin.AppsV1().DaemonSets("podnet-system").Get(ctx, "podnet-node", metav1.GetOptions{})
		if err != nil || ds.Status.NumberReady != int32(len(c.nodes)) {
			return false, fmt.Sprintf("daemonset: %v", err)
		}
		// Every replica: a pod's lookups go to any of them.
		d, err := c.admin.AppsV1().Deployments("kube-system").Get(ctx, dnsDeployment, metav1.GetOptions{})
		if err != nil || d.Spec.Replicas == nil || d.Status.ReadyReplicas != *d.Spec.Replicas {
			return false, fmt.Sprintf("%s: %v", dnsDeployment, err)
		}
		return true, ""
	})
}

func nodeNames(l *corev1.NodeList) []string {
	if l == nil {
		return nil
	}
	var out []string
	for _, n := range l.Items {
		out = append(out, n.Name)
	}
	return out
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitFor polls cond (each call bounded to 10 s) until it holds; on timeout
// the test fails with the last reason and a kubectl view of the pods.
func (c *realCluster) waitFor(timeout time.Duration, what string, cond func(context.Context) (bool, string)) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	var why string
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(c.t.Context(), 10*time.Second)
		ok, reason := cond(ctx)
		cancel()
		if ok {
			return
		}
		why = reason
		time.Sleep(time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pods, _ := c.kubectl(ctx, "get", "pods", "-A", "-o", "wide")
	events, _ := c.kubectl(ctx, "get", "events", "-A")
	// podnet's own pods say why they are not up, also from before a restart.
	var logs strings.Builder
	for _, q := range [][]string{{"kube-system", "app.kubernetes.io/name=podnet-dns"}, {"podnet-system", "app.kubernetes.io/name=podnet-node"}} {
		for _, prev := range []string{"--previous=false", "--previous=true"} {
			out, _ := c.kubectl(ctx, "-n", q[0], "logs", "-l", q[1], "--all-containers", "--prefix", "--tail=15", prev)
			fmt.Fprintf(&logs, "=== logs %s %s\n%s\n", q[1], prev, out)
		}
	}
	c.t.Logf("pods:\n%s\nevents:\n%s\n%s", pods, events, logs.String())
	c.fatalf("%s: not after %v (%s)", what, timeout, why)
}

// applyYAML applies objects through kubectl.
func (c *realCluster) applyYAML(ctx context.Context, text string) {
	c.t.Helper()
	f := filepath.Join(c.cp.Dir, fmt.Sprintf("apply-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
		c.t.Fatal(err)
	}
	if out, err := c.kubectl(ctx, "apply", "-f", f); err != nil {
		c.t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
}

// webYAML is a Deployment of the test app behind a ClusterIP Service, and a
// client pod to exec into, on the given node (empty: anywhere).
func webYAML(replicas int, clientNode string) string {
	node := ""
	if clientNode != "" {
		node = "  nodeName: " + clientNode + "\n"
	}
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: %d
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - name: web
          image: %s
          args: [":8080"]
          ports: [{containerPort: 8080}]
          readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
spec:
%s  containers:
    - name: client
      image: %s
      command: ["/testapp", "pause"]
`, replicas, testappImage, node, testappImage)
}

// startWeb applies webYAML with two replicas and waits for them, the
// client, and both in the Service's EndpointSlices.
func (c *realCluster) startWeb(ctx context.Context) {
	c.t.Helper()
	c.applyYAML(ctx, webYAML(2, ""))
	c.waitFor(2*time.Minute, "web ready and client running", func(ctx context.Context) (bool, string) {
		d, err := c.admin.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil || d.Status.ReadyReplicas != 2 {
			return false, fmt.Sprintf("web: %v", err)
		}
		p, err := c.admin.CoreV1().Pods("default").Get(ctx, "client", metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning {
			return false, fmt.Sprintf("client: %v", err)
		}
		// Ready pods reach the Service's EndpointSlices a little later
		// (kube-controller-manager), and proxyd after them.
		eps, err := c.admin.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=web"})
		if err != nil {
			return false, fmt.Sprintf("web's EndpointSlices: %v", err)
		}
		ready := 0
		for _, s := range eps.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					ready++
				}
			}
		}
		if ready != 2 {
			return false, fmt.Sprintf("web's EndpointSlices hold %d ready endpoints", ready)
		}
		return true, ""
	})
}

// execUntil runs kubectl with args until ok holds for its output, for at
// most 10 s (a change reaches proxyd's rules within its 1 s minimum sync
// interval), and returns the last output.
func (c *realCluster) execUntil(ctx context.Context, ok func(out string, err error) bool, args ...string) (string, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := c.kubectl(ctx, args...)
		if ok(out, err) || time.Now().After(deadline) {
			return out, err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// checkWeb has the client pod of startWeb resolve kubernetes.default and
// the web Service through 10.96.0.10 and GET the Service by its name.
func (c *realCluster) checkWeb(ctx context.Context) {
	t := c.t
	t.Helper()
	out, err := c.kubectl(ctx, "exec", "client", "--", "/testapp", "resolve", "kubernetes.default")
	if err != nil || strings.TrimSpace(out) != "10.96.0.1" {
		c.errorf("kubernetes.default from a pod: %q, %v; want 10.96.0.1", out, err)
	}
	svc, err := c.admin.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, err = c.kubectl(ctx, "exec", "client", "--", "/testapp", "resolve", "web")
	if err != nil || strings.TrimSpace(out) != svc.Spec.ClusterIP {
		c.errorf("web from a pod: %q, %v; want the ClusterIP %s", out, err, svc.Spec.ClusterIP)
	}
	out, err = c.execUntil(ctx, func(out string, err error) bool { return err == nil && strings.HasPrefix(out, "web-") },
		"exec", "client", "--", "/testapp", "get", "http://web.default.svc.cluster.local/")
	if err != nil || !strings.HasPrefix(out, "web-") {
		c.errorf("GET http://web.default.svc.cluster.local/ from a pod: %q, %v; want a web pod's answer", out, err)
	}
}

// TestRealNodeSmoke is the short real-node test of make test: one kubelet +
// containerd node, podnet installed with kubectl apply -k deploy/ (the
// DaemonSet's init container installs the plugin and loopback, containerd
// calls podnet for every sandbox, proxyd and dnsd run as pods), then a pod
// resolves a Service's name through 10.96.0.10 and reaches it.
func TestRealNodeSmoke(t *testing.T) {
	c := startRealCluster(t, []lab.NodeSpec{{Name: "node1", IP: netip.MustParsePrefix("192.168.10.11/24")}})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c.startWeb(ctx)
	pods, err := c.admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podCIDR := netip.MustParsePrefix("10.244.0.0/16")
	for _, p := range pods.Items {
		if p.Spec.HostNetwork || p.Status.Phase != corev1.PodRunning {
			continue
		}
		a, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !podCIDR.Contains(a) {
			c.errorf("pod %s/%s has address %q, want one from %v", p.Namespace, p.Name, p.Status.PodIP, podCIDR)
		}
	}
	// The node started with forwarding off; the DaemonSet's privileged init
	// container turns it on, and proxyd, whose /proc/sys is read-only,
	// finds it set.
	if fwd, err := c.nodes[0].Exec(ctx, "cat", "/proc/sys/net/ipv4/ip_forward"); err != nil || strings.TrimSpace(fwd) != "1" {
		logs, _ := c.kubectl(ctx, "-n", "podnet-system", "logs", "daemonset/podnet-node", "-c", "sysctls")
		c.errorf("ip_forward on the node: %q, %v; proxyd init says:\n%s", fwd, err, logs)
	}
	c.checkProxydProcSysReadOnly(ctx)
	c.checkNodesAsMachines(ctx, 1)
	c.checkNodeRBAC(ctx)
	c.checkWeb(ctx)
	// The API server reaches pods too (pods/proxy), as on a control plane node.
	out, err := c.kubectl(ctx, "get", "--raw", "/api/v1/namespaces/default/services/web:80/proxy/")
	if err != nil || !strings.HasPrefix(out, "web-") {
		c.errorf("the web Service through the API server's proxy: %q, %v", out, err)
	}
}

// checkProxydProcSysReadOnly: proxyd runs with /proc/sys mounted read-only
// (an unprivileged container's) and still has nothing to complain about.
func (c *realCluster) checkProxydProcSysReadOnly(ctx context.Context) {
	c.t.Helper()
	inProxyd := func(args ...string) (string, error) {
		return c.kubectl(ctx, append([]string{"-n", "podnet-system", "exec", "daemonset/podnet-node", "-c", "proxyd", "--"}, args...)...)
	}
	mounts, err := inProxyd("cat", "/proc/self/mountinfo")
	if err != nil {
		c.fatalf("mountinfo of proxyd's container: %v\n%s", err, mounts)
	}
	var opts string
	for line := range strings.Lines(mounts) {
		// ID parent major:minor root mountpoint options ...
		if f := strings.Fields(line); len(f) > 5 && f[4] == "/proc/sys" {
			opts = f[5]
		}
	}
	if !slices.Contains(strings.Split(opts, ","), "ro") {
		c.errorf("/proc/sys in proxyd's container has options %q, want a read-only mount", opts)
	}
	if out, err := inProxyd("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"); err == nil || !strings.Contains(out, "Read-only file system") {
		c.errorf("writing ip_forward in proxyd's container: %v %q, want it refused as read-only", err, out)
	}
	logs, err := c.kubectl(ctx, "-n", "podnet-system", "logs", "daemonset/podnet-node", "-c", "proxyd")
	if err != nil || strings.Contains(logs, "sysctl") {
		c.errorf("proxyd's log mentions a sysctl (%v):\n%s", err, logs)
	}
}

// checkNodesAsMachines checks what a real cluster's nodes have and the lab
// gives them: each Node carries its lab node's topology.kubernetes.io/zone
// (zones distinct zones in all: the topology and trafficDistribution specs
// skip without them), and a host-network pod on each node (podnet's
// proxyd) has the node's name as its host name, the node's own UTS
// namespace, not the machine's that runs the lab.
func (c *realCluster) checkNodesAsMachines(ctx context.Context, zones int) {
	c.t.Helper()
	seen := map[string]bool{}
	for _, n := range c.nodes {
		node, err := c.admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			c.errorf("node %s: %v", n.Name, err)
			continue
		}
		zone := node.Labels[corev1.LabelTopologyZone]
		if zone == "" || zone != n.Zone {
			c.errorf("node %s: %s=%q, want %q", n.Name, corev1.LabelTopologyZone, zone, n.Zone)
		}
		seen[zone] = true
		pods, err := c.admin.CoreV1().Pods("podnet-system").List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=podnet-node", FieldSelector: "spec.nodeName=" + n.Name})
		if err != nil || len(pods.Items) != 1 || !pods.Items[0].Spec.HostNetwork {
			c.errorf("the host-network podnet-node pod on %s: %v, %v", n.Name, pods, err)
			continue
		}
		host, err := c.kubectl(ctx, "-n", "podnet-system", "exec", pods.Items[0].Name, "-c", "proxyd", "--", "cat", "/proc/sys/kernel/hostname")
		if err != nil || strings.TrimSpace(host) != n.Name {
			c.errorf("host name in the host-network pod %s on %s: %q, %v; want the node's name", pods.Items[0].Name, n.Name, host, err)
		}
	}
	if len(seen) != zones {
		c.errorf("the nodes are in zones %v, want %d distinct ones", slices.Sorted(maps.Keys(seen)), zones)
	}
}

// checkNodeRBAC asks the API server what podnet-node's ServiceAccount may
// do: Leases only in its own namespace, Nodes only read and patched.
func (c *realCluster) checkNodeRBAC(ctx context.Context) {
	c.t.Helper()
	const sa = "system:serviceaccount:podnet-system:podnet-node"
	for _, q := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "leases", "-n", "podnet-system"}, "yes"},
		{[]string{"delete", "leases", "-n", "podnet-system"}, "yes"},
		{[]string{"create", "leases", "-n", "kube-node-lease"}, "no"},
		{[]string{"delete", "leases", "-n", "kube-node-lease"}, "no"},
		{[]string{"update", "leases", "-n", "podnet-system"}, "no"},
		{[]string{"patch", "nodes"}, "yes"},
		{[]string{"patch", "nodes/status"}, "yes"},
		{[]string{"update", "nodes"}, "no"},
		{[]string{"delete", "nodes"}, "no"},
		{[]string{"create", "events", "-n", "podnet-system"}, "no"},
	} {
		out, _ := c.kubectl(ctx, append([]string{"auth", "can-i", "--as=" + sa}, q.args...)...)
		// The answer is the last line, after any warnings.
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if got := lines[len(lines)-1]; got != q.want {
			c.errorf("can podnet-node %s: %q, want %s", strings.Join(q.args, " "), got, q.want)
		}
	}
	// And a real write, with the ServiceAccount's identity: refused.
	lease := filepath.Join(c.cp.Dir, "lease.yaml")
	if err := os.WriteFile(lease, []byte("apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: podcidr-10.244.9.0-24, namespace: kube-node-lease}\n"), 0o644); err != nil {
		c.fatalf("%v", err)
	}
	if out, err := c.kubectl(ctx, "create", "--as="+sa, "-f", lease); err == nil || !strings.Contains(out, "forbidden") {
		c.errorf("podnet-node creating a Lease in kube-node-lease: %v %q, want forbidden", err, out)
	}
	c.checkOwnNodeOnly(ctx, sa)
}

// checkOwnNodeOnly: the admission policy of deploy/ lets podnet-node patch
// the Node it runs on, as proxyd did (NetworkUnavailable=False), and no
// other Node, nor anything but what proxyd writes.
func (c *realCluster) checkOwnNodeOnly(ctx context.Context, sa string) {
	c.t.Helper()
	node, err := c.admin.CoreV1().Nodes().Get(ctx, c.nodes[0].Name, metav1.GetOptions{})
	if err != nil {
		c.fatalf("%v", err)
	}
	var cond *corev1.NodeCondition
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == corev1.NodeNetworkUnavailable {
			cond = &node.Status.Conditions[i]
		}
	}
	if cond == nil || cond.Status != corev1.ConditionFalse || cond.Reason != nodestatus.Reason {
		c.errorf("node %s NetworkUnavailable: %+v; want False set by proxyd through the admission policy", node.Name, cond)
	}
	ghost, err := c.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ghost"}}, metav1.CreateOptions{})
	if err != nil {
		c.fatalf("create node ghost: %v", err)
	}
	defer func() { _ = c.admin.CoreV1().Nodes().Delete(context.Background(), ghost.Name, metav1.DeleteOptions{}) }()
	condition := func(typ string) []byte {
		return []byte(`{"status":{"conditions":[{"type":"` + typ + `","status":"False","reason":"` + nodestatus.Reason + `"}]}}`)
	}
	// podnet-node as proxyd's pod-bound token presents it: with its node.
	cfg := c.srv.RestConfig(apiserver.Admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: sa, Extra: map[string][]string{"authentication.kubernetes.io/node-name": {node.Name}}}
	as, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		c.fatalf("%v", err)
	}
	// A token of the ServiceAccount bound to no pod names no node.
	cfg.Impersonate.Extra = nil
	unbound, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		c.fatalf("%v", err)
	}
	if _, err := unbound.CoreV1().Nodes().Patch(ctx, node.Name, types.StrategicMergePatchType, condition("NetworkUnavailable"), metav1.PatchOptions{}, "status"); err == nil || !strings.Contains(err.Error(), "(none) may not change Node") {
		c.errorf("podnet-node without a node patching Node %s: %v, want it refused", node.Name, err)
	}
	for _, p := range []struct {
		node, what string
		status     bool
		patch      []byte
		want       string // in the refusal; "" lets it through
	}{
		{"ghost", "NetworkUnavailable", true, condition("NetworkUnavailable"), "may not change Node ghost"},
		{"ghost", "unschedulable", false, []byte(`{"spec":{"unschedulable":true}}`), "may not change Node ghost"},
		{node.Name, "a label", false, []byte(`{"metadata":{"labels":{"podnet.test/stolen":"yes"}}}`), "may not change a Node's labels"},
		{node.Name, "unschedulable", false, []byte(`{"spec":{"unschedulable":true}}`), "unset podCIDR"},
		{node.Name, "Ready", true, condition("Ready"), "NetworkUnavailable"},
		{node.Name, "NetworkUnavailable", true, condition("NetworkUnavailable"), ""},
	} {
		var sub []string
		if p.status {
			sub = []string{"status"}
		}
		_, err := as.CoreV1().Nodes().Patch(ctx, p.node, types.StrategicMergePatchType, p.patch, metav1.PatchOptions{}, sub...)
		switch {
		case p.want == "" && err != nil:
			c.errorf("podnet-node setting %s of its own Node %s: %v, want it let through", p.what, p.node, err)
		case p.want != "" && (err == nil || !strings.Contains(err.Error(), p.want)):
			c.errorf("podnet-node setting %s of Node %s: %v, want it refused (%q)", p.what, p.node, err, p.want)
		}
	}
}
