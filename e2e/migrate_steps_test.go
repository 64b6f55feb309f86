//go:build conformance

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/e2e/realnode"
)

// migrate runs README's "Migrating from flannel, kube-proxy and CoreDNS"
// on the cluster, one table row per step: stage 2 and its undo (kube-proxy
// back) and stage 2 again, then the nodes in order (the client's node last),
// then the first node rolled back to flannel and forward again.
func (m *migration) migrate(ctx context.Context, c *realCluster) {
	m.step("before (flannel, kube-proxy, CoreDNS)", "", func() {
		m.run(ctx, "kubectl -n kube-system get ds kube-proxy -o yaml > kube-proxy.yaml", "")
		m.run(ctx, "kubectl create namespace podnet-system", "")
		m.runWith(ctx, "kubectl -n podnet-system create configmap podnet-apiserver --from-literal=KUBERNETES_SERVICE_HOST=<api server address> --from-literal=KUBERNETES_SERVICE_PORT=6443",
			"<api server address>", kubeAPIAddr.Addr().String())
	})
	m.step("1 beside", "", func() {
		m.runWith(ctx, "kubectl apply -k deploy/migrate/STAGE", "STAGE", "1-beside")
		c.waitDaemonSet("podnet-system", "podnet-node")
		m.run(ctx, "kubectl -n podnet-system exec ds/podnet-node -c proxyd -- proxyd status --metrics-bind-address 127.0.0.1:10349", "")
	})
	m.step("2 services: kube-proxy → proxyd", "", func() { m.servicesToProxyd(ctx) })
	m.step("rollback: services → kube-proxy", "", func() {
		m.run(ctx, "kubectl apply -f kube-proxy.yaml", "")
		c.waitDaemonSet("kube-system", "kube-proxy")
		m.runWith(ctx, "kubectl apply -k deploy/migrate/STAGE", "STAGE", "1-beside")
		c.waitDaemonSet("podnet-system", "podnet-node")
		c.waitFor(2*time.Minute, "kube-proxy's chains back on every node", func(ctx context.Context) (bool, string) {
			for _, n := range c.nodes {
				if left := nodeLeftovers(ctx, n); len(kubeChains(left)) == 0 {
					return false, n.Name + ": no KUBE-* chain"
				}
			}
			return true, ""
		})
	})
	m.step("2 services: kube-proxy → proxyd again", "", func() { m.servicesToProxyd(ctx) })
	m.step("3 DNS: CoreDNS → dnsd", "", func() {
		m.run(ctx, "kubectl -n kube-system get cm coredns -o jsonpath='{.data.Corefile}' > Corefile; dnsd import-corefile --drop loadbalance --patch dnsd-flags.json Corefile > config.yaml; kubectl -n kube-system create configmap podnet-dns --from-file=config.yaml", "")
		m.runWith(ctx, "kubectl apply -k deploy/migrate/STAGE", "STAGE", "3-dns")
		m.run(ctx, "kubectl -n kube-system patch deploy podnet-dns --type=json --patch-file=dnsd-flags.json", "")
		c.checkDNSFlags(ctx)
		m.run(ctx, "kubectl -n kube-system rollout status deploy/podnet-dns", "")
		m.run(ctx, "kubectl -n kube-system scale deploy coredns --replicas=0", "")
		c.waitFor(2*time.Minute, "CoreDNS's pods gone", func(ctx context.Context) (bool, string) {
			pods, err := c.admin.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
			if err != nil {
				return false, err.Error()
			}
			for _, p := range pods.Items {
				if strings.HasPrefix(p.Name, "coredns-") {
					return false, p.Name + " " + string(p.Status.Phase)
				}
			}
			return true, ""
		})
	})
	m.step("4 pod network: overlay applied", "", func() {
		m.run(ctx, "kubectl -n kube-flannel patch ds kube-flannel-ds -p '{\"spec\":{\"template\":{\"spec\":{\"affinity\":{\"nodeAffinity\":{\"requiredDuringSchedulingIgnoredDuringExecution\":{\"nodeSelectorTerms\":[{\"matchExpressions\":[{\"key\":\"podnet.io/pod-network\",\"operator\":\"NotIn\",\"values\":[\"podnet\"]}]}]}}}}}}}'", "")
		m.runWith(ctx, "kubectl apply -k deploy/migrate/STAGE", "STAGE", "4-pod-network")
		c.waitDaemonSet("podnet-system", "podnet-node-on-flannel")
		c.waitDaemonSet("kube-flannel", "kube-flannel-ds")
	})
	for _, n := range c.nodes {
		m.step("4 pod network: "+n.Name+" → podnet", n.Name, func() { m.switchNode(ctx, n, true) })
	}
	first := c.nodes[0]
	m.step("rollback: "+first.Name+" → flannel", first.Name, func() { m.switchNode(ctx, first, false) })
	m.step("4 pod network: "+first.Name+" → podnet again", first.Name, func() { m.switchNode(ctx, first, true) })
	m.step("podnet whole", "", func() {
		m.run(ctx, "kubectl apply -k deploy/", "")
		m.run(ctx, "kubectl -n podnet-system delete ds podnet-node-on-flannel", "")
		m.run(ctx, "kubectl -n kube-flannel delete ds kube-flannel-ds", "")
		c.waitDaemonSet("podnet-system", "podnet-node")
		c.waitWorkload()
	})
	m.step("after", "", func() { time.Sleep(10 * time.Second) })
}

