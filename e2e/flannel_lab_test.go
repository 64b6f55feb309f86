//go:build conformance

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/e2e/image"
)

// The starting point of make migrate: the stack the clusters run
// before podnet. flannel (flanneld of make flannel, vxlan backend, kube
// subnet manager) as its kube-flannel-ds DaemonSet, its CNI side the
// reference bridge and host-local plugins with the configuration flannel's
// CNI plugin hands them; kube-proxy of the nodes' release in iptables mode
// as kubeadm's kube-proxy DaemonSet; CoreDNS as kubeadm's (corednsYAML)
// with one stub domain more.

// Images of the stack, Debian with iptables (as podnet's own: the same
// packages, so the same cached layer) and one binary each.
const (
	flannelImage   = "localhost/podnet-e2e/flannel:v0.28.10"
	kubeProxyImage = "localhost/podnet-e2e/kube-proxy:v1.36.3"
)

// stubDomain is the Corefile's stub domain, forwarded to a server outside
// the cluster (the lab's outside namespace) on stubPort; externalName is
// a name of the outside's own resolver, the nodes' upstream.
const (
	stubDomain   = "stub.lab"
	stubName     = "www." + stubDomain
	stubPort     = 5353
	externalName = "ext.example.org"
)

// flannelEnv are the environment variables naming what make migrate built.
type flannelEnv struct {
	flanneld, kubeProxy, coredns, cniBin string
}

func flannelEnvFromEnv(t *testing.T) flannelEnv {
	t.Helper()
	e := flannelEnv{flanneld: os.Getenv("PODNET_FLANNELD"), kubeProxy: os.Getenv("PODNET_KUBE_PROXY"), coredns: os.Getenv("PODNET_COREDNS"), cniBin: binDir(t)}
	if e.flanneld == "" || e.kubeProxy == "" || e.coredns == "" {
		t.Fatal("$PODNET_FLANNELD, $PODNET_KUBE_PROXY and $PODNET_COREDNS name flanneld, kube-proxy and CoreDNS: run make migrate")
	}
	for _, b := range []string{"bridge", "host-local", "loopback", "portmap"} {
		if _, err := os.Stat(filepath.Join(e.cniBin, b)); err != nil {
			t.Fatalf("%v (make flannel builds it)", err)
		}
	}
	return e
}

// flannelStackImages builds the flannel, kube-proxy and CoreDNS images.
func flannelStackImages(t *testing.T, dir string, e flannelEnv) []string {
	t.Helper()
	debian := func(files []image.File) image.Spec {
		return image.Spec{Suite: "bookworm", Packages: []string{"iptables", "kmod", "iproute2"}, Files: files}
	}
	fl := debian([]image.File{{Src: e.flanneld, Dst: "/opt/bin/flanneld", Mode: 0o755}})
	for _, b := range []string{"bridge", "host-local", "loopback", "portmap"} {
		fl.Files = append(fl.Files, image.File{Src: filepath.Join(e.cniBin, b), Dst: "/cni/" + b, Mode: 0o755})
	}
	kp := debian([]image.File{{Src: e.kubeProxy, Dst: "/usr/local/bin/kube-proxy", Mode: 0o755}})
	var out []string
	for _, img := range []struct {
		tag  string
		spec image.Spec
	}{{flannelImage, fl}, {kubeProxyImage, kp}} {
		path := filepath.Join(dir, strings.ReplaceAll(filepath.Base(img.tag), ":", "-")+".tar")
		if err := image.Build(t.Context(), image.BuildOptions{Spec: img.spec, Tag: img.tag, Out: path, CacheDir: "/var/cache/podnet"}); err != nil {
			t.Fatalf("image %s: %v", img.tag, err)
		}
		out = append(out, path)
	}
	return append(out, corednsImageTar(t, dir, e.coredns))
}

