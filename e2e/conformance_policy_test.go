//go:build conformance

package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/image"
)

// The NetworkPolicy baseline of make conformance: the kube-proxy+CoreDNS
// lab of baseline_test.go with proxyd's NetworkPolicy turned off and
// sig-network's kube-network-policies enforcing it instead, as its
// install manifest runs it (a DaemonSet on the host network with
// NET_ADMIN). It passes each new connection of a pod some policy selects
// through an nfqueue to its userspace, which judges it.

// knpVersion is the kube-network-policies release the Makefile builds.
const knpVersion = "v0.8.0"

// knpImage is its image: the binary alone, where upstream's image has it.
const knpImage = "localhost/podnet-e2e/kube-network-policies:" + knpVersion

// knpTable is the nftables table (family inet) it programs.
const knpTable = "kube-network-policies"

// knpQueue is the nfqueue it reads (its install manifest's --nfqueue-id).
const knpQueue = 98

// baselinePolicyOff is baselineKustomization's proxyd patch with
// NetworkPolicy off too (later flags win).
const baselinePolicyOff = `  - target: {kind: DaemonSet, name: podnet-node}
    patch: |-
      - {op: test, path: /spec/template/spec/containers/0/name, value: proxyd}
      - {op: add, path: /spec/template/spec/containers/0/command/-, value: --network-policy=false}
`

// knpYAML runs kube-network-policies on every node: a ServiceAccount
// that may list and watch what it reads (Pods, Namespaces,
// NetworkPolicies), and the DaemonSet. NRI is off: the lab's containerd
// has no NRI socket, and kube-network-policies then learns pod addresses
// from the API server alone.
var knpYAML = fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-network-policies, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kube-network-policies}
rules:
  - apiGroups: [""]
    resources: [pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [networking.k8s.io]
    resources: [networkpolicies]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kube-network-policies}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kube-network-policies}
subjects: [{kind: ServiceAccount, name: kube-network-policies, namespace: kube-system}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: kube-network-policies, namespace: kube-system, labels: {k8s-app: kube-network-policies}}
spec:
  selector: {matchLabels: {k8s-app: kube-network-policies}}
  template:
    metadata: {labels: {k8s-app: kube-network-policies}}
    spec:
      hostNetwork: true
      serviceAccountName: kube-network-policies
      priorityClassName: system-node-critical
      tolerations: [{operator: Exists}]
      containers:
        - name: kube-network-policies
          image: %s
          args: [--hostname-override=$(NODE_NAME), --nfqueue-id=%d, --disable-nri, --v=2]
          env:
            - name: NODE_NAME
              valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
          securityContext:
            privileged: true
            capabilities: {add: [NET_ADMIN]}
          resources:
            requests: {cpu: 100m, memory: 50Mi}