// servicesToProxyd is README's stage 2: kube-proxy's DaemonSet deleted,
// proxyd programming the Services and removing kube-proxy's chains.
func (m *migration) servicesToProxyd(ctx context.Context) {
	c := m.c
	m.run(ctx, "kubectl -n kube-system delete ds kube-proxy", "")
	m.runWith(ctx, "kubectl apply -k deploy/migrate/STAGE", "STAGE", "2-services")
	c.waitDaemonSet("podnet-system", "podnet-node")
	c.waitFor(2*time.Minute, "kube-proxy's chains gone from every node", func(ctx context.Context) (bool, string) {
		for _, n := range c.nodes {
			if left := nodeLeftovers(ctx, n); len(kubeChains(left)) > 0 {
				return false, fmt.Sprintf("%s: %v", n.Name, left)
			}
		}
		return true, ""
	})
}

// kubeChains are the KUBE-* chains among nodeLeftovers' findings.
func kubeChains(left []string) []string {
	var out []string
	for _, l := range left {
		if strings.Contains(l, ":KUBE-") {
			out = append(out, l)
		}
	}
	return out
}

// switchNode moves one node to podnet's pod network (README's steps for
// each node) or back to flannel (README's "Undo one node"), then waits
// for the node's agent and the workload back on it.
func (m *migration) switchNode(ctx context.Context, n *realnode.Node, toPodnet bool) {
	c := m.c
	m.run(ctx, "kubectl cordon N", n.Name)
	m.run(ctx, "kubectl drain N --ignore-daemonsets --delete-emptydir-data", n.Name)
	if toPodnet {
		m.run(ctx, "kubectl label node N podnet.io/pod-network=podnet", n.Name)
		c.waitGone(n.Name, "kube-flannel", "app=flannel")
		m.onNode(ctx, n, "ip link delete flannel.1; ip link delete cni0")
	} else {
		m.run(ctx, "kubectl label node N podnet.io/pod-network-", n.Name)
		c.waitGone(n.Name, "podnet-system", "app.kubernetes.io/name=podnet-node")
		m.onNode(ctx, n, "ip link delete podnet.1; ip link delete cbr0")
		m.onNode(ctx, n, "mv /etc/cni/net.d/10-flannel.conflist.podnet-moved-aside /etc/cni/net.d/10-flannel.conflist")
	}
	m.run(ctx, "kubectl uncordon N", n.Name)
	if toPodnet {
		c.waitDaemonSet("podnet-system", "podnet-node")
	} else {
		c.waitDaemonSet("kube-flannel", "kube-flannel-ds")
		c.waitDaemonSet("podnet-system", "podnet-node-on-flannel")
	}
	c.waitWorkload()
}

// waitGone waits until no pod of the selector runs on the node.
func (c *realCluster) waitGone(node, ns, selector string) {
	c.waitFor(2*time.Minute, selector+" gone from "+node, func(ctx context.Context) (bool, string) {
		pods, err := c.admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector, FieldSelector: "spec.nodeName=" + node})
		if err != nil || len(pods.Items) > 0 {
			return false, fmt.Sprintf("%d pods, %v", len(pods.Items), err)
		}
		return true, ""
	})
}

// waitWorkload waits for four web pods ready over every node and the
// client running again.
func (c *realCluster) waitWorkload() {
	c.waitFor(3*time.Minute, "web spread over every node again and the client running", func(ctx context.Context) (bool, string) {
		pods, err := c.admin.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app in (web,client)"})
		if err != nil {
			return false, err.Error()
		}
		nodes, web, client := map[string]bool{}, 0, false
		for _, p := range pods.Items {
			if p.Labels["app"] == "client" {
				client = client || podReady(&p)
			} else if podReady(&p) {
				web++
				nodes[p.Spec.NodeName] = true
			}
		}
		if web != 4 || len(nodes) != len(c.nodes) || !client {
			return false, fmt.Sprintf("%d web pods ready on %v, client ready %v", web, nodes, client)
		}
		return true, ""
	})
}

// checkDNSFlags checks that podnet-dns runs with the flags the Corefile's
// conversion listed (kubeadm's Corefile: its ttl among them).
func (c *realCluster) checkDNSFlags(ctx context.Context) {
	d, err := c.admin.AppsV1().Deployments("kube-system").Get(ctx, "podnet-dns", metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	if cmd := d.Spec.Template.Spec.Containers[0].Command; !slices.Contains(cmd, "--ttl=30") || !slices.Contains(cmd, "--pods=insecure") {
		c.errorf("podnet-dns's command lacks the Corefile's flags: %q", cmd)
	}
}
