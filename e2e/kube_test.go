package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/kube"
	"github.com/podnet/podnet/dataplane/nodestatus"
	"github.com/podnet/podnet/dataplane/podcidr"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/apiserver"
	"github.com/podnet/podnet/e2e/lab"
)

// The control plane (etcd + kube-apiserver in a namespace of its own) is
// started once per test binary, by the first test that needs it, and
// stopped by TestMain: starting kube-apiserver takes seconds, not a test's
// worth of time each.
var controlPlane struct {
	once sync.Once
	cp   *lab.ControlPlane
	srv  *apiserver.Server
	shm  string
	err  error
}

// kubeAPI returns the shared control plane, starting it on first use.
// Without the kube-apiserver binary the test fails, saying how to build it:
// `make test` always provides it, so a silent skip would hide a gap.
func kubeAPI(t testing.TB) (*lab.ControlPlane, *apiserver.Server) {
	t.Helper()
	roottest.Require(t)
	c := &controlPlane
	c.once.Do(func() {
		start := time.Now()
		c.err = startControlPlane(t.Logf)
		if c.err == nil {
			t.Logf("control plane up in %v", time.Since(start).Round(time.Millisecond))
		}
	})
	if c.err != nil {
		t.Fatalf("control plane: %v", c.err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane logs:\n%s", c.srv.Logs())
		}
	})
	return c.cp, c.srv
}

func startControlPlane(logf func(string, ...any)) error {
	c := &controlPlane
	bin, err := apiserver.Binary()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Logging through the first test's t.Logf would outlive that test.
	cp, err := lab.NewControlPlane(ctx, nil)
	if err != nil {
		return err
	}
	c.cp = cp
	// etcd fsyncs every write; on tmpfs that costs nothing.
	c.shm, err = os.MkdirTemp("/dev/shm", "podnet-etcd-")
	if err != nil {
		c.shm = ""
	}
	srv, err := apiserver.Start(ctx, apiserver.Options{
		NSPath:           cp.NSPath(),
		Start:            func(name string, args ...string) (apiserver.Process, error) { return cp.Host.Start(name, args...) },
		Dir:              filepath.Join(cp.Dir, "apiserver"),
		EtcdDir:          filepath.Join(c.shm, "etcd"),
		AdvertiseAddress: kubeAPIAddr.Addr(),
		Binary:           bin,
	})
	if err != nil {
		closeControlPlane()
		return err
	}
	c.srv = srv
	// The RBAC part of the manifests is applied for real: the daemons in
	// the lab use the service accounts' identities.
	if err := applyManifests(ctx, srv, false, func(u *unstructured.Unstructured) bool {
		switch u.GetKind() {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			return true
		}
		return false
	}); err != nil {
		closeControlPlane()
		return fmt.Errorf("apply RBAC of deploy/base/podnet.yaml: %w", err)
	}
	return nil
}

// closeControlPlane stops the shared control plane; TestMain calls it.
func closeControlPlane() {
	c := &controlPlane
	if c.srv != nil {
		c.srv.Close()
	}
	if c.cp != nil {
		c.cp.Close()
	}
	if c.shm != "" {
		os.RemoveAll(c.shm)
	}
}

// kubeAPIAddr is where lab nodes reach the API server: on segment A.
var kubeAPIAddr = netip.MustParsePrefix("192.168.10.2/24")

// manifests returns every object in deploy/base/*.yaml (not the
// kustomization): what kubectl apply -k deploy/ installs.
func manifests() ([]*unstructured.Unstructured, error) {
	files, err := filepath.Glob("../deploy/base/*.yaml")
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if len(u.Object) > 0 {
				objs = append(objs, u)
			}
		}
	}
	if len(objs) == 0 {
		return nil, errors.New("no objects in deploy/base/*.yaml")
	}
	return objs, nil
}