`, knpImage, knpQueue)

// knpImageTar builds kube-network-policies' image into dir.
func knpImageTar(t *testing.T, dir, bin string) string {
	t.Helper()
	out := filepath.Join(dir, "kube-network-policies.tar")
	err := image.Build(t.Context(), image.BuildOptions{
		Spec: image.Spec{Files: []image.File{{Src: bin, Dst: "/bin/netpol", Mode: 0o755}}, Entrypoint: []string{"/bin/netpol"}},
		Tag:  knpImage, Out: out,
	})
	if err != nil {
		t.Fatalf("image %s: %v", knpImage, err)
	}
	return out
}

// knpBinary is the kube-network-policies binary make conformance hands
// the run.
func knpBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("PODNET_KUBE_NETWORK_POLICIES")
	if bin == "" {
		t.Fatal("$PODNET_KUBE_NETWORK_POLICIES is unset: run make conformance")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// errNoNFTQueue is what a kernel without nftables' queue expression
// (CONFIG_NFT_QUEUE, module nft_queue) answers a rule that uses it.
var errNoNFTQueue = errors.New("the kernel refuses nftables' queue expression (no nft_queue: CONFIG_NFT_QUEUE unset or the module missing)")

// checkNFTQueue adds, in a network namespace of the test's own, a rule
// with the queue expression kube-network-policies' rules use; the kernel
// has it when that succeeds.
func checkNFTQueue(t *testing.T) error {
	t.Helper()
	_, h := roottest.NetNS(t, "knpprobe")
	conn, err := nftables.New(nftables.WithNetNSFd(int(h.Fd())))
	if err != nil {
		return err
	}
	tb := conn.AddTable(&nftables.Table{Name: "probe", Family: nftables.TableFamilyINet})
	ch := conn.AddChain(&nftables.Chain{Name: "probe", Table: tb, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	conn.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: []expr.Any{&expr.Queue{Num: knpQueue}}})
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("%w: %v", errNoNFTQueue, err)
	}
	return nil
}

func init() {
	confLabs["kube-network-policies"] = confLab{column: "kube-network-policies", options: func(e confLabEnv) realClusterOptions {
		return knpLabOptions(e.run.kubeProxy, e.baselineImages)
	}}
}

// knpLabOptions is the lab kind: images (the baseline's and
// kube-network-policies'), kube-proxy's identity, and installKNPBaseline.
// A kernel without the queue expression ends the lab before it installs
// anything (roottest.Unavailable: a skip, or a failure under strict mode).
func knpLabOptions(kubeProxy string, baselineImages []string) realClusterOptions {
	return realClusterOptions{
		extraImages: func(c *realCluster) []string {
			if err := checkNFTQueue(c.t); err != nil {
				roottest.Unavailable(c.t, "kube-network-policies %s cannot enforce here: %v", knpVersion, err)
			}
			return append([]string{knpImageTar(c.t, c.t.TempDir(), knpBinary(c.t))}, baselineImages...)
		},
		users:   map[string]string{kubeProxyUser: "system:authenticated"},
		install: installKNPBaseline(kubeProxy),
	}
}

// installKNPBaseline installs the kube-proxy+CoreDNS baseline with
// proxyd's NetworkPolicy off, then kube-network-policies, and waits until
// it runs on every node and each node's table holds its queue rules.
func installKNPBaseline(kubeProxy string) func(context.Context, *realCluster, string) {
	base := installBaselineWith(kubeProxy, baselineKustomization+baselinePolicyOff)
	return func(ctx context.Context, c *realCluster, podnetTar string) {
		base(ctx, c, podnetTar)
		c.applyYAML(ctx, knpYAML)
		c.waitFor(2*time.Minute, "kube-network-policies ready on every node", func(ctx context.Context) (bool, string) {
			ds, err := c.admin.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-network-policies", metav1.GetOptions{})
			if err != nil || ds.Status.NumberReady != int32(len(c.nodes)) {
				return false, fmt.Sprintf("daemonset: %v", err)
			}
			return true, ""
		})
		c.waitFor(time.Minute, "kube-network-policies' queue rules on every node", func(context.Context) (bool, string) {
			for _, n := range c.nodes {
				if err := knpQueueRules(n.NSPath()); err != nil {
					return false, fmt.Sprintf("%s: %v", n.Name, err)
				}
			}
			return true, ""
		})
	}
}

// knpQueueRules checks that the network namespace at path has
// kube-network-policies' table with a rule that queues to knpQueue.
func knpQueueRules(path string) error {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer h.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(h)))
	if err != nil {
		return err
	}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return err
	}
	for _, tb := range tables {
		if tb.Name != knpTable {
			continue
		}
		rules, err := conn.GetRules(tb, &nftables.Chain{Name: "postrouting", Table: tb})
		if err != nil {
			return err
		}
		for _, r := range rules {
			for _, e := range r.Exprs {
				if q, ok := e.(*expr.Queue); ok && q.Num == knpQueue {
					return nil
				}
			}
		}
		return fmt.Errorf("table inet %s has no rule queueing to %d in chain postrouting (%d rules)", knpTable, knpQueue, len(rules))
	}
	return fmt.Errorf("no table inet %s", knpTable)
}

// TestNFTQueueProbe checks checkNFTQueue against the kernel's own
// configuration (/proc/config.gz): built in, the probe's rule is accepted;
// not set, it is refused with errNoNFTQueue.
func TestNFTQueueProbe(t *testing.T) {
	roottest.Require(t)
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		roottest.Unavailable(t, "no /proc/config.gz to read the kernel's configuration from: %v", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	config, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	probe := checkNFTQueue(t)
	switch {
	case bytes.Contains(config, []byte("\nCONFIG_NFT_QUEUE=y\n")):
		if probe != nil {
			t.Errorf("CONFIG_NFT_QUEUE=y, but the probe failed: %v", probe)
		}
	case bytes.Contains(config, []byte("\n# CONFIG_NFT_QUEUE is not set\n")):
		if !errors.Is(probe, errNoNFTQueue) {
			t.Errorf("CONFIG_NFT_QUEUE is not set, but the probe said %v", probe)
		}
		t.Logf("as this kernel is built, kube-network-policies cannot run here: %v", probe)
	default:
		roottest.Unavailable(t, "nft_queue is a module here (or absent from the configuration): its probe depends on loading it")
	}
}