// flannelYAML is flannel as its kube-flannel.yml installs it (namespace
// kube-flannel, DaemonSet kube-flannel-ds, the kube-flannel-cfg ConfigMap
// with the vxlan backend), with one change: the CNI side. flannel's
// install-cni init container copies a static conflist naming flannel's
// CNI plugin, which reads /run/flannel/subnet.env at each ADD and hands
// the bridge plugin a configuration built from it; here the install-cni
// container waits for subnet.env and writes that bridge configuration as
// the conflist (10-flannel.conflist, as flannel names it), with the
// portmap plugin after it as flannel's conflist has.
var flannelYAML = `apiVersion: v1
kind: Namespace
metadata:
  name: kube-flannel
  labels: {pod-security.kubernetes.io/enforce: privileged}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: flannel, namespace: kube-flannel}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: flannel}
rules:
  - apiGroups: [""]
    resources: [pods]
    verbs: [get]
  - apiGroups: [""]
    resources: [nodes]
    verbs: [get, list, watch]
  - apiGroups: [""]
    resources: [nodes/status]
    verbs: [patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: flannel}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: flannel}
subjects: [{kind: ServiceAccount, name: flannel, namespace: kube-flannel}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: kube-flannel-cfg, namespace: kube-flannel, labels: {app: flannel}}
data:
  net-conf.json: |
    {
      "Network": "10.244.0.0/16",
      "EnableNFTables": false,
      "Backend": {"Type": "vxlan"}
    }
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: kube-flannel-ds, namespace: kube-flannel, labels: {app: flannel}}
spec:
  selector: {matchLabels: {app: flannel}}
  template:
    metadata: {labels: {app: flannel}}
    spec:
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions: [{key: kubernetes.io/os, operator: In, values: [linux]}]
      hostNetwork: true
      priorityClassName: system-node-critical
      tolerations: [{operator: Exists, effect: NoSchedule}]
      serviceAccountName: flannel
      initContainers:
        - name: install-cni-plugin
          image: ` + flannelImage + `
          command: [cp, /cni/bridge, /cni/host-local, /cni/loopback, /cni/portmap, /opt/cni/bin/]
          volumeMounts: [{name: cni-plugin, mountPath: /opt/cni/bin}]
      containers:
        - name: kube-flannel
          image: ` + flannelImage + `
          command: [/opt/bin/flanneld]
          args: [--ip-masq, --kube-subnet-mgr]
          resources:
            requests: {cpu: 100m, memory: 50Mi}
          securityContext:
            privileged: false
            capabilities: {add: [NET_ADMIN, NET_RAW]}
          env:
            - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
            - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
            - {name: EVENT_QUEUE_DEPTH, value: "5000"}
          volumeMounts:
            - {name: run, mountPath: /run/flannel}
            - {name: flannel-cfg, mountPath: /etc/kube-flannel/}
            - {name: xtables-lock, mountPath: /run/xtables.lock}
        - name: install-cni
          image: ` + flannelImage + `
          command:
            - /bin/sh
            - -c
            - |
` + indent(flannelConflistScript, "              ") + `
              exec sleep infinity
          volumeMounts:
            - {name: run, mountPath: /run/flannel}
            - {name: cni, mountPath: /etc/cni/net.d}
      volumes:
        - {name: run, hostPath: {path: /run/flannel, type: DirectoryOrCreate}}
        - {name: cni-plugin, hostPath: {path: /opt/cni/bin, type: DirectoryOrCreate}}
        - {name: cni, hostPath: {path: /etc/cni/net.d, type: DirectoryOrCreate}}
        - {name: flannel-cfg, configMap: {name: kube-flannel-cfg}}
        - {name: xtables-lock, hostPath: {path: /run/xtables.lock, type: FileOrCreate}}
`

