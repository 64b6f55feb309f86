//go:build conformance

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/dataplane/proxy/iptables"
	"github.com/podnet/podnet/e2e/image"
	"github.com/podnet/podnet/e2e/realnode"
)

// The baseline of make conformance: the same lab and the same podnet CNI
// plugin and node agent (podCIDR, routes between nodes), but Services
// proxied by kube-proxy (iptables mode) and cluster DNS answered by CoreDNS,
// both of the release the nodes run.

// kubeProxyUser is kube-proxy's identity: the API server's bootstrap RBAC
// binds it to system:node-proxier.
const kubeProxyUser = "system:kube-proxy"

// corednsImage is CoreDNS's image, the binary alone (as upstream's).
const corednsImage = "localhost/podnet-e2e/coredns:" + "v1.14.2"

// checkCoreDNSVersion fails unless the CoreDNS binary is the version
// Kubernetes' kubeadm installs with this release.
func checkCoreDNSVersion(t *testing.T, coredns string) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(moduleDir(t, "k8s.io/kubernetes"), "cmd/kubeadm/app/constants/constants.go"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`CoreDNSVersion\s*=\s*"v([0-9.]+)"`).FindSubmatch(src)
	if m == nil {
		t.Fatal("no CoreDNSVersion in kubeadm's constants")
	}
	out, err := exec.Command(coredns, "-version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "CoreDNS-"+string(m[1])) {
		t.Fatalf("%s -version: %q, %v; kubeadm %s installs CoreDNS %s", coredns, out, err, realnode.Version, m[1])
	}
	if !strings.HasSuffix(corednsImage, ":v"+string(m[1])) {
		t.Fatalf("corednsImage %s is not tagged v%s", corednsImage, m[1])
	}
}

// corednsImageTar builds CoreDNS's image into dir.
func corednsImageTar(t *testing.T, dir, coredns string) string {
	t.Helper()
	out := filepath.Join(dir, "coredns.tar")
	err := image.Build(t.Context(), image.BuildOptions{
		Spec: image.Spec{Files: []image.File{{Src: coredns, Dst: "/coredns", Mode: 0o755}}, Entrypoint: []string{"/coredns"}},
		Tag:  corednsImage, Out: out,
	})
	if err != nil {
		t.Fatalf("image %s: %v", corednsImage, err)
	}
	return out
}

// baselineKustomization turns off what kube-proxy and CoreDNS replace:
// proxyd keeps the node network (podCIDR, routes, masquerade, forwarding)
// with --proxy-mode=none (later flags win), its health port moved off
// kube-proxy's 10256 and its metrics port off, and dnsd's Deployment and
// kube-dns Service are left out (corednsYAML brings CoreDNS's). The test op
// fails the kustomization if the DaemonSet's first container is no longer
// proxyd.
const baselineKustomization = `patches:
  - target: {kind: DaemonSet, name: podnet-node}
    patch: |-
      - {op: test, path: /spec/template/spec/containers/0/name, value: proxyd}
      - {op: add, path: /spec/template/spec/containers/0/command/-, value: --proxy-mode=none}
      - {op: add, path: /spec/template/spec/containers/0/command/-, value: "--healthz-bind-address=0.0.0.0:10266"}
      - {op: add, path: /spec/template/spec/containers/0/command/-, value: --metrics-bind-address=}
      - {op: replace, path: /spec/template/spec/containers/0/livenessProbe/httpGet/port, value: 10266}
  - patch: |-
      $patch: delete
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: podnet-dns, namespace: kube-system}
  - patch: |-
      $patch: delete
      apiVersion: v1
      kind: Service
      metadata: {name: kube-dns, namespace: kube-system}
`