// applyManifests server-side applies the objects of deploy/ that keep
// selects, as `kubectl apply --server-side [--dry-run=server]` does.
func applyManifests(ctx context.Context, srv *apiserver.Server, dryRun bool, keep func(*unstructured.Unstructured) bool) error {
	cfg := srv.RestConfig(apiserver.Admin)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	disc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc.Discovery()))
	objs, err := manifests()
	if err != nil {
		return err
	}
	var errs []error
	for _, u := range objs {
		if !keep(u) {
			continue
		}
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", gvk.Kind, u.GetName(), err))
			continue
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		data, err := u.MarshalJSON()
		if err != nil {
			return err
		}
		opts := metav1.PatchOptions{FieldManager: "podnet-e2e", Force: new(true)}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		if _, err := ri.Patch(ctx, u.GetName(), types.ApplyPatchType, data, opts); err != nil {
			errs = append(errs, fmt.Errorf("%s %s/%s: %w", gvk.Kind, u.GetNamespace(), u.GetName(), err))
		}
	}
	return errors.Join(errs...)
}

// Every object of deploy/ is accepted by a real API server, and every flag
// a container passes exists in the binary it runs.
func TestKubeManifests(t *testing.T) {
	_, srv := kubeAPI(t)
	if err := applyManifests(t.Context(), srv, true, func(*unstructured.Unstructured) bool { return true }); err != nil {
		t.Fatalf("server-side dry run of deploy/: %v", err)
	}
	objs, err := manifests()
	if err != nil {
		t.Fatal(err)
	}
	binDir := os.Getenv("PODNET_BIN")
	if binDir == "" {
		binDir = "../bin"
	}
	var checked int
	for _, u := range objs {
		for _, field := range []string{"initContainers", "containers"} {
			containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", field)
			for _, c := range containers {
				cmd, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "command")
				if len(cmd) == 0 {
					t.Errorf("%s %s: a container without a command", u.GetKind(), u.GetName())
					continue
				}
				bin := filepath.Join(binDir, filepath.Base(cmd[0]))
				// Flags are parsed in order: --help last exits 0 only once
				// every flag before it was accepted.
				out, err := exec.CommandContext(t.Context(), bin, append(cmd[1:], "--help")...).CombinedOutput()
				if err != nil {
					t.Errorf("%s %s: %s rejects its arguments %q: %v\n%s", u.GetKind(), u.GetName(), filepath.Base(cmd[0]), cmd[1:], err, out)
				}
				checked++
			}
		}
	}
	if checked < 3 {
		t.Errorf("checked the commands of %d containers, want the CNI installer, proxyd and dnsd", checked)
	}
}

// podCIDR claims against the real API server: nodes racing for subnets never
// get the same one, and a node's Node object carries what it claimed.
func TestKubePodCIDRRace(t *testing.T) {
	_, srv := kubeAPI(t)
	ctx := t.Context()
	client, err := srv.Client(apiserver.NodeSA)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := srv.Client(apiserver.Admin)
	if err != nil {
		t.Fatal(err)
	}
	// A cluster CIDR of this test alone, so claims of other tests' nodes
	// don't matter; 8 nodes for 8 subnets leaves no slack.
	cidr := netip.MustParsePrefix("10.250.0.0/21")
	const n = 8
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("race-%d", i)
		createNode(t, admin, names[i], "")
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := admin.CoordinationV1().Leases(podcidr.DefaultNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: podcidr.LabelClaim})
		if err != nil {
			t.Errorf("delete the claims: %v", err)
		}
	})
	got := make([]netip.Prefix, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			got[i], errs[i] = podcidr.Ensure(ctx, podcidr.Options{Client: client, NodeName: names[i], ClusterCIDR: cidr})
		})
	}
	wg.Wait()
	seen := map[netip.Prefix]string{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("%s: %v", names[i], errs[i])
		}
		if other, dup := seen[got[i]]; dup {
			t.Errorf("%s and %s both claimed %v", other, names[i], got[i])
		}
		seen[got[i]] = names[i]
		node, err := admin.CoreV1().Nodes().Get(ctx, names[i], metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if node.Spec.PodCIDR != got[i].String() {
			t.Errorf("%s: spec.podCIDR %q, claimed %v", names[i], node.Spec.PodCIDR, got[i])
		}
	}
	// A ninth node finds nothing left.
	createNode(t, admin, "race-late", "")
	if _, err := podcidr.Ensure(ctx, podcidr.Options{Client: client, NodeName: "race-late", ClusterCIDR: cidr}); !errors.Is(err, podcidr.ErrExhausted) {
		t.Errorf("ninth node: %v, want ErrExhausted", err)
	}
}