// kubeProxyYAML is kube-proxy as kubeadm installs it: the kube-proxy
// ConfigMap (config.conf, kubeconfig.conf with the service account's
// token), its ServiceAccount bound to system:node-proxier, and the
// DaemonSet running kube-proxy --config=/var/lib/kube-proxy/config.conf
// --hostname-override=$(NODE_NAME). The configuration is kubeProxyConfig's
// (iptables mode, conntrack left to the host).
func kubeProxyYAML(apiServer string) string {
	cfg := kubeProxyConfig("/var/lib/kube-proxy/kubeconfig.conf", "\"\"")
	return `apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-proxy, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "kubeadm:node-proxier"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:node-proxier"}
subjects: [{kind: ServiceAccount, name: kube-proxy, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: kube-proxy, namespace: kube-system, labels: {app: kube-proxy}}
data:
  config.conf: |
` + indent(cfg, "    ") + `
  kubeconfig.conf: |
    apiVersion: v1
    kind: Config
    clusters:
      - cluster:
          certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
          server: https://` + apiServer + `
        name: default
    contexts:
      - context: {cluster: default, namespace: default, user: default}
        name: default
    current-context: default
    users:
      - name: default
        user: {tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: kube-proxy, namespace: kube-system, labels: {k8s-app: kube-proxy}}
spec:
  selector: {matchLabels: {k8s-app: kube-proxy}}
  updateStrategy: {type: RollingUpdate}
  template:
    metadata: {labels: {k8s-app: kube-proxy}}
    spec:
      containers:
        - name: kube-proxy
          image: ` + kubeProxyImage + `
          command: [/usr/local/bin/kube-proxy, --config=/var/lib/kube-proxy/config.conf, --hostname-override=$(NODE_NAME)]
          env: [{name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}]
          securityContext: {privileged: true}
          volumeMounts:
            - {name: kube-proxy, mountPath: /var/lib/kube-proxy}
            - {name: xtables-lock, mountPath: /run/xtables.lock}
            - {name: lib-modules, mountPath: /lib/modules, readOnly: true}
      hostNetwork: true
      priorityClassName: system-node-critical
      serviceAccountName: kube-proxy
      nodeSelector: {kubernetes.io/os: linux}
      tolerations: [{operator: Exists}]
      volumes:
        - {name: kube-proxy, configMap: {name: kube-proxy}}
        - {name: xtables-lock, hostPath: {path: /run/xtables.lock, type: FileOrCreate}}
        - {name: lib-modules, hostPath: {path: /lib/modules}}
`
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return prefix + strings.Join(lines, "\n"+prefix)
}

// corednsStubYAML is corednsYAML with a stub-domain server block after
// kubeadm's: stubDomain forwarded to the outside's server on stubPort.
func corednsStubYAML(outside string) string {
	stub := fmt.Sprintf(`    %s:53 {
        errors
        cache 30
        forward . %s:%d
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns,`, stubDomain, outside, stubPort)
	out := strings.Replace(corednsYAML, "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: coredns,", stub, 1)
	if out == corednsYAML {
		panic("corednsYAML: no Deployment after the Corefile")
	}
	return out
}

// outsideDNSCorefile is the outside's own resolver (the nodes' upstream,
// realnode.NodeOptions.Nameserver) and the stub domain's server, one CoreDNS
// in the lab's outside namespace.
func outsideDNSCorefile(outside string) string {
	return fmt.Sprintf(`example.org:53 {
    bind %[1]s
    hosts {
        192.0.2.10 %[2]s
    }
}
%[3]s:%[4]d {
    bind %[1]s
    hosts {
        192.0.2.20 %[5]s
    }
}
`, outside, externalName, stubDomain, stubPort, stubName)
}