// corednsYAML is CoreDNS as kubeadm installs it (the same Corefile
// plugins, two replicas behind kube-dns 10.96.0.10), with the locally
// built image, and port 53 bound as dnsd's Deployment does (a non-root user
// with the unprivileged port range starting at 53).
var corednsYAML = `apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health {
           lameduck 5s
        }
        ready
        kubernetes cluster.local in-addr.arpa ip6.arpa {
           pods insecure
           fallthrough in-addr.arpa ip6.arpa
           ttl 30
        }
        prometheus :9153
        forward . /etc/resolv.conf {
           max_concurrent 1000
        }
        cache 30 {
           disable success cluster.local
           disable denial cluster.local
        }
        loop
        reload
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 2
  strategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1}}
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      tolerations: [{key: CriticalAddonsOnly, operator: Exists}]
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm: {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {k8s-app: kube-dns}}}
      securityContext:
        sysctls: [{name: net.ipv4.ip_unprivileged_port_start, value: "53"}]
      containers:
        - name: coredns
          image: ` + corednsImage + `
          args: [-conf, /etc/coredns/Corefile]
          ports:
            - {name: dns, containerPort: 53, protocol: UDP}
            - {name: dns-tcp, containerPort: 53, protocol: TCP}
            - {name: metrics, containerPort: 9153, protocol: TCP}
          securityContext:
            runAsNonRoot: true
            runAsUser: 65532
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: [ALL]}
          livenessProbe:
            httpGet: {path: /health, port: 8080}
            initialDelaySeconds: 60
            timeoutSeconds: 5
            failureThreshold: 5
          readinessProbe:
            httpGet: {path: /ready, port: 8181}
          resources:
            requests: {cpu: 100m, memory: 70Mi}
            limits: {memory: 170Mi}
          volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes:
        - name: config
          configMap: {name: coredns, items: [{key: Corefile, path: Corefile}]}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
spec:
  clusterIP: 10.96.0.10
  selector: {k8s-app: kube-dns}
  ports:
    - {name: dns, port: 53, protocol: UDP}
    - {name: dns-tcp, port: 53, protocol: TCP}
    - {name: metrics, port: 9153, protocol: TCP}
`

// kubeProxyConfig is kube-proxy's configuration on one node. Conntrack
// settings are left alone (zeros): nf_conntrack_max and the hash size are
// the host's, not the node namespace's; the OOM score too.
func kubeProxyConfig(kubeconfig, node string) string {
	return kubeProxyConfigCIDRs(kubeconfig, node, "10.244.0.0/16")
}

// kubeProxyConfigCIDRs is kubeProxyConfig with the cluster's CIDRs (one per
// family: a dual-stack kube-proxy detects local traffic of each).
func kubeProxyConfigCIDRs(kubeconfig, node, clusterCIDRs string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %s}
hostnameOverride: %s
mode: iptables
clusterCIDR: %s
detectLocalMode: ClusterCIDR
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, kubeconfig, node, clusterCIDRs)
}

// installBaseline starts kube-proxy on every node (a process of the node,
// as the kubelet), then installs podnet with its Service proxy and DNS
// turned off and CoreDNS in their place.
func installBaseline(kubeProxy string) func(context.Context, *realCluster, string) {
	return installBaselineWith(kubeProxy, baselineKustomization)
}

// installBaselineWith is installBaseline with podnet installed through
// kustomization (baselineKustomization and more).
func installBaselineWith(kubeProxy, kustomization string) func(context.Context, *realCluster, string) {
	return func(ctx context.Context, c *realCluster, podnetTar string) {
		t := c.t
		for _, n := range c.nodes {
			kc := filepath.Join(n.Dir, "kube-proxy.kubeconfig")
			if err := c.srv.WriteKubeconfig(kc, kubeProxyUser, kubeAPIAddr.Addr()); err != nil {
				t.Fatal(err)
			}
			cfg := filepath.Join(n.Dir, "kube-proxy.yaml")
			if err := os.WriteFile(cfg, []byte(kubeProxyConfigCIDRs(kc, n.Name, c.clusterCIDRs())), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := n.StartDaemon("kube-proxy", kubeProxy, "--config="+cfg, "--v=1"); err != nil {
				t.Fatal(err)
			}
		}
		c.applyPodnet(ctx, podnetTar, "", kustomization)
		c.applyYAML(ctx, corednsYAML)
		c.waitNetworkUp("coredns")
		c.waitFor(time.Minute, "kube-proxy's /healthz on every node", func(ctx context.Context) (bool, string) {
			for _, n := range c.nodes {
				out, err := n.Exec(ctx, c.testapp, "get", "http://127.0.0.1:10256/healthz")
				if err != nil {
					return false, fmt.Sprintf("%s: %v %s", n.Name, err, out)
				}
			}
			return true, ""
		})
		if _, err := c.admin.AppsV1().Deployments("kube-system").Get(ctx, "podnet-dns", metav1.GetOptions{}); err == nil {
			t.Fatal("podnet-dns is installed beside CoreDNS")
		}
		// kube-proxy's chains hold kube-dns; proxyd's (PODSVC-) are absent.
		c.waitFor(time.Minute, "kube-proxy's rules for kube-dns and none of proxyd's on every node", func(ctx context.Context) (bool, string) {
			for _, n := range c.nodes {
				out, err := n.Exec(ctx, "iptables-save", "-t", "nat")
				if err != nil || !strings.Contains(out, "KUBE-SERVICES -d 10.96.0.10/32") || strings.Contains(out, iptables.ChainPrefix) {
					return false, fmt.Sprintf("%s: %v\n%s", n.Name, err, out)
				}
			}
			return true, ""
		})
	}
}