// The node agent's identity may set NetworkUnavailable=False on a Node.
func TestKubeNodeStatus(t *testing.T) {
	_, srv := kubeAPI(t)
	ctx := t.Context()
	admin, err := srv.Client(apiserver.Admin)
	if err != nil {
		t.Fatal(err)
	}
	client, err := srv.Client(apiserver.NodeSA)
	if err != nil {
		t.Fatal(err)
	}
	node := createNode(t, admin, "status-1", "10.251.0.0/24")
	node.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastTransitionTime: metav1.Now()},
		{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionTrue, Reason: "NoRouteCreated", LastTransitionTime: metav1.Now()},
	}
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := nodestatus.SetNetworkAvailable(ctx, client, "status-1"); err != nil {
		t.Fatal(err)
	}
	got, err := admin.CoreV1().Nodes().Get(ctx, "status-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conds := map[corev1.NodeConditionType]corev1.NodeCondition{}
	for _, c := range got.Status.Conditions {
		conds[c.Type] = c
	}
	if c := conds[corev1.NodeNetworkUnavailable]; c.Status != corev1.ConditionFalse || c.Reason != nodestatus.Reason {
		t.Errorf("NetworkUnavailable = %+v, want False/%s", c, nodestatus.Reason)
	}
	if c := conds[corev1.NodeReady]; c.Status != corev1.ConditionTrue {
		t.Errorf("Ready = %+v: the patch touched another condition", c)
	}
}

// waitUntil polls cond every 20 ms until it holds, failing the test
// after timeout.
func waitUntil(t *testing.T, timeout time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// createNode creates a Node (deleted again when the test ends).
func createNode(t *testing.T, client kubernetes.Interface, name, podCIDR string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if podCIDR != "" {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDR, []string{podCIDR}
	}
	n, err := client.CoreV1().Nodes().Create(t.Context(), n, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete node %s: %v", name, err)
		}
	})
	return n
}

// The kube source against the real API server: it fills the Store, keeps
// it through an outage while reporting the staleness, and catches up once
// the API server is back.
func TestKubeSourceOutage(t *testing.T) {
	_, srv := kubeAPI(t)
	ctx := t.Context()
	admin, err := srv.Client(apiserver.Admin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "outage"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().Namespaces().Delete(context.Background(), "outage", metav1.DeleteOptions{})
	})
	mkService := func(name string) {
		t.Helper()
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "outage"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}},
		}
		if _, err := admin.CoreV1().Services("outage").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mkService("before")

	store := cluster.NewStore()
	src := kube.New(kube.Options{Config: srv.RestConfig(apiserver.NodeSA), Store: store})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- src.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	has := func(name string) bool { return store.Service(cluster.Key{Namespace: "outage", Name: name}) != nil }
	waitUntil(t, 10*time.Second, func() bool { return has("before") }, "Service before the outage in the Store")

	if err := srv.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 20*time.Second, func() bool { return src.Err() != nil }, "staleness reported")
	t.Logf("during the outage: %v", src.Err())
	if !has("before") {
		t.Error("the Store lost a Service during the outage")
	}
	if err := srv.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	mkService("after")
	// The reflectors retry within kube.PromptBackoff's 1.2 s while the API
	// server is away, not after client-go's default backoff of up to a
	// minute.
	waitUntil(t, 5*time.Second, func() bool { return has("after") && src.Err() == nil }, "Service created after the outage, staleness cleared")
	t.Logf("Service created after the outage in the Store %v after the API server returned", time.Since(back).Round(time.Millisecond))
}