// installFlannelStack installs flannel, kube-proxy and CoreDNS (with the
// outside's resolver behind them) and waits for every node Ready and every
// pod of the three up.
func installFlannelStack(e flannelEnv) func(context.Context, *realCluster, string) {
	return func(ctx context.Context, c *realCluster, _ string) {
		t := c.t
		corefile := filepath.Join(c.cp.Dir, "outside.Corefile")
		if err := os.WriteFile(corefile, []byte(outsideDNSCorefile(c.l.OutsideIP.String())), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := c.l.OutsideHost.Start("outside-dns", e.coredns, "-conf", corefile); err != nil {
			t.Fatal(err)
		}
		// What kubeadm's preflight asks of a node before it joins (the
		// lab's nodes start with forwarding off): forwarding on, bridged
		// traffic through iptables. podnet's init container does it
		// itself; flannel and kube-proxy rely on it.
		for _, n := range c.nodes {
			if out, err := n.Exec(ctx, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward && { [ -e /proc/sys/net/bridge ] || modprobe br_netfilter; } && echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables"); err != nil {
				t.Fatalf("%s: %v\n%s", n.Name, err, out)
			}
		}
		c.applyYAML(ctx, kubeProxyYAML(kubeAPIAddr.Addr().String()+":6443"))
		c.applyYAML(ctx, flannelYAML)
		c.applyYAML(ctx, corednsStubYAML(c.l.OutsideIP.String()))
		c.waitStackUp()
	}
}

// waitStackUp waits for every node Ready, flannel's and kube-proxy's
// DaemonSets ready on each and every CoreDNS replica ready.
func (c *realCluster) waitStackUp() {
	c.waitFor(4*time.Minute, "every node Ready, flannel and kube-proxy on each, CoreDNS available", func(ctx context.Context) (bool, string) {
		nodes, err := c.admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(nodes.Items) != len(c.nodes) {
			return false, fmt.Sprintf("nodes: %v (%v)", nodeNames(nodes), err)
		}
		for _, n := range nodes.Items {
			if !nodeReady(&n) {
				return false, "node " + n.Name + " not Ready"
			}
		}
		for _, ds := range [][2]string{{"kube-flannel", "kube-flannel-ds"}, {"kube-system", "kube-proxy"}} {
			d, err := c.admin.AppsV1().DaemonSets(ds[0]).Get(ctx, ds[1], metav1.GetOptions{})
			if err != nil || d.Status.NumberReady != int32(len(c.nodes)) {
				return false, fmt.Sprintf("%s: %v", ds[1], err)
			}
		}
		d, err := c.admin.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil || d.Spec.Replicas == nil || d.Status.ReadyReplicas != *d.Spec.Replicas {
			return false, fmt.Sprintf("coredns: %v", err)
		}
		return true, ""
	})
}

// TestFlannelNodes is the starting point of make migrate on its own: three
// real nodes on flannel, kube-proxy and CoreDNS. Every node's pod reaches
// every other node's (flannel's VXLAN, across the router too), the
// ClusterIP and the NodePort answer, and a pod resolves a Service, the
// stub domain's name and an outside name; flannel.1 and cni0 are on every
// node, kube-proxy's chains hold the Service.
func TestFlannelNodes(t *testing.T) {
	e := flannelEnvFromEnv(t)
	c := startRealClusterOpts(t, realNodes(), realClusterOptions{
		extraImages: func(c *realCluster) []string { return flannelStackImages(t, t.TempDir(), e) },
		install:     installFlannelStack(e),
	})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	w := c.startMigrateWorkload(ctx)
	c.checkPodToPod(ctx, w)
	c.checkNames(ctx, w.client)
	for _, n := range c.nodes {
		out, err := n.Exec(ctx, "ip", "-o", "link", "show")
		if err != nil || !strings.Contains(out, "flannel.1") || !strings.Contains(out, "cni0") {
			c.errorf("%s: no flannel.1 and cni0: %v\n%s", n.Name, err, out)
		}
		out, err = n.Exec(ctx, "iptables-save", "-t", "nat")
		if err != nil || !strings.Contains(out, "KUBE-SERVICES") {
			c.errorf("%s: no kube-proxy chains: %v\n%s", n.Name, err, out)
		}
	}
}
